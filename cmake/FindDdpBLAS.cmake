# Finds a CBLAS (OpenBLAS preferred) and defines the imported target DdpBLAS::blas.
# Hints: OpenBLAS_DIR (its CMake config), BLAS_ROOT / DDP_BLAS_ROOT (a prefix with include/cblas.h and lib/libopenblas).
include_guard(GLOBAL)
include(FindPackageHandleStandardArgs)

if(NOT DdpBLAS_INCLUDE_DIR OR NOT DdpBLAS_LIBRARY)
  find_package(OpenBLAS CONFIG QUIET)
  if(OpenBLAS_FOUND AND OpenBLAS_INCLUDE_DIRS AND OpenBLAS_LIBRARIES)
    set(DdpBLAS_INCLUDE_DIR "${OpenBLAS_INCLUDE_DIRS}" CACHE PATH "Directory holding cblas.h")
    set(DdpBLAS_LIBRARY "${OpenBLAS_LIBRARIES}" CACHE FILEPATH "The CBLAS library")
    set(DdpBLAS_VERSION "${OpenBLAS_VERSION}")
  else()
    find_path(DdpBLAS_INCLUDE_DIR cblas.h HINTS ${DDP_BLAS_ROOT} ${BLAS_ROOT} ENV BLAS_ROOT
              PATH_SUFFIXES include include/openblas openblas openblas-pthread)
    find_library(DdpBLAS_LIBRARY NAMES openblas blas HINTS ${DDP_BLAS_ROOT} ${BLAS_ROOT} ENV BLAS_ROOT
                 PATH_SUFFIXES lib lib64)
  endif()
endif()

find_package_handle_standard_args(DdpBLAS REQUIRED_VARS DdpBLAS_LIBRARY DdpBLAS_INCLUDE_DIR
                                  VERSION_VAR DdpBLAS_VERSION)
if(DdpBLAS_FOUND AND NOT TARGET DdpBLAS::blas)
  add_library(DdpBLAS::blas INTERFACE IMPORTED)
  set_target_properties(DdpBLAS::blas PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${DdpBLAS_INCLUDE_DIR}"
                                                 INTERFACE_LINK_LIBRARIES "${DdpBLAS_LIBRARY}")
endif()
mark_as_advanced(DdpBLAS_INCLUDE_DIR DdpBLAS_LIBRARY)

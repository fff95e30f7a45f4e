# Finds NCCL and defines the imported target NCCL::NCCL.
# Looks in NCCL_ROOT (CMake or environment variable), NCCL_HOME, CUDAToolkit_ROOT / CUDA_HOME / CUDA_PATH, /usr/local/cuda.
# Sets NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_VERSION.
include_guard(GLOBAL)
include(FindPackageHandleStandardArgs)

# An explicit NCCL_ROOT is where the user says NCCL is: search only there, so a wrong path is an error
# rather than a silent pick of some other NCCL.
if(NCCL_ROOT OR DEFINED ENV{NCCL_ROOT})
  set(_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT})
  set(_nccl_only NO_DEFAULT_PATH)
else()
  set(_nccl_hints $ENV{NCCL_HOME} ${CUDAToolkit_ROOT} $ENV{CUDA_HOME} $ENV{CUDA_PATH} ${CUDAToolkit_LIBRARY_ROOT}
      /usr/local/cuda)
  set(_nccl_only "")
endif()
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} PATH_SUFFIXES include ${_nccl_only})
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_nccl_hints} PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu ${_nccl_only})

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_v REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
  foreach(part MAJOR MINOR PATCH)
    string(REGEX MATCH "NCCL_${part} ([0-9]+)" _ "${_nccl_v}")
    set(_nccl_${part} "${CMAKE_MATCH_1}")
  endforeach()
  if(NOT _nccl_MAJOR STREQUAL "")
    set(NCCL_VERSION "${_nccl_MAJOR}.${_nccl_MINOR}.${_nccl_PATCH}")
  endif()
endif()

find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR VERSION_VAR NCCL_VERSION)
if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
                                              INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)

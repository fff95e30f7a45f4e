# ddp_find_prefix_library(<Name> HEADER <h> VERSION_HEADER <vh> VERSION_MACROS <M1> <M2> <M3> LIBRARY_NAMES <n>...
#                         HINTS <dir>...)
# The search FindNCCL.cmake and FindCUDNN.cmake share: <Name>_ROOT (CMake or environment variable), when set, is
# the only place searched, so a wrong path is an error rather than a silent pick of another copy; otherwise HINTS,
# then CMake's default paths. Sets <Name>_INCLUDE_DIR, <Name>_LIBRARY, <Name>_VERSION ("M1.M2.M3" read from the
# `#define <macro> <n>` lines of VERSION_HEADER), <Name>_FOUND, and the imported target <Name>::<target>
# (TARGET, default <Name>).
include_guard(GLOBAL)
include(FindPackageHandleStandardArgs)

macro(ddp_find_prefix_library name)
  cmake_parse_arguments(_dfp "" "HEADER;VERSION_HEADER;TARGET" "VERSION_MACROS;LIBRARY_NAMES;HINTS" ${ARGN})
  if(${name}_ROOT OR DEFINED ENV{${name}_ROOT})
    set(_dfp_hints ${${name}_ROOT} $ENV{${name}_ROOT})
    set(_dfp_only NO_DEFAULT_PATH)
  else()
    set(_dfp_hints ${_dfp_HINTS})
    set(_dfp_only "")
  endif()
  find_path(${name}_INCLUDE_DIR ${_dfp_HEADER} HINTS ${_dfp_hints} PATH_SUFFIXES include ${_dfp_only})
  find_library(${name}_LIBRARY NAMES ${_dfp_LIBRARY_NAMES} HINTS ${_dfp_hints}
               PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu ${_dfp_only})
  if(${name}_INCLUDE_DIR AND EXISTS "${${name}_INCLUDE_DIR}/${_dfp_VERSION_HEADER}")
    list(JOIN _dfp_VERSION_MACROS "|" _dfp_alt)
    file(STRINGS "${${name}_INCLUDE_DIR}/${_dfp_VERSION_HEADER}" _dfp_lines REGEX "^#define (${_dfp_alt}) ")
    set(_dfp_parts "")
    foreach(_dfp_macro IN LISTS _dfp_VERSION_MACROS)
      string(REGEX MATCH "${_dfp_macro} ([0-9]+)" _ "${_dfp_lines}")
      list(APPEND _dfp_parts "${CMAKE_MATCH_1}")
    endforeach()
    list(GET _dfp_parts 0 _dfp_major)
    if(NOT _dfp_major STREQUAL "")
      list(JOIN _dfp_parts "." ${name}_VERSION)
    endif()
  endif()
  find_package_handle_standard_args(${name} REQUIRED_VARS ${name}_LIBRARY ${name}_INCLUDE_DIR
                                    VERSION_VAR ${name}_VERSION)
  if(NOT _dfp_TARGET)
    set(_dfp_TARGET ${name})
  endif()
  if(${name}_FOUND AND NOT TARGET ${name}::${_dfp_TARGET})
    add_library(${name}::${_dfp_TARGET} UNKNOWN IMPORTED)
    set_target_properties(${name}::${_dfp_TARGET} PROPERTIES IMPORTED_LOCATION "${${name}_LIBRARY}"
                                                             INTERFACE_INCLUDE_DIRECTORIES "${${name}_INCLUDE_DIR}")
  endif()
  mark_as_advanced(${name}_INCLUDE_DIR ${name}_LIBRARY)
endmacro()

# DDP_SANITIZE: build the tests with compiler sanitizers, so CI catches memory errors, undefined behaviour
# and data races that pass unnoticed in the Release build.
# SPDX-License-Identifier: MIT
#
#   DDP_SANITIZE=""                   off (the default)
#   DDP_SANITIZE="address,undefined"  ASan + UBSan; any UB report aborts the test (-fno-sanitize-recover)
#   DDP_SANITIZE="thread"             TSan (cannot be combined with address)
#
# Included from tests/CMakeLists.txt, so it instruments the tests directory only (ddp is header-only: every
# line of the library a test uses is compiled, and instrumented, inside that test). scripts/sanitize.sh
# configures such builds with -g1 (ASan -O0, TSan -O1) and without CUDA/NCCL/MPI and runs a chosen subset of the tests.
include_guard(GLOBAL)

set(DDP_SANITIZE "" CACHE STRING "Sanitizers for the tests: '', 'address,undefined' or 'thread'")
set_property(CACHE DDP_SANITIZE PROPERTY STRINGS "" "address,undefined" "address" "undefined" "thread")


# DDP_SANITIZE_UNIT="address,undefined": only the targets passed to ddp_sanitize_unit() are instrumented (the
# unit tests and the multi-process comm tests, tests/CMakeLists.txt), at -O0 -g1 with assertions on, in an
# otherwise ordinary build. scripts/test.sh uses it, so CI compiles those tests once, instrumented, instead of
# once plain and again in a separate ASan build (docs/decisions/0041). TSan stays a build of its own
# (scripts/sanitize.sh): it needs every thread instrumented, OpenBLAS's and MPI's included.
set(DDP_SANITIZE_UNIT "" CACHE STRING "Sanitizers for the unit tests only, in a normal build: '', 'address,undefined'")

# The compile flags for the sanitizer list `sans` ("address,undefined", "thread", ...) into `out`.
function(_ddp_sanitizer_flags sans out)
  string(REPLACE "," ";" list "${sans}")
  foreach(s IN LISTS list)
    if(NOT s MATCHES "^(address|undefined|thread)$")
      message(FATAL_ERROR "ddp: sanitizer list '${sans}': '${s}' is not one of address, undefined, thread")
    endif()
  endforeach()
  if("thread" IN_LIST list AND "address" IN_LIST list)
    message(FATAL_ERROR "ddp: sanitizer list '${sans}': thread and address cannot be combined; configure two builds")
  endif()
  set(flags -fsanitize=${sans} -fno-omit-frame-pointer)
  if("undefined" IN_LIST list)
    list(APPEND flags -fno-sanitize-recover=undefined)
  endif()
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # g++ 12's -Wmaybe-uninitialized gives false positives inside libstdc++ (std::regex via cxxopts, seen in
    # unit_train) once the sanitizers' instrumentation changes inlining; the Release build keeps the warning.
    list(APPEND flags -Wno-maybe-uninitialized)
  endif()
  if("thread" IN_LIST list AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # g++ warns (-Wtsan) that TSan does not model std::atomic_thread_fence. The two fences are in the
    # shared-memory seqlock of comm/shm/collectives.hpp, whose fields are all atomics (TSan sees those);
    # without this the tests' -Werror turns the warning into a build failure.
    list(APPEND flags -Wno-tsan)
  endif()
  set(${out} ${flags} PARENT_SCOPE)
endfunction()

if(DDP_SANITIZE AND DDP_SANITIZE_UNIT)
  message(FATAL_ERROR "ddp: DDP_SANITIZE (every test) and DDP_SANITIZE_UNIT (the unit tests) exclude each other")
endif()
if(DDP_SANITIZE)
  _ddp_sanitizer_flags("${DDP_SANITIZE}" _ddp_san_flags)
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${_ddp_san_flags}>")
  add_link_options("$<$<LINK_LANGUAGE:CXX>:-fsanitize=${DDP_SANITIZE}>")
  message(STATUS "ddp: tests built with -fsanitize=${DDP_SANITIZE}")
endif()
if(DDP_SANITIZE_UNIT)
  if(DDP_SANITIZE_UNIT MATCHES "thread")
    message(FATAL_ERROR "ddp: DDP_SANITIZE_UNIT=${DDP_SANITIZE_UNIT}: TSan needs a build of its own (scripts/sanitize.sh)")
  endif()
  _ddp_sanitizer_flags("${DDP_SANITIZE_UNIT}" _ddp_san_unit_flags)
  message(STATUS "ddp: unit tests built with -fsanitize=${DDP_SANITIZE_UNIT}")
endif()

# ddp_sanitize_unit(<target>): instruments <target> when DDP_SANITIZE_UNIT is set: the sanitizers at -O0 -g1 with
# assert() on (-UNDEBUG), as in scripts/sanitize.sh's ASan build. A later target_compile_options(-O1) wins.
function(ddp_sanitize_unit target)
  if(DDP_SANITIZE_UNIT)
    target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:${_ddp_san_unit_flags};-O0;-g1;-UNDEBUG>")
    target_link_options(${target} PRIVATE "$<$<LINK_LANGUAGE:CXX>:-fsanitize=${DDP_SANITIZE_UNIT}>")
  endif()
endfunction()

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

if(DDP_SANITIZE)
  string(REPLACE "," ";" _ddp_san_list "${DDP_SANITIZE}")
  foreach(_s IN LISTS _ddp_san_list)
    if(NOT _s MATCHES "^(address|undefined|thread)$")
      message(FATAL_ERROR "ddp: DDP_SANITIZE=${DDP_SANITIZE}: '${_s}' is not one of address, undefined, thread")
    endif()
  endforeach()
  if("thread" IN_LIST _ddp_san_list AND "address" IN_LIST _ddp_san_list)
    message(FATAL_ERROR "ddp: DDP_SANITIZE=${DDP_SANITIZE}: thread and address cannot be combined; configure two builds")
  endif()
  set(_ddp_san_flags -fsanitize=${DDP_SANITIZE} -fno-omit-frame-pointer)
  if("undefined" IN_LIST _ddp_san_list)
    list(APPEND _ddp_san_flags -fno-sanitize-recover=undefined)
  endif()
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # g++ 12's -Wmaybe-uninitialized gives false positives inside libstdc++ (std::regex via cxxopts, seen in
    # unit_train) once the sanitizers' instrumentation changes inlining; the Release build keeps the warning.
    list(APPEND _ddp_san_flags -Wno-maybe-uninitialized)
  endif()
  if("thread" IN_LIST _ddp_san_list AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # g++ warns (-Wtsan) that TSan does not model std::atomic_thread_fence. The two fences are in the
    # shared-memory seqlock of comm/tcp/shm_collectives.hpp, whose fields are all atomics (TSan sees those);
    # without this the tests' -Werror turns the warning into a build failure.
    list(APPEND _ddp_san_flags -Wno-tsan)
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${_ddp_san_flags}>")
  add_link_options("$<$<LINK_LANGUAGE:CXX>:-fsanitize=${DDP_SANITIZE}>")
  message(STATUS "ddp: tests built with -fsanitize=${DDP_SANITIZE}")
endif()

# cmake -P script run by the package.default_install test (docs/decisions/0066): what a new user does.
#   1. a DEFAULT configure of the source tree (no switches), then `cmake --install` without building anything:
#      the headers and the package install, ddprun is left out with a message saying how to add it;
#   2. a consumer finds that install with find_package(ddp) on a machine made to look as if it had no CUDA, NCCL,
#      cuDNN or MPI (CMAKE_DISABLE_FIND_PACKAGE_*), builds and runs; asking for COMPONENTS cuda there fails with
#      ddp's message;
#   3. the light path of the README's Install section: tests, examples and benchmarks off, `cmake --build`
#      (ddprun only), `cmake --install`, and the installed ddprun runs; the guide's first program
#      (examples/custom_model) builds against that install on its own and runs as one process (no data: it stops
#      with its data error, after the start-up call).
# The full default build is not repeated here: package.find_package installs from the test build itself.
file(REMOVE_RECURSE ${WORK_DIR})
function(run out_var)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "package test: command failed (${rc}): ${ARGN}")
  endif()
  set(${out_var} "${out}${err}" PARENT_SCOPE)
endfunction()
function(expect text what)
  string(REGEX REPLACE "[ \n]+" " " text "${text}")   # CMake wraps error messages
  string(FIND "${text}" "${what}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "package test: expected '${what}' in the output above")
  endif()
endfunction()
set(no_gpu_machine -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON -DCMAKE_DISABLE_FIND_PACKAGE_NCCL=ON
                   -DCMAKE_DISABLE_FIND_PACKAGE_CUDNN=ON -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON)

# 1. default configure, install without a build
run(out ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/default -G ${GENERATOR})
run(out ${CMAKE_COMMAND} --install ${WORK_DIR}/default --prefix ${WORK_DIR}/prefix)
expect("${out}" "ddp: ddprun was not built, so it is not installed; build it with")
foreach(f include/ddp/ddp.hpp share/cmake/ddp/ddpConfig.cmake share/cmake/ddp/ddpTargets.cmake)
  if(NOT EXISTS ${WORK_DIR}/prefix/${f})
    message(FATAL_ERROR "package test: ${f} was not installed")
  endif()
endforeach()

# 2. a consumer on a machine without the optional dependencies
run(out ${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK_DIR}/consumer -G ${GENERATOR}
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix ${no_gpu_machine})
run(out ${CMAKE_COMMAND} --build ${WORK_DIR}/consumer)
run(out ${WORK_DIR}/consumer/consumer)
execute_process(COMMAND ${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK_DIR}/consumer_cuda -G ${GENERATOR}
                        -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DDDP_CONSUMER_COMPONENTS=cuda ${no_gpu_machine}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(rc EQUAL 0)
  message(FATAL_ERROR "package test: COMPONENTS cuda without the CUDA toolkit configured")
endif()
if(EXISTS ${WORK_DIR}/prefix/share/cmake/ddp/ddp-cuda-targets.cmake)
  expect("${out}${err}" "ddp: component cuda (ddp::cuda) is not available: the CUDA toolkit was not found")
else()
  expect("${out}${err}" "ddp: component cuda (ddp::cuda) is not available: this ddp was installed without it")
endif()

# 3. the light path
run(out ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/light -G ${GENERATOR} -DDDP_BUILD_TESTS=OFF
    -DDDP_BUILD_EXAMPLES=OFF -DDDP_BUILD_BENCH=OFF -DDDP_WITH_CUDA=OFF)
run(out ${CMAKE_COMMAND} --build ${WORK_DIR}/light)
run(out ${CMAKE_COMMAND} --install ${WORK_DIR}/light --prefix ${WORK_DIR}/prefix_light)
run(out ${WORK_DIR}/prefix_light/bin/ddprun --help)
expect("${out}" "--nproc-per-node")
run(out ${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/custom_model -B ${WORK_DIR}/custom_model -G ${GENERATOR}
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix_light)
run(out ${CMAKE_COMMAND} --build ${WORK_DIR}/custom_model)
execute_process(COMMAND ${WORK_DIR}/custom_model/custom_model --data-dir ${WORK_DIR}/no_such_dir
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 1)
  message(FATAL_ERROR "package test: custom_model without data exited ${rc}, expected 1")
endif()
expect("${out}${err}" "cannot read CIFAR-format file")
file(REMOVE_RECURSE ${WORK_DIR})
message("package test: default install ok")

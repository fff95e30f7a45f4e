# cmake -P script of the headers.umbrella test (docs/decisions/0066): <ddp/ddp.hpp> must reach every public header
# that a plain C++ build can compile. Left out by design, behind DDP_WITH_* / nvcc in ddp.hpp and comm/factory.hpp:
# .cuh files and headers under cuda/, mpi/ and nccl/, and core/cuda_check.hpp.
# Inputs: CXX (the compiler), INCLUDE_DIR (ddp's include/), EXTRA_INCLUDES (the dependencies' include dirs).
file(GLOB_RECURSE headers RELATIVE ${INCLUDE_DIR} ${INCLUDE_DIR}/ddp/*.hpp ${INCLUDE_DIR}/ddp/*.cuh)
list(FILTER headers EXCLUDE REGEX "\\.cuh$|/cuda/|/mpi/|/nccl/|^ddp/core/cuda_check\\.hpp$")
set(incs -I${INCLUDE_DIR})
foreach(dir IN LISTS EXTRA_INCLUDES)
  list(APPEND incs -I${dir})
endforeach()
file(WRITE ${WORK_DIR}/umbrella.cpp "#include <ddp/ddp.hpp>\n")
execute_process(COMMAND ${CXX} -std=c++20 -M ${incs} ${WORK_DIR}/umbrella.cpp
                RESULT_VARIABLE rc OUTPUT_VARIABLE deps ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "umbrella test: ${CXX} -M failed (${rc}): ${err}")
endif()
string(REPLACE "\\\n" " " deps "${deps}")
set(missing "")
foreach(h IN LISTS headers)
  string(FIND "${deps}" "${INCLUDE_DIR}/${h}" at)
  if(at EQUAL -1)
    list(APPEND missing ${h})
  endif()
endforeach()
list(LENGTH headers n)
if(missing)
  list(JOIN missing ", " missing)
  message(FATAL_ERROR "umbrella test: <ddp/ddp.hpp> does not include ${missing}; add each to include/ddp/ddp.hpp "
                      "with a '// defines:' line")
endif()
message("umbrella test: <ddp/ddp.hpp> reaches all ${n} public headers of a plain C++ build")

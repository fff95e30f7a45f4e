# cmake -P script of headers.view_hint: SOURCE must fail to compile with EXPECT in the compiler's output.
# Inputs: CXX, INCLUDE_DIR, EXTRA_INCLUDES (the dependencies' include dirs), SOURCE, EXPECT.
set(incs -I${INCLUDE_DIR})
foreach(dir IN LISTS EXTRA_INCLUDES)
  list(APPEND incs -I${dir})
endforeach()
execute_process(COMMAND ${CXX} -std=c++20 -fsyntax-only ${incs} ${SOURCE} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
string(LENGTH "${out}${err}" n)
if(rc EQUAL 0)
  message(FATAL_ERROR "expect_compile_error: ${SOURCE} compiled, but must not")
endif()
string(FIND "${out}${err}" "${EXPECT}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "expect_compile_error: '${EXPECT}' is not in the ${n} bytes of errors:\n${out}${err}")
endif()
message("expect_compile_error: the error names it (${n} bytes of compiler output)")

# Runs one compile-fail check: builds target TARGET in build tree BIN, which must fail, with
# the regular expression on SRC's first line ("// EXPECT: <regex>") in the compiler's output.
file(STRINGS "${SRC}" first LIMIT_COUNT 1)
string(REGEX REPLACE "^// EXPECT: " "" expect "${first}")
execute_process(COMMAND "${CMAKE_COMMAND}" --build "${BIN}" --target "${TARGET}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(all "${out}${err}")
if(rc EQUAL 0)
  message(FATAL_ERROR "${TARGET}: compiled, but it must not")
endif()
if(NOT all MATCHES "${expect}")
  message(FATAL_ERROR "${TARGET}: failed to compile, but without the message '${expect}':\n${all}")
endif()
# One short message: the static_assert's, not pages of instantiation context.
string(REGEX MATCHALL "error:" errors "${all}")
list(LENGTH errors n)
if(n GREATER 3)
  message(FATAL_ERROR "${TARGET}: ${n} errors; misuse should stop at one message:\n${all}")
endif()
message(STATUS "${TARGET}: fails to compile with '${expect}' (${n} error lines)")

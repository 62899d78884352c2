# Warning flags for the project's own targets (tests, examples, benchmarks), never for users.
# C++ sources only: nvcc's generated host code (a .cu file in a target) is not -Wpedantic clean.
function(stagecraft_warnings target)
  target_compile_options(${target} PRIVATE
    "$<$<COMPILE_LANGUAGE:CXX>:-Wall;-Wextra;-Wpedantic;-Wshadow=local>"
    "$<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${STAGECRAFT_WERROR}>>:-Werror>")
endfunction()

# Warning flags for the project's own targets (tests, examples, benchmarks), never for users.
function(stagecraft_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow=local
    $<$<BOOL:${STAGECRAFT_WERROR}>:-Werror>)
endfunction()

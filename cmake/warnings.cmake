# Warning flags for the project's own targets (tests, examples, benchmarks), never for users.
# GCC 12's (maybe-)uninitialized warnings fire inside its own AVX-512 intrinsics
# (avx512fintrin.h's `__Y = __Y` idiom, reached through xsimd) when building for -march=native
# on AVX-512 machines: a known false positive of GCC < 13, so they are off there.
function(stagecraft_warnings target)
  set(gcc12 "$<AND:$<CXX_COMPILER_ID:GNU>,$<VERSION_LESS:$<CXX_COMPILER_VERSION>,13>>")
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow=local
    $<$<BOOL:${STAGECRAFT_WERROR}>:-Werror>
    $<${gcc12}:-Wno-maybe-uninitialized -Wno-uninitialized>)
endfunction()

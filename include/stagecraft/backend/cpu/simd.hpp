// xsimd (the SIMD batches of the CPU kernels) and the x86 intrinsics: the library's headers include
// these through here, never directly, so that the workaround below sees GCC's intrinsics first.
//
// GCC 12 warns (-Wmaybe-uninitialized, -Wuninitialized) inside its own AVX-512 intrinsics, whose
// _mm512_undefined_*() is `__m512 __Y = __Y;` (GCC PR 105593, fixed in GCC 13). With AVX-512 on
// (-march=x86-64-v4, or native on such a machine) every inlined xsimd conversion, exp, log, shift
// or reduction then warns at -O2 and -O3. It is a false positive in a system header that no code
// of ours can initialise, so those two warnings are off for the text of GCC's intrinsic headers
// only: code that inlines them, ours and the user's, is still checked. (A file that includes
// <immintrin.h> itself before stagecraft gets GCC 12's warnings back.)
#pragma once
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12 && (defined(__x86_64__) || defined(__i386__))
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

#include <xsimd/xsimd.hpp>

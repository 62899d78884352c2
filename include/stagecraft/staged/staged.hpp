// Compile-time staging: sc::staged<E>, sc::stage, sc::eval, sc::compile, sc::grad<I>.
// The graph is a C++ type (staged/expr.hpp), evaluated as one fused loop (staged/eval.hpp).
#pragma once
#include "api.hpp"
#include "compile.hpp"
#include "expr.hpp"
#include "grad.hpp"
#include "materialized.hpp"

// nvcc compiling a user's file: graphs of GPU tensors run as templated kernels.
#if defined(__CUDACC__) && defined(STAGECRAFT_WITH_CUDA) && !defined(STAGECRAFT_KERNELS)
#include "cuda_kernel.hpp"
#endif

// Each elementwise op's math, written once: a functor `f` generic over the value type V, which is a
// scalar (float, double, an integer), an xsimd batch, and (next) a staged expression or a CUDA
// value. The eager loops, the fused evaluator and the staged evaluator all call these; an op's
// struct in unary.hpp / binary.hpp derives from its rule and adds only its name, kind and gradient.
//
// Dependency-free on purpose (only <cmath>): the functions a rule calls are found by argument-
// dependent lookup, so a batch finds xsimd's exp/select/isnan in xsimd's namespace, and scalars
// find the forms in rules::math below. Including this header pulls in no SIMD library, no tensor
// and no dispatch. Every function is SC_HOST_DEVICE, so the CUDA kernels (kernels/*.cu) call the
// very same rules; host compilers see no change.
#pragma once
#include <cmath>
#include <type_traits>

#include "../detail/host_device.hpp"

namespace stagecraft::rules {
#include "rules.inc"
}  // namespace stagecraft::rules

// nvcc compiling a user's file: the rules above are host functions (the CPU loops instantiate them
// with SIMD batches, which nvcc cannot compile for the GPU), so the same text is compiled again
// as device_rules, for scalars only, which the templated kernels of sc::compile call
// (staged/cuda_kernel.hpp).
#if defined(__CUDACC__) && !defined(STAGECRAFT_KERNELS) && !defined(__CUDACC_RTC__)
#pragma push_macro("SC_HOST_DEVICE")
#undef SC_HOST_DEVICE
#define SC_HOST_DEVICE __host__ __device__
namespace stagecraft::device_rules {
#include "rules.inc"
}  // namespace stagecraft::device_rules
#pragma pop_macro("SC_HOST_DEVICE")
#endif

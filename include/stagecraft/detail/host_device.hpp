// SC_HOST_DEVICE: marks a function that nvcc compiles for both the host and the GPU: in the
// library's own kernels (kernels/*.cu, built with STAGECRAFT_KERNELS) and in kernels compiled at
// run time (NVRTC). Empty elsewhere, including a user's .cu file that includes stagecraft.hpp: there
// the rules are also instantiated with SIMD batches, which nvcc cannot compile for the GPU.
#pragma once

#if defined(__CUDACC__) && (defined(STAGECRAFT_KERNELS) || defined(__CUDACC_RTC__))
#define SC_HOST_DEVICE __host__ __device__
#else
#define SC_HOST_DEVICE
#endif

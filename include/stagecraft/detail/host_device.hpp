// SC_HOST_DEVICE: marks a function that nvcc compiles for both the host and the GPU (empty elsewhere).
#pragma once

#if defined(__CUDACC__)
#define SC_HOST_DEVICE __host__ __device__
#else
#define SC_HOST_DEVICE
#endif

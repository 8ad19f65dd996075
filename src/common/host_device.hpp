// LOOM_HOST_DEVICE: __host__ __device__ under nvcc, nothing in plain C++ (for small helpers that a
// kernel and its CPU reference or test share).
#pragma once

#if defined(__CUDACC__)
#define LOOM_HOST_DEVICE __host__ __device__
#else
#define LOOM_HOST_DEVICE
#endif

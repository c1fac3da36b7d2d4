// LOOM_HOST_DEVICE marks a function that CPU and CUDA code share (the math of
// an op written once, ops/*_math.h): __host__ __device__ under nvcc, nothing
// for the host compiler.
#pragma once

#if defined(__CUDACC__)
#define LOOM_HOST_DEVICE __host__ __device__
#else
#define LOOM_HOST_DEVICE
#endif

// The random draw of dropout and stochastic depth, written once for both
// backends: element i of a mask is kept when a uniform number derived from
// (seed, i) alone is at least p, so the CPU and CUDA masks of one seed are the
// same and no generator state lives on the device.
#pragma once

#include <cstdint>

#include <loom/core/host_device.h>
#include <loom/core/splitmix.h>

namespace loom::ops {

// A counter-based stream over seed and index: splitmix64 (core/splitmix.h),
// as loom::Generator draws its numbers.
LOOM_HOST_DEVICE inline uint64_t dropout_bits(uint64_t seed, uint64_t index) {
  return splitmix64(seed + index * 0x9e3779b97f4a7c15ull);
}

// Whether element `index` survives a dropout of probability p: a uniform in
// [0, 1) with 53 random bits is at least p (probability 1 - p).
LOOM_HOST_DEVICE inline bool dropout_keep(uint64_t seed, uint64_t index, double p) {
  return uniform_from_bits(dropout_bits(seed, index)) >= p;
}

// The value a kept element is multiplied by (inverted dropout): 1 / (1 - p),
// and 0 when p = 1 (nothing survives).
LOOM_HOST_DEVICE inline double dropout_scale(double p) { return p < 1.0 ? 1.0 / (1.0 - p) : 0.0; }

}  // namespace loom::ops

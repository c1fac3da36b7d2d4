// splitmix64 (Steele, Lea and Flood), the mixing function behind loom's
// counter-based random numbers, written once for the host and CUDA kernels:
// loom::Generator (core/generator.h) and the dropout masks
// (ops/dropout_math.h) both draw from it.
#pragma once

#include <cstdint>

#include <loom/core/host_device.h>

namespace loom {

// splitmix64's step and finaliser: x advanced by the golden-ratio increment, then mixed.
LOOM_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A uniform double in [0, 1) from the top 53 of 64 random bits.
LOOM_HOST_DEVICE inline double uniform_from_bits(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

}  // namespace loom

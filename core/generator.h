// Seeded random numbers. Counter-based (splitmix64 over seed and a counter),
// so a stream can be derived for any (seed, epoch, sample) without shared state.
#pragma once

#include <cstdint>

#include <loom/core/tensor.h>

namespace loom {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}

  uint64_t next_u64();
  // Uniform in [0, 1) with 53 random bits.
  double uniform();
  double uniform(double low, double high) { return low + (high - low) * uniform(); }
  // Standard normal (Box-Muller).
  double normal();
  // Uniform integer in [0, bound).
  uint64_t below(uint64_t bound);

  // Fills a CPU tensor in place.
  void uniform_(Tensor& t, double low, double high);
  void normal_(Tensor& t, double mean, double stddev);

  uint64_t seed() const { return seed_; }
  uint64_t counter() const { return counter_; }
  // Restores a saved position (seed, counter), e.g. from a checkpoint.
  void set_state(uint64_t seed, uint64_t counter) {
    seed_ = seed;
    counter_ = counter;
  }

  // Mixes values into one well-spread 64-bit key: derive(seed, epoch, index).
  static uint64_t mix(uint64_t a, uint64_t b);

 private:
  uint64_t seed_;
  uint64_t counter_ = 0;
};

// The process-wide generator that parameter initialisation draws from, like
// torch's default CPU generator; manual_seed() resets it.
Generator& default_generator();
void manual_seed(uint64_t seed);

}  // namespace loom

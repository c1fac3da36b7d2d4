// Sequential, random and distributed samplers.
#include <loom/data/sampler.h>

#include <algorithm>
#include <numeric>
#include <utility>

#include <loom/core/error.h>
#include <loom/core/generator.h>

namespace loom::data {

SequentialSampler::SequentialSampler(int64_t dataset_size) : dataset_size_(dataset_size) {
  LOOM_CHECK(dataset_size >= 0, "SequentialSampler: dataset size ", dataset_size, " must be non-negative");
}

std::vector<int64_t> SequentialSampler::indices() const {
  std::vector<int64_t> order(static_cast<size_t>(dataset_size_));
  std::iota(order.begin(), order.end(), int64_t{0});
  return order;
}

std::vector<int64_t> random_permutation(int64_t size, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(size));
  std::iota(order.begin(), order.end(), int64_t{0});
  Generator random(Generator::mix(seed, static_cast<uint64_t>(epoch)));
  for (int64_t i = size - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(random.below(static_cast<uint64_t>(i + 1)));
    std::swap(order[i], order[j]);
  }
  return order;
}

RandomSampler::RandomSampler(int64_t dataset_size, uint64_t seed) : dataset_size_(dataset_size), seed_(seed) {
  LOOM_CHECK(dataset_size >= 0, "RandomSampler: dataset size ", dataset_size, " must be non-negative");
}

std::vector<int64_t> RandomSampler::indices() const { return random_permutation(dataset_size_, seed_, epoch_); }

DistributedSampler::DistributedSampler(int64_t dataset_size, int64_t world_size, int64_t rank, bool shuffle,
                                       uint64_t seed, bool drop_last)
    : DistributedSampler(dataset_size, world_size, rank, shuffle, seed, drop_last ? Remainder::drop : Remainder::pad) {}

DistributedSampler::DistributedSampler(int64_t dataset_size, int64_t world_size, int64_t rank, bool shuffle,
                                       uint64_t seed, Remainder remainder)
    : dataset_size_(dataset_size),
      world_size_(world_size),
      rank_(rank),
      shuffle_(shuffle),
      remainder_(remainder),
      seed_(seed) {
  LOOM_CHECK(dataset_size >= 0, "DistributedSampler: dataset size ", dataset_size, " must be non-negative");
  LOOM_CHECK(world_size >= 1, "DistributedSampler: world size ", world_size, " must be at least 1");
  LOOM_CHECK(rank >= 0 && rank < world_size, "DistributedSampler: rank ", rank, " is out of range for world size ",
             world_size, "; expected 0 <= rank < ", world_size);
  set_start(0);
}

void DistributedSampler::set_epoch(int64_t epoch) {
  if (epoch != epoch_) set_start(0);
  epoch_ = epoch;
}

void DistributedSampler::set_start(int64_t consumed) {
  LOOM_CHECK(consumed >= 0, "DistributedSampler: samples consumed ", consumed, " must be non-negative");
  start_ = consumed;
  const int64_t left = std::max<int64_t>(dataset_size_ - consumed, 0);
  switch (remainder_) {
    case Remainder::pad: samples_per_rank_ = (left + world_size_ - 1) / world_size_; break;
    case Remainder::drop: samples_per_rank_ = left / world_size_; break;
    case Remainder::uneven:  // positions start + rank, start + rank + world, ... below n
      samples_per_rank_ = left > rank_ ? (left - rank_ + world_size_ - 1) / world_size_ : 0;
      break;
  }
}

int64_t DistributedSampler::total_size() const {
  if (remainder_ != Remainder::uneven) return samples_per_rank_ * world_size_;
  return std::max<int64_t>(dataset_size_ - start_, 0);
}

int64_t DistributedSampler::consumed_after(int64_t taken) const {
  return start_ + std::min(std::max<int64_t>(taken, 0) * world_size_, total_size());
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> order(static_cast<size_t>(samples_per_rank_));
  if (samples_per_rank_ == 0) return order;
  const std::vector<int64_t> all =
      shuffle_ ? random_permutation(dataset_size_, seed_, epoch_) : SequentialSampler(dataset_size_).indices();
  // Position p of the padded (or cut) list is all[p % n]: padding repeats the
  // list from its start, as many times as needed when it is longer than n.
  for (int64_t i = 0; i < samples_per_rank_; ++i) {
    const int64_t position = start_ + rank_ + i * world_size_;
    order[i] = all[position % dataset_size_];
  }
  return order;
}

ShardSampler::ShardSampler(int64_t dataset_size, int64_t world_size, int64_t rank)
    : dataset_size_(dataset_size), world_size_(world_size), rank_(rank) {
  LOOM_CHECK(dataset_size >= 0, "ShardSampler: dataset size ", dataset_size, " must not be negative");
  LOOM_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "ShardSampler: rank ", rank,
             " must be in [0, world size ", world_size, ")");
}

int64_t ShardSampler::size() const {
  return dataset_size_ > rank_ ? (dataset_size_ - rank_ + world_size_ - 1) / world_size_ : 0;
}

std::vector<int64_t> ShardSampler::indices() const {
  std::vector<int64_t> result;
  result.reserve(static_cast<size_t>(size()));
  for (int64_t i = rank_; i < dataset_size_; i += world_size_) result.push_back(i);
  return result;
}

}  // namespace loom::data

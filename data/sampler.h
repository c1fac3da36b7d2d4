// Samplers: the order in which a loader visits dataset indices each epoch.
#pragma once

#include <cstdint>
#include <vector>

namespace loom::data {

// Produces the index order of one epoch. set_epoch() selects the epoch;
// indices() is a pure function of the sampler's settings and that epoch.
class Sampler {
 public:
  virtual ~Sampler() = default;
  virtual void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }
  // The dataset indices of the current epoch, in visiting order; size() of them.
  virtual std::vector<int64_t> indices() const = 0;
  virtual int64_t size() const = 0;

 protected:
  int64_t epoch_ = 0;
};

// 0, 1, ..., n-1 every epoch.
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t dataset_size);
  std::vector<int64_t> indices() const override;
  int64_t size() const override { return dataset_size_; }

 private:
  int64_t dataset_size_;
};

// A permutation of 0..n-1 drawn from (seed, epoch) by Fisher-Yates.
class RandomSampler : public Sampler {
 public:
  explicit RandomSampler(int64_t dataset_size, uint64_t seed = 0);
  std::vector<int64_t> indices() const override;
  int64_t size() const override { return dataset_size_; }

 private:
  int64_t dataset_size_;
  uint64_t seed_;
};

// The permutation every rank shares when shuffling: (seed, epoch) -> order of 0..n-1.
std::vector<int64_t> random_permutation(int64_t size, uint64_t seed, int64_t epoch);

// What DistributedSampler does with the n mod world samples an even split leaves over.
enum class Remainder {
  pad,     // PyTorch's default: repeat the list's first elements up to ceil(n / world) * world
  drop,    // PyTorch's drop_last=True: cut the list to floor(n / world) * world
  uneven,  // neither: every sample once, the first n mod world ranks one more than the others.
           // Ranks then run different numbers of batches: train inside dist::Join (dist/join.h).
};

// torch.utils.data.DistributedSampler: every rank computes the same list (a
// permutation from (seed, epoch) when shuffling, else 0..n-1); with
// Remainder::pad (drop_last false) it is padded by repeating its own first
// elements to ceil(n / world) * world, with Remainder::drop (drop_last true)
// cut to floor(n / world) * world, with Remainder::uneven left as it is;
// rank r takes elements r, r + world, r + 2 world, ... of it.
//
// Elastic resume: after k batches of b on every rank, the ranks together have
// consumed exactly the first k * b * world positions of the list (the
// interleaving makes it a prefix). set_start(S) continues an epoch after S
// consumed positions with any world size: rank r takes positions S + r,
// S + r + world, ... of the list, which is padded (or cut, or left uneven) as
// above but counted from S, so the rest of the epoch is split again; position
// p of the padded list is element p % n, as in PyTorch. With
// Remainder::uneven the prefix property holds while every rank still has
// full batches, which is when the Trainer writes step checkpoints.
class DistributedSampler : public Sampler {
 public:
  DistributedSampler(int64_t dataset_size, int64_t world_size, int64_t rank, bool shuffle = true, uint64_t seed = 0,
                     bool drop_last = false);
  DistributedSampler(int64_t dataset_size, int64_t world_size, int64_t rank, bool shuffle, uint64_t seed,
                     Remainder remainder);
  // Selects the epoch; another epoch than the current one clears set_start().
  void set_epoch(int64_t epoch) override;
  // The epoch's first `consumed` positions are done (by a run of any world
  // size): indices() holds the rest of this rank's share.
  void set_start(int64_t consumed);
  int64_t start() const { return start_; }
  std::vector<int64_t> indices() const override;
  // Indices of this rank (num_samples in PyTorch), from start() on; with
  // Remainder::uneven ranks differ by at most one.
  int64_t size() const override { return samples_per_rank_; }
  // All ranks together from start() on (total_size in PyTorch).
  int64_t total_size() const;
  // Positions of the epoch's list consumed by all ranks once every rank has
  // taken its first `taken` indices (of size()): start() + taken * world,
  // at most start() + total_size().
  int64_t consumed_after(int64_t taken) const;
  int64_t world_size() const { return world_size_; }
  int64_t rank() const { return rank_; }
  Remainder remainder() const { return remainder_; }

 private:
  int64_t dataset_size_, world_size_, rank_;
  bool shuffle_;
  Remainder remainder_;
  uint64_t seed_;
  int64_t start_ = 0;
  int64_t samples_per_rank_;
};

// Rank `rank`'s share of an evaluation set of `dataset_size` items: indices
// rank, rank + world, rank + 2 world, ... in order, with no padding (unlike
// DistributedSampler), so counts summed over ranks cover every item once.
class ShardSampler final : public Sampler {
 public:
  ShardSampler(int64_t dataset_size, int64_t world_size, int64_t rank);
  std::vector<int64_t> indices() const override;
  int64_t size() const override;

 private:
  int64_t dataset_size_, world_size_, rank_;
};

}  // namespace loom::data

// Sampler tests. DistributedSampler is compared with a line-by-line
// transcription of torch.utils.data.DistributedSampler.__iter__.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <loom/data/sampler.h>
#include "tests/data/helpers.h"

using namespace loom::data;
using namespace loom::data::testing;

namespace {

// PyTorch 1.13 / 2.x, DistributedSampler: __init__ and __iter__, with the
// shuffled list taken from the same permutation loom uses.
std::vector<int64_t> pytorch_rank_indices(int64_t n, int64_t world, int64_t rank, bool shuffle, uint64_t seed,
                                          int64_t epoch, bool drop_last) {
  int64_t num_samples;
  if (drop_last && n % world != 0) {
    num_samples = static_cast<int64_t>(std::ceil(static_cast<double>(n - world) / world));
  } else {
    num_samples = static_cast<int64_t>(std::ceil(static_cast<double>(n) / world));
  }
  const int64_t total_size = num_samples * world;
  std::vector<int64_t> indices;
  if (shuffle) {
    indices = random_permutation(n, seed, epoch);
  } else {
    for (int64_t i = 0; i < n; ++i) indices.push_back(i);
  }
  if (!drop_last) {
    const int64_t padding_size = total_size - static_cast<int64_t>(indices.size());
    if (padding_size <= static_cast<int64_t>(indices.size())) {
      indices.insert(indices.end(), indices.begin(), indices.begin() + padding_size);
    } else {
      const int64_t repeats = (padding_size + n - 1) / n;
      std::vector<int64_t> repeated;
      for (int64_t r = 0; r < repeats; ++r) repeated.insert(repeated.end(), indices.begin(), indices.end());
      indices.insert(indices.end(), repeated.begin(), repeated.begin() + padding_size);
    }
  } else {
    indices.resize(total_size);
  }
  std::vector<int64_t> mine;
  for (int64_t i = rank; i < total_size; i += world) mine.push_back(indices[i]);
  return mine;
}

}  // namespace

TEST_CASE("SequentialSampler and RandomSampler") {
  SequentialSampler sequential(5);
  CHECK(sequential.indices() == std::vector<int64_t>{0, 1, 2, 3, 4});
  RandomSampler random(100, 42);
  const std::vector<int64_t> epoch0 = random.indices();
  std::vector<int64_t> sorted = epoch0;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == SequentialSampler(100).indices());
  CHECK(epoch0 != SequentialSampler(100).indices());
  CHECK(random.indices() == epoch0);
  random.set_epoch(1);
  CHECK(random.indices() != epoch0);
  random.set_epoch(0);
  CHECK(random.indices() == epoch0);
  CHECK(RandomSampler(100, 43).indices() != epoch0);
  CHECK(RandomSampler(0, 1).indices().empty());
}

TEST_CASE("DistributedSampler without shuffle pads from the start of the list") {
  const std::vector<std::vector<int64_t>> expected = {{0, 4, 8}, {1, 5, 9}, {2, 6, 0}, {3, 7, 1}};
  for (int64_t rank = 0; rank < 4; ++rank) {
    DistributedSampler sampler(10, 4, rank, /*shuffle=*/false);
    CHECK(sampler.size() == 3);
    CHECK(sampler.total_size() == 12);
    CHECK(sampler.indices() == expected[rank]);
  }
  // Padding longer than the dataset repeats it whole: [0, 1] -> [0, 1, 0, 1, 0, 1, 0, 1].
  for (int64_t rank = 0; rank < 8; ++rank) {
    CHECK(DistributedSampler(2, 8, rank, false).indices() == std::vector<int64_t>{rank % 2});
  }
  // drop_last cuts the tail: 10 over 4 ranks -> 8 indices.
  CHECK(DistributedSampler(10, 4, 1, false, 0, /*drop_last=*/true).indices() == std::vector<int64_t>{1, 5});
}

TEST_CASE("DistributedSampler follows PyTorch's rule for every size, world, rank and epoch") {
  for (int64_t world : {1, 2, 3, 4, 8})
    for (int64_t n : {0, 1, 2, 3, 7, 10, 13, 101})
      for (bool shuffle : {false, true})
        for (bool drop_last : {false, true})
          for (int64_t epoch : {0, 3})
            for (int64_t rank = 0; rank < world; ++rank) {
              DistributedSampler sampler(n, world, rank, shuffle, 17, drop_last);
              sampler.set_epoch(epoch);
              const std::vector<int64_t> expected =
                  pytorch_rank_indices(n, world, rank, shuffle, 17, epoch, drop_last);
              if (sampler.indices() != expected) {
                FAIL("n=", n, " world=", world, " rank=", rank, " shuffle=", shuffle, " drop_last=", drop_last,
                     " epoch=", epoch);
              }
              REQUIRE(sampler.size() == static_cast<int64_t>(expected.size()));
            }
}

TEST_CASE("DistributedSampler ranks cover the dataset with equal counts and reshuffle per epoch") {
  for (int64_t world : {2, 4}) {
    CAPTURE(world);
    const int64_t n = 103;  // not divisible by 2 or 4
    std::map<int64_t, std::vector<int64_t>> by_epoch;
    for (int64_t epoch : {0, 1}) {
      std::map<int64_t, int> times_seen;
      for (int64_t rank = 0; rank < world; ++rank) {
        DistributedSampler sampler(n, world, rank, true, 5);
        sampler.set_epoch(epoch);
        const std::vector<int64_t> mine = sampler.indices();
        CHECK(static_cast<int64_t>(mine.size()) == (n + world - 1) / world);
        for (int64_t index : mine) ++times_seen[index];
        if (rank == 0) by_epoch[epoch] = mine;
      }
      CHECK(static_cast<int64_t>(times_seen.size()) == n);  // union is every index
      int repeats = 0;
      for (const auto& [index, times] : times_seen) {
        CHECK(times <= 2);
        repeats += times - 1;
      }
      CHECK(repeats == (n + world - 1) / world * world - n);  // only the padding repeats
    }
    CHECK(by_epoch[0] != by_epoch[1]);

    // drop_last: disjoint ranks, floor(n / world) each.
    std::set<int64_t> seen;
    for (int64_t rank = 0; rank < world; ++rank) {
      const std::vector<int64_t> mine = DistributedSampler(n, world, rank, true, 5, true).indices();
      CHECK(static_cast<int64_t>(mine.size()) == n / world);
      seen.insert(mine.begin(), mine.end());
    }
    CHECK(static_cast<int64_t>(seen.size()) == n / world * world);
  }
}

TEST_CASE("set_start continues an epoch on another world: the rest of the global list, each sample once") {
  // The epoch's global list is the world-1 order (the permutation); N ranks
  // taking batches of b consume a prefix of it, and M ranks continue after it.
  for (int64_t n : {12, 13, 36, 101})
    for (int64_t from_world : {1, 2, 4})
      for (int64_t to_world : {1, 2, 3, 5})
        for (int64_t batches : {0, 1, 2}) {
          CAPTURE(n);
          CAPTURE(from_world);
          CAPTURE(to_world);
          CAPTURE(batches);
          const int64_t batch = 3;
          DistributedSampler whole(n, 1, 0, true, 9);
          whole.set_epoch(2);
          const std::vector<int64_t> order = whole.indices();
          // What the N ranks took: the first batches * batch of each rank's indices.
          std::multiset<int64_t> taken;
          int64_t consumed = 0;
          for (int64_t rank = 0; rank < from_world; ++rank) {
            DistributedSampler sampler(n, from_world, rank, true, 9);
            sampler.set_epoch(2);
            const std::vector<int64_t> mine = sampler.indices();
            const int64_t count = std::min<int64_t>(batches * batch, static_cast<int64_t>(mine.size()));
            taken.insert(mine.begin(), mine.begin() + count);
            consumed = sampler.consumed_after(batches * batch);
          }
          REQUIRE(consumed == std::min(batches * batch * from_world, ((n + from_world - 1) / from_world) * from_world));
          if (consumed > n) continue;  // the epoch is over (its padding included)
          CHECK(taken == std::multiset<int64_t>(order.begin(), order.begin() + consumed));  // a prefix of the list
          // The M ranks: every rank the same count, together the rest of the list
          // once, then padding from the list's start (PyTorch's rule).
          std::multiset<int64_t> rest;
          const int64_t per_rank = (n - consumed + to_world - 1) / to_world;
          for (int64_t rank = 0; rank < to_world; ++rank) {
            DistributedSampler sampler(n, to_world, rank, true, 9);
            sampler.set_epoch(2);
            sampler.set_start(consumed);
            sampler.set_epoch(2);  // the same epoch keeps the start (DataLoader::start_epoch sets it again)
            const std::vector<int64_t> mine = sampler.indices();
            REQUIRE(static_cast<int64_t>(mine.size()) == per_rank);
            for (int64_t i = 0; i < per_rank; ++i) CHECK(mine[i] == order[(consumed + rank + i * to_world) % n]);
            rest.insert(mine.begin(), mine.end());
            CHECK(sampler.consumed_after(per_rank) == consumed + per_rank * to_world);
          }
          std::multiset<int64_t> expected(order.begin() + consumed, order.end());
          for (int64_t p = 0; p < per_rank * to_world - (n - consumed); ++p) expected.insert(order[p % n]);
          CHECK(rest == expected);
          if (consumed == 0) {
            DistributedSampler fresh(n, to_world, 0, true, 9);
            fresh.set_epoch(2);
            DistributedSampler restarted(n, to_world, 0, true, 9);
            restarted.set_epoch(2);
            restarted.set_start(0);
            CHECK(fresh.indices() == restarted.indices());
          }
        }
  // Another epoch clears the start.
  DistributedSampler sampler(10, 2, 0, false);
  sampler.set_start(6);
  CHECK(sampler.indices() == std::vector<int64_t>{6, 8});
  sampler.set_epoch(1);
  CHECK(sampler.start() == 0);
  CHECK(sampler.size() == 5);
}

TEST_CASE("Remainder::uneven: every sample once, the first n mod world ranks one more, no padding") {
  // Hand-computed: 10 over 4 ranks, no shuffle -> {0, 4, 8}, {1, 5, 9}, {2, 6}, {3, 7}.
  const std::vector<std::vector<int64_t>> expected = {{0, 4, 8}, {1, 5, 9}, {2, 6}, {3, 7}};
  for (int64_t rank = 0; rank < 4; ++rank) {
    DistributedSampler sampler(10, 4, rank, /*shuffle=*/false, 0, Remainder::uneven);
    CHECK(sampler.indices() == expected[rank]);
    CHECK(sampler.size() == static_cast<int64_t>(expected[rank].size()));
    CHECK(sampler.total_size() == 10);
    CHECK(sampler.remainder() == Remainder::uneven);
  }
  // The bool constructor keeps PyTorch's two modes.
  CHECK(DistributedSampler(10, 4, 0, false).remainder() == Remainder::pad);
  CHECK(DistributedSampler(10, 4, 0, false, 0, true).remainder() == Remainder::drop);
  CHECK(DistributedSampler(10, 4, 2, false, 0, Remainder::drop).indices() == std::vector<int64_t>{2, 6});
  // Fewer samples than ranks: the last ranks get none.
  CHECK(DistributedSampler(2, 4, 3, false, 0, Remainder::uneven).indices().empty());

  for (int64_t world : {1, 2, 3, 4, 8})
    for (int64_t n : {0, 1, 7, 10, 101})
      for (int64_t start : {0, 3, 6}) {
        CAPTURE(world);
        CAPTURE(n);
        CAPTURE(start);
        DistributedSampler whole(n, 1, 0, true, 9);
        whole.set_epoch(1);
        const std::vector<int64_t> order = whole.indices();
        std::multiset<int64_t> seen;
        for (int64_t rank = 0; rank < world; ++rank) {
          DistributedSampler sampler(n, world, rank, true, 9, Remainder::uneven);
          sampler.set_epoch(1);
          sampler.set_start(start);
          const std::vector<int64_t> mine = sampler.indices();
          const int64_t left = std::max<int64_t>(n - start, 0);
          CHECK(static_cast<int64_t>(mine.size()) == left / world + (rank < left % world ? 1 : 0));
          for (size_t i = 0; i < mine.size(); ++i) CHECK(mine[i] == order[start + rank + static_cast<int64_t>(i) * world]);
          seen.insert(mine.begin(), mine.end());
          CHECK(sampler.total_size() == left);
          // Full batches on every rank consume a prefix; rank 0's whole share (the largest) ends the list.
          CHECK(sampler.consumed_after(1) == start + std::min<int64_t>(world, left));
          if (rank == 0) CHECK(sampler.consumed_after(sampler.size()) == start + left);
        }
        CHECK(seen == std::multiset<int64_t>(order.begin() + std::min<int64_t>(start, n), order.end()));
      }
}

TEST_CASE("DistributedSampler rejects bad ranks and worlds") {
  CHECK(error_message([] { DistributedSampler(10, 4, 4); }).find("rank 4 is out of range for world size 4") !=
        std::string::npos);
  CHECK(error_message([] { DistributedSampler(10, 4, -1); }).find("expected 0 <= rank < 4") != std::string::npos);
  CHECK(error_message([] { DistributedSampler(10, 0, 0); }).find("world size 0 must be at least 1") !=
        std::string::npos);
  CHECK(error_message([] { DistributedSampler(-1, 2, 0); }).find("dataset size -1") != std::string::npos);
}

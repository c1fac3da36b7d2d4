// A user's own Dataset (data/dataset.h) in the DataLoader: its values in every
// output dtype and memory format, per-sample randomness that does not depend
// on the number of workers, and errors from get() naming the sample.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <stdexcept>

#include <loom/core/generator.h>
#include <loom/data/loader.h>
#include "tests/data/helpers.h"

using namespace loom::data;
using namespace loom::data::testing;
using loom::DType;

namespace {

// Sample i: channel c, row y, column x holds i + c / 10 + y / 100 + x / 1000
// plus, with `noise`, one uniform draw of the sample's own generator per sample.
class Pattern : public Dataset {
 public:
  explicit Pattern(bool noise = false, int64_t fail_at = -1) : noise_(noise), fail_at_(fail_at) {}
  int64_t size() const override { return 13; }
  SampleShape sample_shape() const override { return {2, 3, 4}; }
  int64_t get(int64_t index, SampleSlot& slot) const override {
    if (index == fail_at_) throw std::runtime_error("no such picture");
    const float offset = noise_ ? static_cast<float>(slot.random->uniform()) : 0.0f;
    float* out = slot.pixels;
    for (int64_t c = 0; c < 2; ++c)
      for (int64_t y = 0; y < 3; ++y)
        for (int64_t x = 0; x < 4; ++x) *out++ = expected(index, c, y, x) + offset;
    return 100 + index;
  }
  std::string name() const override { return "pattern"; }
  static float expected(int64_t i, int64_t c, int64_t y, int64_t x) {
    return static_cast<float>(i) + static_cast<float>(c) / 10 + static_cast<float>(y) / 100 + static_cast<float>(x) / 1000;
  }

 private:
  bool noise_;
  int64_t fail_at_;
};

std::vector<float> all_values(DataLoader& loader, int64_t epoch) {
  std::vector<float> values;
  for (Batch& batch : loader.epoch(epoch)) {
    const std::vector<float> part = batch.images.to(DType::f32).contiguous().to_vector<float>();
    values.insert(values.end(), part.begin(), part.end());
  }
  return values;
}

}  // namespace

TEST_CASE("a user's Dataset fills batch slots in every dtype and memory format") {
  for (const DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    for (const MemoryFormat format : {MemoryFormat::nchw, MemoryFormat::nhwc}) {
      CAPTURE(loom::dtype_name(dtype));
      CAPTURE(static_cast<int>(format));
      DataLoader loader(std::make_shared<Pattern>(),
                        DataLoaderOptions().batch_size(5).num_workers(2).dtype(dtype).memory_format(format));
      CHECK(loader.dataset_size() == 13);
      CHECK(loader.num_batches() == 3);
      int64_t seen = 0;
      for (Batch& batch : loader.epoch(0)) {
        REQUIRE(batch.images.dtype() == dtype);
        REQUIRE(batch.images.size(1) == 2);
        REQUIRE(batch.images.size(2) == 3);
        REQUIRE(batch.images.size(3) == 4);
        const std::vector<int64_t> labels = batch.labels.to_vector<int64_t>();
        const std::vector<float> values = batch.images.to(DType::f32).contiguous().to_vector<float>();
        const double tolerance = dtype == DType::bf16 ? 0.05 : dtype == DType::f16 ? 0.01 : 1e-6;
        for (int64_t s = 0; s < batch.size(); ++s, ++seen) {
          REQUIRE(labels[s] == 100 + seen);
          for (int64_t c = 0; c < 2; ++c)
            for (int64_t y = 0; y < 3; ++y)
              for (int64_t x = 0; x < 4; ++x)
                REQUIRE(std::abs(values[((s * 2 + c) * 3 + y) * 4 + x] - Pattern::expected(seen, c, y, x)) <= tolerance);
        }
      }
      CHECK(seen == 13);
    }
  }
}

TEST_CASE("a user's Dataset gets the same per-sample randomness with 0 and 3 workers, new draws per epoch") {
  DataLoader serial(std::make_shared<Pattern>(true), DataLoaderOptions().batch_size(4).seed(9));
  DataLoader threaded(std::make_shared<Pattern>(true), DataLoaderOptions().batch_size(4).num_workers(3).seed(9));
  const std::vector<float> first = all_values(serial, 0);
  CHECK(first == all_values(threaded, 0));
  CHECK(first != all_values(serial, 1));
  CHECK(first[0] != Pattern::expected(0, 0, 0, 0));  // the noise is there
}

TEST_CASE("an exception in a user's get() reaches next() naming the dataset and the sample") {
  DataLoader loader(std::make_shared<Pattern>(false, 7), DataLoaderOptions().batch_size(4).num_workers(2));
  const std::string message = error_message([&] {
    for ([[maybe_unused]] Batch& batch : loader.epoch(0)) {
    }
  });
  CHECK(message.find("DataLoader: building batch 1 of epoch 0 failed: pattern, sample 7: no such picture") !=
        std::string::npos);
  CHECK(error_message([&] { loader.dataset(); }).find("this loader reads pattern") != std::string::npos);
}

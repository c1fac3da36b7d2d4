// Transform tests against hand computation: crop windows over the zero-padded
// source, mirrors, normalized values, layouts and dtypes, and validation.
#include <doctest/doctest.h>

#include <algorithm>

#include <set>

#include <loom/data/cifar10.h>
#include <loom/data/transforms.h>
#include "tests/data/helpers.h"

using namespace loom::data;
using namespace loom::data::testing;

namespace {

// The source image zero-padded by `padding` on every side, (C, H + 2p, W + 2p).
std::vector<int> padded_image(const ImageDataset& dataset, int64_t index, int64_t padding) {
  const int64_t C = dataset.channels(), H = dataset.height(), W = dataset.width();
  const int64_t PH = H + 2 * padding, PW = W + 2 * padding;
  std::vector<int> out(C * PH * PW, 0);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t y = 0; y < H; ++y)
      for (int64_t x = 0; x < W; ++x) out[(c * PH + y + padding) * PW + x + padding] = dataset.pixel(index, c, y, x);
  return out;
}

std::vector<float> apply_f32(const FusedTransform& transform, const ImageDataset& dataset, int64_t index,
                             const SampleAugmentation& augmentation) {
  const int64_t C = transform.channels(), H = transform.output_height(), W = transform.output_width();
  std::vector<float> out(C * H * W, -1000.0f);
  transform.apply<float>(dataset.image(index), augmentation, out.data(), {H * W, W, 1});
  return out;
}

}  // namespace

TEST_CASE("ToTensor and Normalize give torchvision's f32 values") {
  const FusedTransform to_tensor(Compose({ToTensor{}}), 3, 2, 2);
  const FusedTransform normalized(Compose({ToTensor{}, cifar10_normalize()}), 3, 2, 2);
  const FusedTransform mnist(Compose({ToTensor{}, mnist_normalize()}), 1, 2, 2);
  for (int v : {0, 1, 77, 128, 254, 255}) {
    CAPTURE(v);
    const float unit = static_cast<float>(v) / 255.0f;
    CHECK(to_tensor.value_of(2, static_cast<uint8_t>(v)) == unit);
    for (int c = 0; c < 3; ++c) {
      const float expected = (unit - static_cast<float>(cifar10_mean[c])) / static_cast<float>(cifar10_std[c]);
      CHECK(normalized.value_of(c, static_cast<uint8_t>(v)) == expected);
      CHECK(normalized.value_of(c, static_cast<uint8_t>(v)) ==
            doctest::Approx((v / 255.0 - cifar10_mean[c]) / cifar10_std[c]).epsilon(1e-6));
    }
    CHECK(mnist.value_of(0, static_cast<uint8_t>(v)) == doctest::Approx((v / 255.0 - 0.1307) / 0.3081).epsilon(1e-6));
  }
  // Hand-computed: (255/255 - 0.4914) / 0.2023 = 2.514088...
  CHECK(normalized.value_of(0, 255) == doctest::Approx(2.5140880).epsilon(1e-6));
  CHECK(mnist.value_of(0, 0) == doctest::Approx(-0.4242129).epsilon(1e-6));
}

TEST_CASE("RandomCrop takes an in-bounds window of the zero-padded source") {
  const ImageDataset dataset = synthetic_cifar10(64, 5);
  const FusedTransform transform(Compose({RandomCrop(32, 4), ToTensor{}}), 3, 32, 32);
  std::set<int64_t> tops, lefts;
  for (int64_t i = 0; i < dataset.size(); ++i) {
    const SampleAugmentation augmentation = transform.draw(7, 0, i);
    REQUIRE(augmentation.top >= -4);
    REQUIRE(augmentation.top <= 4);
    REQUIRE(augmentation.left >= -4);
    REQUIRE(augmentation.left <= 4);
    CHECK_FALSE(augmentation.flip);
    tops.insert(augmentation.top);
    lefts.insert(augmentation.left);
    const std::vector<int> padded = padded_image(dataset, i, 4);
    const std::vector<float> out = apply_f32(transform, dataset, i, augmentation);
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t y = 0; y < 32; ++y)
        for (int64_t x = 0; x < 32; ++x) {
          const int source = padded[(c * 40 + y + augmentation.top + 4) * 40 + x + augmentation.left + 4];
          REQUIRE(out[(c * 32 + y) * 32 + x] == static_cast<float>(source) / 255.0f);
        }
  }
  CHECK(tops.size() >= 7);  // 64 draws over 9 offsets reach nearly all of them
  CHECK(lefts.size() >= 7);
}

TEST_CASE("every extreme crop offset, with and without a flip, matches the padded window") {
  const ImageDataset dataset = synthetic_cifar10(1, 9);
  const FusedTransform transform(Compose({RandomCrop(32, 4), RandomHorizontalFlip{}, ToTensor{}}), 3, 32, 32);
  const std::vector<int> padded = padded_image(dataset, 0, 4);
  for (int64_t top : {-4, 0, 3, 4})
    for (int64_t left : {-4, -1, 0, 4})
      for (bool flip : {false, true}) {
        CAPTURE(top);
        CAPTURE(left);
        CAPTURE(flip);
        const std::vector<float> out = apply_f32(transform, dataset, 0, {top, left, flip});
        for (int64_t c = 0; c < 3; ++c)
          for (int64_t y = 0; y < 32; ++y)
            for (int64_t x = 0; x < 32; ++x) {
              const int64_t window_x = flip ? 31 - x : x;  // flip mirrors the cropped window
              const int source = padded[(c * 40 + y + top + 4) * 40 + window_x + left + 4];
              REQUIRE(out[(c * 32 + y) * 32 + x] == static_cast<float>(source) / 255.0f);
            }
      }
}

TEST_CASE("a smaller, non-square crop without padding stays inside the image") {
  const ImageDataset dataset = synthetic_cifar10(20, 2);
  const FusedTransform transform(Compose({RandomCrop(24, 28, 0), ToTensor{}}), 3, 32, 32);
  CHECK(transform.output_height() == 24);
  CHECK(transform.output_width() == 28);
  for (int64_t i = 0; i < dataset.size(); ++i) {
    const SampleAugmentation augmentation = transform.draw(1, 2, i);
    REQUIRE(augmentation.top >= 0);
    REQUIRE(augmentation.top <= 8);
    REQUIRE(augmentation.left >= 0);
    REQUIRE(augmentation.left <= 4);
    const std::vector<float> out = apply_f32(transform, dataset, i, augmentation);
    CHECK(out[(2 * 24 + 23) * 28 + 27] ==
          dataset.pixel(i, 2, augmentation.top + 23, augmentation.left + 27) / 255.0f);
  }
}

TEST_CASE("RandomHorizontalFlip mirrors with the given probability") {
  const ImageDataset dataset = synthetic_cifar10(1, 4);
  const FusedTransform always(Compose({RandomHorizontalFlip{1.0}, ToTensor{}}), 3, 32, 32);
  const FusedTransform never(Compose({RandomHorizontalFlip{0.0}, ToTensor{}}), 3, 32, 32);
  const std::vector<float> mirrored = apply_f32(always, dataset, 0, always.draw(0, 0, 0));
  const std::vector<float> same = apply_f32(never, dataset, 0, never.draw(0, 0, 0));
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t y = 0; y < 32; ++y)
      for (int64_t x = 0; x < 32; ++x) {
        REQUIRE(mirrored[(c * 32 + y) * 32 + x] == dataset.pixel(0, c, y, 31 - x) / 255.0f);
        REQUIRE(same[(c * 32 + y) * 32 + x] == dataset.pixel(0, c, y, x) / 255.0f);
      }
  const FusedTransform half(Compose({RandomHorizontalFlip{}, ToTensor{}}), 3, 32, 32);
  int flips = 0;
  for (int64_t i = 0; i < 4000; ++i) flips += half.draw(3, 1, i).flip;
  CHECK(flips > 1800);
  CHECK(flips < 2200);
}

TEST_CASE("crop + flip + normalize in one pass equals the steps done by hand") {
  const ImageDataset dataset = synthetic_cifar10(8, 6);
  const FusedTransform transform(
      Compose({RandomCrop(32, 4), RandomHorizontalFlip{}, ToTensor{}, cifar10_normalize()}), 3, 32, 32);
  for (int64_t i = 0; i < dataset.size(); ++i) {
    const SampleAugmentation augmentation = transform.draw(5, 3, i);
    const std::vector<int> padded = padded_image(dataset, i, 4);
    const std::vector<float> out = apply_f32(transform, dataset, i, augmentation);
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t y = 0; y < 32; ++y)
        for (int64_t x = 0; x < 32; ++x) {
          const int64_t window_x = augmentation.flip ? 31 - x : x;
          const int source = padded[(c * 40 + y + augmentation.top + 4) * 40 + window_x + augmentation.left + 4];
          const float expected =
              (static_cast<float>(source) / 255.0f - static_cast<float>(cifar10_mean[c])) /
              static_cast<float>(cifar10_std[c]);
          REQUIRE(out[(c * 32 + y) * 32 + x] == expected);
        }
  }
}

TEST_CASE("channels-last strides and 16-bit outputs hold the same values") {
  const ImageDataset dataset = synthetic_cifar10(1, 8);
  const FusedTransform transform(
      Compose({RandomCrop(32, 4), RandomHorizontalFlip{}, ToTensor{}, cifar10_normalize()}), 3, 32, 32);
  const SampleAugmentation augmentation{-3, 2, true};
  const std::vector<float> nchw = apply_f32(transform, dataset, 0, augmentation);
  std::vector<float> nhwc(3 * 32 * 32);
  transform.apply<float>(dataset.image(0), augmentation, nhwc.data(), {1, 32 * 3, 3});
  std::vector<loom::Half> half(3 * 32 * 32);
  transform.apply<loom::Half>(dataset.image(0), augmentation, half.data(), {32 * 32, 32, 1});
  std::vector<loom::BFloat16> bf16(3 * 32 * 32);
  transform.apply<loom::BFloat16>(dataset.image(0), augmentation, bf16.data(), {32 * 32, 32, 1});
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t y = 0; y < 32; ++y)
      for (int64_t x = 0; x < 32; ++x) {
        const float value = nchw[(c * 32 + y) * 32 + x];
        REQUIRE(nhwc[(y * 32 + x) * 3 + c] == value);
        REQUIRE(half[(c * 32 + y) * 32 + x].bits == loom::Half(value).bits);
        REQUIRE(bf16[(c * 32 + y) * 32 + x].bits == loom::BFloat16(value).bits);
      }
}

TEST_CASE("augmentation randomness depends only on (seed, epoch, index)") {
  const FusedTransform transform(Compose({RandomCrop(32, 4), RandomHorizontalFlip{}, ToTensor{}}), 3, 32, 32);
  int differences_by_epoch = 0, differences_by_seed = 0;
  for (int64_t i = 0; i < 100; ++i) {
    const SampleAugmentation a = transform.draw(1, 0, i), b = transform.draw(1, 0, i);
    REQUIRE((a.top == b.top && a.left == b.left && a.flip == b.flip));
    const SampleAugmentation next_epoch = transform.draw(1, 1, i), other_seed = transform.draw(2, 0, i);
    differences_by_epoch += next_epoch.top != a.top || next_epoch.left != a.left || next_epoch.flip != a.flip;
    differences_by_seed += other_seed.top != a.top || other_seed.left != a.left || other_seed.flip != a.flip;
  }
  CHECK(differences_by_epoch > 80);
  CHECK(differences_by_seed > 80);
}

TEST_CASE("invalid compositions are rejected with a reason") {
  auto message = [](std::vector<Transform> transforms, int64_t channels = 3) {
    return error_message([&] { FusedTransform(Compose(std::move(transforms)), channels, 32, 32); });
  };
  CHECK(message({RandomCrop(32, 4)}).find("needs ToTensor") != std::string::npos);
  CHECK(message({cifar10_normalize(), ToTensor{}}).find("Normalize must come after ToTensor") != std::string::npos);
  CHECK(message({ToTensor{}, cifar10_normalize(), RandomCrop(32, 4)}).find("RandomCrop after Normalize") !=
        std::string::npos);
  CHECK(message({RandomCrop(41, 4), ToTensor{}}).find("RandomCrop of 41x41 does not fit in 32x32 images padded by 4") !=
        std::string::npos);
  CHECK(message({ToTensor{}, cifar10_normalize()}, 1).find("3 means and 3 standard deviations for 1-channel") !=
        std::string::npos);
  CHECK(message({ToTensor{}, Normalize{{0.5}, {0.0}}}).find("standard deviation of channel 0 is zero") !=
        std::string::npos);
  CHECK(message({RandomHorizontalFlip{1.5}, ToTensor{}}).find("must be in [0, 1]") != std::string::npos);
  CHECK(message({ToTensor{}, ToTensor{}}).find("ToTensor appears twice") != std::string::npos);
  // One mean and std broadcast to every channel.
  const FusedTransform broadcast(Compose({ToTensor{}, Normalize{{0.5}, {0.25}}}), 3, 4, 4);
  CHECK(broadcast.value_of(2, 255) == (1.0f - 0.5f) / 0.25f);
}

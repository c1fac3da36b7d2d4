// PIL's antialiased bilinear resampling (Resample.c), bit for bit: the passes
// behind resize_bilinear, and the SSE4.1 resize to a tensor of ImageFolder's fused path.
#include <loom/data/image_internal.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#if LOOM_IMAGE_SSE41
#include <immintrin.h>
#endif

#include <loom/core/error.h>

namespace loom::data {

namespace image {

namespace {

// PIL's resampling coefficients for one axis (Resample.c, precompute_coeffs
// with the bilinear filter, then normalize_coeffs_8bpc).
constexpr int precision_bits = 32 - 8 - 2;

struct AxisCoefficients {
  int64_t taps = 0;                  // coefficients per output position
  std::vector<int64_t> first, count;  // input range per output position
  std::vector<int32_t> weights;       // (out, taps)
};

AxisCoefficients coefficients(int64_t in_size, int64_t out_size) {
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double filter_scale = std::max(scale, 1.0);
  const double support = 1.0 * filter_scale;
  AxisCoefficients out;
  out.taps = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  out.first.resize(static_cast<size_t>(out_size));
  out.count.resize(static_cast<size_t>(out_size));
  out.weights.assign(static_cast<size_t>(out_size * out.taps), 0);
  std::vector<double> k(static_cast<size_t>(out.taps));
  for (int64_t position = 0; position < out_size; ++position) {
    const double center = (static_cast<double>(position) + 0.5) * scale;
    const double inverse = 1.0 / filter_scale;
    int64_t lo = static_cast<int64_t>(center - support + 0.5);
    if (lo < 0) lo = 0;
    int64_t hi = static_cast<int64_t>(center + support + 0.5);
    if (hi > in_size) hi = in_size;
    const int64_t n = hi - lo;
    double total = 0.0;
    for (int64_t x = 0; x < n; ++x) {
      double t = std::abs((static_cast<double>(x + lo) - center + 0.5) * inverse);
      const double w = t < 1.0 ? 1.0 - t : 0.0;
      k[x] = w;
      total += w;
    }
    for (int64_t x = 0; x < n; ++x) {
      const double w = total != 0.0 ? k[x] / total : k[x];
      out.weights[position * out.taps + x] =
          static_cast<int32_t>(w < 0 ? -0.5 + w * (1 << precision_bits) : 0.5 + w * (1 << precision_bits));
    }
    out.first[position] = lo;
    out.count[position] = n;
  }
  return out;
}

// Sums stay below 2^31 as in PIL: weights are positive and add up to 2^22, pixels are below 2^8.
uint8_t clip8(int32_t value) {
  const int32_t shifted = value >> precision_bits;
  return static_cast<uint8_t>(std::clamp<int32_t>(shifted, 0, 255));
}

template <int64_t Channels>
void horizontal_rows(const DecodedImage& in, const AxisCoefficients& k, int64_t width, DecodedImage& out) {
  const int64_t channels = Channels > 0 ? Channels : in.channels;
  for (int64_t y = 0; y < in.height; ++y) {
    const uint8_t* row = in.pixels.data() + y * in.width * channels;
    uint8_t* target = out.pixels.data() + y * width * channels;
    for (int64_t x = 0; x < width; ++x) {
      const int32_t* w = k.weights.data() + x * k.taps;
      const uint8_t* source = row + k.first[x] * channels;
      for (int64_t c = 0; c < channels; ++c) {
        int32_t sum = int32_t{1} << (precision_bits - 1);
        for (int64_t t = 0; t < k.count[x]; ++t) sum += int32_t{source[t * channels + c]} * w[t];
        target[x * channels + c] = clip8(sum);
      }
    }
  }
}

DecodedImage resample_horizontal(const DecodedImage& in, int64_t width) {
  const AxisCoefficients k = coefficients(in.width, width);
  DecodedImage out{in.height, width, in.channels, {}};
  out.pixels.resize(static_cast<size_t>(out.height * out.width * out.channels));
  if (in.channels == 3) {
    horizontal_rows<3>(in, k, width, out);
  } else if (in.channels == 1) {
    horizontal_rows<1>(in, k, width, out);
  } else {
    horizontal_rows<0>(in, k, width, out);
  }
  return out;
}

DecodedImage resample_vertical(const DecodedImage& in, int64_t height) {
  const AxisCoefficients k = coefficients(in.height, height);
  DecodedImage out{height, in.width, in.channels, {}};
  const int64_t row_size = in.width * in.channels;
  out.pixels.resize(static_cast<size_t>(height * row_size));
  std::vector<int32_t> sums(static_cast<size_t>(row_size));
  for (int64_t y = 0; y < height; ++y) {
    // Row by row, so that the inner loop runs over contiguous bytes.
    std::fill(sums.begin(), sums.end(), int32_t{1} << (precision_bits - 1));
    const int32_t* w = k.weights.data() + y * k.taps;
    for (int64_t t = 0; t < k.count[y]; ++t) {
      const uint8_t* source = in.pixels.data() + (k.first[y] + t) * row_size;
      const int32_t weight = w[t];
      for (int64_t i = 0; i < row_size; ++i) sums[i] += int32_t{source[i]} * weight;
    }
    uint8_t* target = out.pixels.data() + y * row_size;
    for (int64_t i = 0; i < row_size; ++i) target[i] = clip8(sums[i]);
  }
  return out;
}

void fixed_taps(int64_t in_size, int64_t out_size, FixedTaps& out) {
  const AxisCoefficients k = coefficients(in_size, out_size);
  out.taps = std::min(k.taps, in_size);
  out.first.resize(static_cast<size_t>(out_size));
  out.weights.assign(static_cast<size_t>(out_size * out.taps), 0);
  for (int64_t p = 0; p < out_size; ++p) {
    const int64_t start = std::min(k.first[p], in_size - out.taps);
    for (int64_t t = 0; t < k.count[p]; ++t) out.weights[p * out.taps + k.first[p] - start + t] = k.weights[p * k.taps + t];
    out.first[p] = start;
  }
}

#if LOOM_IMAGE_SSE41
// One output row of the horizontal pass, RGB: the three channels of a pixel
// are summed in one vector (a fourth lane carries the next byte and is
// dropped), with PIL's 32-bit products and rounding. Taps > 0 fixes the tap
// count at compile time; 0 reads it from `k`.
template <int Taps>
__attribute__((target("sse4.1"))) void horizontal_row_sse41(const uint8_t* row, const FixedTaps& k, int64_t width,
                                                             uint8_t* target) {
  const int64_t taps = Taps > 0 ? Taps : k.taps;
  const __m128i half = _mm_set1_epi32(int32_t{1} << (precision_bits - 1));
  for (int64_t x = 0; x < width; ++x) {
    const uint8_t* source = row + k.first[x] * 3;
    const int32_t* w = k.weights.data() + x * taps;
    __m128i sum = half;
    for (int64_t t = 0; t < taps; ++t) {
      int32_t bytes;
      std::memcpy(&bytes, source + 3 * t, 4);
      const __m128i pixel = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(bytes));
      sum = _mm_add_epi32(sum, _mm_mullo_epi32(pixel, _mm_set1_epi32(w[t])));
    }
    sum = _mm_srai_epi32(sum, precision_bits);
    // Saturating packs clamp to [0, 255] as PIL's clip8.
    const __m128i packed = _mm_packus_epi16(_mm_packs_epi32(sum, sum), sum);
    const int32_t out = _mm_cvtsi128_si32(packed);
    std::memcpy(target + 3 * x, &out, 4);  // the fourth byte is overwritten by the next pixel or lands in padding
  }
}
#endif

}  // namespace

#if LOOM_IMAGE_SSE41
bool has_sse41() {
  static const bool supported = __builtin_cpu_supports("sse4.1");
  return supported;
}

__attribute__((target("sse4.1"))) void resample_rgb_to_tensor_sse41(const uint8_t* source, int64_t stride,
                                                                    int64_t in_height, int64_t in_width,
                                                                    int64_t height, int64_t width, bool flip,
                                                                    const float* table, float* out,
                                                                    ResampleScratch& scratch) {
  const uint8_t* rows = source;
  int64_t row_stride = stride;
  if (in_width != width) {  // as PIL, only the passes whose size changes
    fixed_taps(in_width, width, scratch.horizontal);
    const int64_t row_size = width * 3;
    if (scratch.rows.size() < static_cast<size_t>(in_height * row_size + 4)) {
      scratch.rows.resize(static_cast<size_t>(in_height * row_size + 4));
    }
    void (*pass)(const uint8_t*, const FixedTaps&, int64_t, uint8_t*) = horizontal_row_sse41<0>;
    switch (scratch.horizontal.taps) {
      case 3: pass = horizontal_row_sse41<3>; break;
      case 5: pass = horizontal_row_sse41<5>; break;
      case 7: pass = horizontal_row_sse41<7>; break;
      case 9: pass = horizontal_row_sse41<9>; break;
      default: break;
    }
    for (int64_t y = 0; y < in_height; ++y) {
      pass(source + y * stride, scratch.horizontal, width, scratch.rows.data() + y * row_size);
    }
    rows = scratch.rows.data();
    row_stride = row_size;
  }
  const int64_t row_size = width * 3, plane = height * width;
  scratch.sums.resize(static_cast<size_t>(row_size));
  scratch.line.resize(static_cast<size_t>(row_size));
  int32_t* __restrict sums = scratch.sums.data();
  uint8_t* __restrict line = scratch.line.data();
  const bool vertical = in_height != height;
  if (vertical) fixed_taps(in_height, height, scratch.vertical);
  const FixedTaps& k = scratch.vertical;
  for (int64_t y = 0; y < height; ++y) {
    const uint8_t* values = rows + y * row_stride;
    if (vertical) {
      for (int64_t i = 0; i < row_size; ++i) sums[i] = int32_t{1} << (precision_bits - 1);
      for (int64_t t = 0; t < k.taps; ++t) {
        const uint8_t* __restrict input = rows + (k.first[y] + t) * row_stride;
        const int32_t weight = k.weights[y * k.taps + t];
        for (int64_t i = 0; i < row_size; ++i) sums[i] += int32_t{input[i]} * weight;
      }
      for (int64_t i = 0; i < row_size; ++i) line[i] = clip8(sums[i]);
      values = line;
    }
    float* red = out + y * width;
    float* green = red + plane;
    float* blue = green + plane;
    for (int64_t x = 0; x < width; ++x) {
      const int64_t at = flip ? width - 1 - x : x;
      red[at] = table[values[3 * x]];
      green[at] = table[256 + values[3 * x + 1]];
      blue[at] = table[512 + values[3 * x + 2]];
    }
  }
}
#endif

}  // namespace image

namespace {
using namespace image;
}  // namespace

DecodedImage resize_bilinear(const DecodedImage& image, int64_t height, int64_t width) {
  LOOM_CHECK(height > 0 && width > 0, "resize: target size ", height, "x", width, " must be positive");
  LOOM_CHECK(image.height > 0 && image.width > 0, "resize: empty image");
  // As PIL: only the passes whose size changes, horizontal first.
  if (width == image.width && height == image.height) return image;
  if (height == image.height) return resample_horizontal(image, width);
  if (width == image.width) return resample_vertical(image, height);
  return resample_vertical(resample_horizontal(image, width), height);
}

}  // namespace loom::data

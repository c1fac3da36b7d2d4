// ImageFolder: the directory walk torchvision does, JPEG (TurboJPEG API) and
// PNG (libpng's simplified API) decoding, PIL's antialiased bilinear resize,
// and the transforms applied per sample in the loader's workers.
#include <loom/data/image_folder.h>

#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>

// jpeglib.h needs FILE and size_t declared first.
#include <jpeglib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LOOM_IMAGE_SSE41 1
#endif

#include <loom/core/error.h>
#include <loom/core/generator.h>

namespace loom::data {
namespace fs = std::filesystem;

namespace {

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

bool decodable_extension(const fs::path& path) {
  const std::string extension = lower(path.extension().string());
  return extension == ".jpg" || extension == ".jpeg" || extension == ".png";
}

// The other extensions torchvision's ImageFolder takes (IMG_EXTENSIONS).
bool other_image_extension(const fs::path& path) {
  const std::string extension = lower(path.extension().string());
  for (const char* other : {".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"}) {
    if (extension == other) return true;
  }
  return false;
}

// The largest image decoded: PIL's limit (Image.MAX_IMAGE_PIXELS x 2, above
// which it raises DecompressionBombError). A header is a few bytes, so without
// a bound a small file could make a worker allocate gigabytes.
constexpr uint64_t kMaxImagePixels = 2ull * 89'478'485;

// The most memory decoding one image may take. Under PIL's pixel limit a
// 36-byte progressive JPEG header could still claim 1.6 GB (the pixels and
// libjpeg's coefficient buffer); with this bound every image within PIL's
// limit decodes except progressive JPEGs over about 90-130 million pixels.
constexpr uint64_t kMaxDecodeBytes = uint64_t{768} << 20;

// Checks the header's size against both limits; `decode_bytes` is what decoding it takes.
void check_image_size(uint64_t width, uint64_t height, uint64_t decode_bytes, const fs::path& path) {
  if (width == 0 || height == 0) LOOM_FAIL("image ", path.string(), ": its header declares an empty image");
  if (width * height > kMaxImagePixels) {
    LOOM_FAIL("image ", path.string(), ": its header declares ", width, "x", height, " pixels, over the limit of ",
              kMaxImagePixels, " (PIL's decompression-bomb limit)");
  }
  if (decode_bytes > kMaxDecodeBytes) {
    LOOM_FAIL("image ", path.string(), ": decoding its ", width, "x", height, " pixels takes ", decode_bytes >> 20,
              " MiB, over the limit of ", kMaxDecodeBytes >> 20, " MiB per image");
  }
}

// PIL's convert("L") from RGB.
void to_luma(DecodedImage& image) {
  if (image.channels == 1) return;
  const int64_t pixels = image.height * image.width;
  for (int64_t i = 0; i < pixels; ++i) {
    const uint8_t* rgb = image.pixels.data() + 3 * i;
    image.pixels[i] = static_cast<uint8_t>((rgb[0] * 19595 + rgb[1] * 38470 + rgb[2] * 7471 + 0x8000) >> 16);
  }
  image.pixels.resize(static_cast<size_t>(pixels));
  image.channels = 1;
}

// libjpeg's API, for what TurboJPEG 2 cannot do: decoding part of an image.
// Errors and warnings (TurboJPEG's TJFLAG_STOPONWARNING) jump back to the
// caller's setjmp with the message; the frames skipped are libjpeg's (C).
struct JpegError {
  jpeg_error_mgr manager;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_error_exit(j_common_ptr info) {
  JpegError* error = reinterpret_cast<JpegError*>(info->err);
  (*info->err->format_message)(info, error->message);
  std::longjmp(error->jump, 1);
}

void jpeg_emit_message(j_common_ptr info, int level) {
  if (level < 0) jpeg_error_exit(info);  // a warning: corrupt data
}

// One decompressor per thread, reused (libjpeg's pools are released by jpeg_abort_decompress).
struct JpegDecoder {
  jpeg_decompress_struct info{};
  JpegError error{};
  JpegDecoder() {
    info.err = jpeg_std_error(&error.manager);
    error.manager.error_exit = jpeg_error_exit;
    error.manager.emit_message = jpeg_emit_message;
    jpeg_create_decompress(&info);
  }
  ~JpegDecoder() { jpeg_destroy_decompress(&info); }
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;
};

JpegDecoder& thread_jpeg_decoder() {
  thread_local JpegDecoder decoder;
  return decoder;
}

// What decoding the JPEG whose header `info` holds takes, with RGB output: the
// pixels, and when its scans each carry part of the data (progressive, or
// components in separate scans) libjpeg's whole-image coefficient buffer, one
// 128-byte block per 8x8 samples of each component, rounded up to whole MCUs
// (jdcoefct.c).
uint64_t jpeg_decode_bytes(const jpeg_decompress_struct& info) {
  uint64_t bytes = uint64_t{info.image_width} * info.image_height * 3;
  if (info.progressive_mode || info.comps_in_scan < info.num_components) {
    for (int c = 0; c < info.num_components; ++c) {
      const jpeg_component_info& component = info.comp_info[c];
      const auto round_up = [](uint64_t n, uint64_t multiple) { return (n + multiple - 1) / multiple * multiple; };
      bytes += round_up(component.width_in_blocks, component.h_samp_factor) *
               round_up(component.height_in_blocks, component.v_samp_factor) * sizeof(JBLOCK);
    }
  }
  return bytes;
}

// Reads the header of `bytes` into decoder.info (image_height, image_width), then
// checks its size and color space. Throws naming `path`.
void read_jpeg_header(JpegDecoder& decoder, const std::vector<uint8_t>& bytes, const fs::path& path) {
  jpeg_decompress_struct& info = decoder.info;
  jpeg_abort_decompress(&info);  // whatever an earlier sample left
  if (setjmp(decoder.error.jump)) {
    jpeg_abort_decompress(&info);
    LOOM_FAIL("image ", path.string(), ": not a readable JPEG: ", decoder.error.message);
  }
  jpeg_mem_src(&info, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&info, TRUE);
  if (info.jpeg_color_space == JCS_CMYK || info.jpeg_color_space == JCS_YCCK) {
    jpeg_abort_decompress(&info);
    LOOM_FAIL("image ", path.string(), ": CMYK JPEGs are not supported; convert it to RGB");
  }
  check_image_size(info.image_width, info.image_height, jpeg_decode_bytes(info), path);  // the next abort resets it
  // Every 8x8 block of every component is coded in at least one bit (a 1-bit
  // Huffman code; PIL's smallest files, blank images, take two), so a file too
  // short for its blocks is truncated: refused here, before decoding
  // allocates for the whole image, rather than part-way through. The rare
  // arithmetic-coded JPEG (which no browser decodes) is held to the same bound.
  uint64_t blocks = 0;
  for (int c = 0; c < info.num_components; ++c) {
    blocks += uint64_t{info.comp_info[c].width_in_blocks} * info.comp_info[c].height_in_blocks;
  }
  if (blocks > 8 * uint64_t{bytes.size()}) {
    LOOM_FAIL("image ", path.string(), ": its header declares ", info.image_width, "x", info.image_height,
              " pixels in ", blocks, " blocks of 8x8, more than its ", bytes.size(),
              " bytes can hold (each block takes at least one bit): the file is truncated or corrupt");
  }
}

DecodedImage decode_jpeg(const std::vector<uint8_t>& bytes, const fs::path& path, ColorMode mode) {
  tjhandle handle = tjInitDecompress();
  if (!handle) LOOM_FAIL("image ", path.string(), ": cannot start the JPEG decoder: ", tjGetErrorStr2(nullptr));
  struct Release {
    tjhandle handle;
    ~Release() { tjDestroy(handle); }
  } release{handle};
  // libjpeg's header parse checks the size, the memory and the color space
  // (TurboJPEG 2 does not say whether a file is progressive).
  JpegDecoder& decoder = thread_jpeg_decoder();
  read_jpeg_header(decoder, bytes, path);
  const int width = static_cast<int>(decoder.info.image_width), height = static_cast<int>(decoder.info.image_height);
  const bool gray_file = decoder.info.jpeg_color_space == JCS_GRAYSCALE;
  jpeg_abort_decompress(&decoder.info);
  DecodedImage image;
  image.height = height;
  image.width = width;
  // A grayscale JPEG is decoded as such: converting gray to RGB and back is the identity.
  const bool gray = mode == ColorMode::grayscale && gray_file;
  image.channels = gray ? 1 : 3;
  image.pixels.resize(static_cast<size_t>(image.height * image.width * image.channels));
  if (tjDecompress2(handle, bytes.data(), static_cast<unsigned long>(bytes.size()), image.pixels.data(), width, 0,
                    height, gray ? TJPF_GRAY : TJPF_RGB, TJFLAG_STOPONWARNING) != 0) {
    LOOM_FAIL("image ", path.string(), ": JPEG data does not decode: ", tjGetErrorStr2(handle));
  }
  if (mode == ColorMode::grayscale) to_luma(image);
  return image;
}

// The window's pixels in `pixels`, rows `stride` bytes apart, starting at
// pixels.data() + offset, with at least 4 readable bytes after every pixel
// (the resampler loads 4 bytes per RGB pixel).
struct JpegWindow {
  std::vector<uint8_t> pixels;
  int64_t stride = 0;
  int64_t offset = 0;
};

// Decodes rows [top, top + height) and columns [left, left + width) after
// read_jpeg_header, with TurboJPEG's defaults (islow IDCT, fancy upsampling)
// so that the pixels are those of a full decode. libjpeg starts the decoded
// columns at an iMCU boundary and upsamples chroma with edge replication at
// the first and last decoded column and after skipped rows, so one iMCU of
// context is decoded left of, right of and above the window.
void jpeg_decode_window(JpegDecoder& decoder, const fs::path& path, int64_t top, int64_t left, int64_t height,
                        int64_t width, JpegWindow& window) {
  jpeg_decompress_struct& info = decoder.info;
  if (setjmp(decoder.error.jump)) {
    jpeg_abort_decompress(&info);
    LOOM_FAIL("image ", path.string(), ": JPEG data does not decode: ", decoder.error.message);
  }
  info.out_color_space = JCS_RGB;
  info.dct_method = JDCT_ISLOW;
  info.do_fancy_upsampling = TRUE;
  jpeg_start_decompress(&info);
  const int64_t image_width = info.output_width;
  const int64_t margin_x = int64_t{info.max_h_samp_factor} * DCTSIZE, margin_y = int64_t{info.max_v_samp_factor} * DCTSIZE;
  const int64_t x0 = std::max<int64_t>(0, left - margin_x), x1 = std::min(image_width, left + width + margin_x);
  // Rows below the window need no margin: libjpeg decodes the chroma context below a row before it returns it.
  const int64_t y0 = std::max<int64_t>(0, top - margin_y), y1 = top + height;
  JDIMENSION crop_x = static_cast<JDIMENSION>(x0), crop_width = static_cast<JDIMENSION>(x1 - x0);
  if (crop_width < image_width) jpeg_crop_scanline(&info, &crop_x, &crop_width);
  const int64_t decoded_width = info.output_width;  // crop_width, widened to iMCU boundaries
  window.stride = decoded_width * 3;
  window.offset = (top - y0) * window.stride + (left - static_cast<int64_t>(crop_x)) * 3;
  if (window.pixels.size() < static_cast<size_t>((y1 - y0) * window.stride + 16)) {
    window.pixels.resize(static_cast<size_t>((y1 - y0) * window.stride + 16));
  }
  if (y0 > 0) jpeg_skip_scanlines(&info, static_cast<JDIMENSION>(y0));
  while (static_cast<int64_t>(info.output_scanline) < y1) {
    JSAMPROW row = window.pixels.data() + (static_cast<int64_t>(info.output_scanline) - y0) * window.stride;
    jpeg_read_scanlines(&info, &row, 1);
  }
  jpeg_abort_decompress(&info);  // the rows below are not needed
}

DecodedImage decode_png(const std::vector<uint8_t>& bytes, const fs::path& path, ColorMode mode) {
  png_image png{};
  png.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&png, bytes.data(), bytes.size())) {
    LOOM_FAIL("image ", path.string(), ": not a readable PNG: ", png.message);
  }
  struct Release {
    png_image& png;
    ~Release() { png_image_free(&png); }
  } release{png};
  const bool gray = mode == ColorMode::grayscale && (png.format & PNG_FORMAT_FLAG_COLOR) == 0;
  // The alpha channel is dropped as PIL's convert("RGB") drops it: read it, then discard it.
  const bool alpha = (png.format & PNG_FORMAT_FLAG_ALPHA) != 0;
  png.format = gray ? (alpha ? PNG_FORMAT_GA : PNG_FORMAT_GRAY) : (alpha ? PNG_FORMAT_RGBA : PNG_FORMAT_RGB);
  const int64_t stored = PNG_IMAGE_PIXEL_CHANNELS(png.format);
  check_image_size(png.width, png.height, uint64_t{png.width} * png.height * stored, path);
  DecodedImage image;
  image.height = png.height;
  image.width = png.width;
  image.channels = gray ? 1 : 3;
  const int64_t pixels = image.height * image.width;
  // Decoded with the alpha channel, if any, which is then dropped in place
  // (each pixel moves to a lower offset): one buffer, not two.
  image.pixels.resize(static_cast<size_t>(pixels * stored));
  if (!png_image_finish_read(&png, nullptr, image.pixels.data(), 0, nullptr)) {
    LOOM_FAIL("image ", path.string(), ": PNG data does not decode: ", png.message);
  }
  if (stored != image.channels) {
    for (int64_t i = 0; i < pixels; ++i) {
      for (int64_t c = 0; c < image.channels; ++c) image.pixels[i * image.channels + c] = image.pixels[i * stored + c];
    }
    image.pixels.resize(static_cast<size_t>(pixels * image.channels));
  }
  if (mode == ColorMode::grayscale) to_luma(image);
  return image;
}

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

// The window [top, top + height) x [left, left + width), zero outside the image.
DecodedImage crop(const DecodedImage& in, int64_t top, int64_t left, int64_t height, int64_t width) {
  DecodedImage out{height, width, in.channels, std::vector<uint8_t>(static_cast<size_t>(height * width * in.channels))};
  for (int64_t y = 0; y < height; ++y) {
    const int64_t source_y = top + y;
    if (source_y < 0 || source_y >= in.height) continue;
    for (int64_t x = 0; x < width; ++x) {
      const int64_t source_x = left + x;
      if (source_x < 0 || source_x >= in.width) continue;
      std::copy_n(in.pixels.data() + (source_y * in.width + source_x) * in.channels, in.channels,
                  out.pixels.data() + (y * width + x) * in.channels);
    }
  }
  return out;
}

DecodedImage flip_horizontal(const DecodedImage& in) {
  DecodedImage out = in;
  for (int64_t y = 0; y < in.height; ++y) {
    for (int64_t x = 0; x < in.width; ++x) {
      std::copy_n(in.pixels.data() + (y * in.width + x) * in.channels, in.channels,
                  out.pixels.data() + (y * in.width + (in.width - 1 - x)) * in.channels);
    }
  }
  return out;
}

// PIL's coefficients with the same number of taps at every output position:
// a range that would pass the end of the input is moved left and its weights
// with it (the taps added weigh zero), so that the inner loops have a fixed
// length. The sums are PIL's: only zero terms are added.
struct FixedTaps {
  int64_t taps = 0;
  std::vector<int64_t> first;    // (out)
  std::vector<int32_t> weights;  // (out, taps)
};

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

// Per worker thread, so that no sample allocates once the sizes have been seen.
struct ResampleScratch {
  FixedTaps horizontal, vertical;
  std::vector<uint8_t> rows;  // the horizontal pass's output, 8-bit as in PIL
  std::vector<int32_t> sums;
  std::vector<uint8_t> line;
};

#if LOOM_IMAGE_SSE41
bool has_sse41() {
  static const bool supported = __builtin_cpu_supports("sse4.1");
  return supported;
}

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

// Resizes the RGB window `source` (rows `stride` bytes apart, 4 bytes readable
// after each pixel) to height x width as resize_bilinear does, then flips it
// if asked and writes ToTensor + Normalize through `table` into (3, height,
// width) floats.
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

// Python's round(): halves to even.
int64_t round_half_even(double value) { return static_cast<int64_t>(std::nearbyint(value)); }

// torchvision's RandomResizedCrop.get_params: (top, left, height, width).
std::array<int64_t, 4> random_resized_window(const RandomResizedCrop& spec, int64_t height, int64_t width,
                                             Generator& random) {
  const double area = static_cast<double>(height * width);
  const double log_min = std::log(spec.ratio_min), log_max = std::log(spec.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * random.uniform(spec.scale_min, spec.scale_max);
    const double aspect = std::exp(random.uniform(log_min, log_max));
    const int64_t w = round_half_even(std::sqrt(target_area * aspect));
    const int64_t h = round_half_even(std::sqrt(target_area / aspect));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      const int64_t top = static_cast<int64_t>(random.below(static_cast<uint64_t>(height - h + 1)));
      const int64_t left = static_cast<int64_t>(random.below(static_cast<uint64_t>(width - w + 1)));
      return {top, left, h, w};
    }
  }
  // Fallback: the centre crop of the nearest allowed aspect ratio.
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  int64_t w = width, h = height;
  if (in_ratio < spec.ratio_min) {
    h = round_half_even(static_cast<double>(width) / spec.ratio_min);
  } else if (in_ratio > spec.ratio_max) {
    w = round_half_even(static_cast<double>(height) * spec.ratio_max);
  }
  return {(height - h) / 2, (width - w) / 2, h, w};
}

bool is_jpeg(const std::vector<uint8_t>& bytes) {
  return bytes.size() >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF;
}

std::vector<uint8_t> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) LOOM_FAIL("image ", path.string(), " cannot be opened");
  const std::streamsize size = in.tellg();
  std::vector<uint8_t> bytes(static_cast<size_t>(std::max<std::streamsize>(size, 0)));
  in.seekg(0);
  if (size < 0 || !in.read(reinterpret_cast<char*>(bytes.data()), size)) {
    LOOM_FAIL("image ", path.string(), ": reading failed");
  }
  return bytes;
}

}  // namespace

DecodedImage decode_image(const std::vector<uint8_t>& bytes, const fs::path& path, ColorMode mode) {
  if (is_jpeg(bytes)) {
    return decode_jpeg(bytes, path, mode);
  }
  static constexpr uint8_t png_signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (bytes.size() >= 8 && std::equal(png_signature, png_signature + 8, bytes.begin())) {
    return decode_png(bytes, path, mode);
  }
  LOOM_FAIL("image ", path.string(), ": neither a JPEG nor a PNG (its first bytes match neither signature)");
}

DecodedImage read_image(const fs::path& path, ColorMode mode) { return decode_image(read_file(path), path, mode); }

DecodedImage decode_jpeg_window(const std::vector<uint8_t>& bytes, const fs::path& path, int64_t top, int64_t left,
                                int64_t height, int64_t width) {
  if (!is_jpeg(bytes)) LOOM_FAIL("image ", path.string(), ": not a JPEG (its first bytes are not FF D8 FF)");
  JpegDecoder& decoder = thread_jpeg_decoder();
  read_jpeg_header(decoder, bytes, path);
  const int64_t image_height = decoder.info.image_height, image_width = decoder.info.image_width;
  if (top < 0 || left < 0 || height <= 0 || width <= 0 || top + height > image_height || left + width > image_width) {
    jpeg_abort_decompress(&decoder.info);
    LOOM_FAIL("image ", path.string(), ": the window ", height, "x", width, " at (", top, ", ", left,
              ") is not inside the ", image_height, "x", image_width, " image");
  }
  JpegWindow window;
  jpeg_decode_window(decoder, path, top, left, height, width, window);
  DecodedImage image{height, width, 3, std::vector<uint8_t>(static_cast<size_t>(height * width * 3))};
  for (int64_t y = 0; y < height; ++y) {
    std::copy_n(window.pixels.data() + window.offset + y * window.stride, width * 3, image.pixels.data() + y * width * 3);
  }
  return image;
}

DecodedImage resize_bilinear(const DecodedImage& image, int64_t height, int64_t width) {
  LOOM_CHECK(height > 0 && width > 0, "resize: target size ", height, "x", width, " must be positive");
  LOOM_CHECK(image.height > 0 && image.width > 0, "resize: empty image");
  // As PIL: only the passes whose size changes, horizontal first.
  if (width == image.width && height == image.height) return image;
  if (height == image.height) return resample_horizontal(image, width);
  if (width == image.width) return resample_vertical(image, height);
  return resample_vertical(resample_horizontal(image, width), height);
}

Normalize imagenet_normalize() { return {{0.485, 0.456, 0.406}, {0.229, 0.224, 0.225}}; }

std::vector<ImageTransform> imagenet_train_transforms(int64_t size) {
  return {RandomResizedCrop{size}, RandomHorizontalFlip{}, ToTensor{}, imagenet_normalize()};
}

std::vector<ImageTransform> imagenet_test_transforms(int64_t size) {
  return {Resize{size * 8 / 7}, CenterCrop{size}, ToTensor{}, imagenet_normalize()};
}

ImageFolderIndex index_image_folder(const fs::path& root) {
  if (!fs::is_directory(root)) LOOM_FAIL("image folder ", root.string(), " does not exist or is not a directory");
  ImageFolderIndex index;
  for (const fs::directory_entry& entry : fs::directory_iterator(root)) {
    if (entry.is_directory()) index.classes.push_back(entry.path().filename().string());
  }
  std::sort(index.classes.begin(), index.classes.end());
  if (index.classes.empty()) {
    LOOM_FAIL("image folder ", root.string(), " has no class directories; expected ", root.string(),
              "/<class>/<image>.jpg|jpeg|png as torchvision's ImageFolder reads");
  }
  for (size_t label = 0; label < index.classes.size(); ++label) {
    // os.walk(followlinks=True) sorted by directory path, each directory's files sorted by name.
    const fs::path class_dir = root / index.classes[label];
    std::vector<std::string> directories = {class_dir.string()};
    for (const fs::directory_entry& entry :
         fs::recursive_directory_iterator(class_dir, fs::directory_options::follow_directory_symlink)) {
      if (entry.is_directory()) directories.push_back(entry.path().string());
    }
    std::sort(directories.begin(), directories.end());
    const size_t before = index.files.size();
    for (const std::string& directory : directories) {
      std::vector<std::string> names;
      for (const fs::directory_entry& entry : fs::directory_iterator(directory)) {
        if (entry.is_directory()) continue;
        if (other_image_extension(entry.path())) {
          LOOM_FAIL("image folder ", root.string(), ": ", entry.path().string(),
                    " is an image torchvision would read but loom decodes only JPEG and PNG; convert or move it, so "
                    "that sample indices match torchvision's");
        }
        if (decodable_extension(entry.path())) names.push_back(entry.path().filename().string());
      }
      std::sort(names.begin(), names.end());
      for (const std::string& name : names) {
        index.files.push_back(fs::path(directory) / name);
        index.labels.push_back(static_cast<int64_t>(label));
      }
    }
    if (index.files.size() == before) {
      LOOM_FAIL("image folder ", root.string(), ": class directory ", index.classes[label],
                " holds no .jpg, .jpeg or .png file (torchvision's ImageFolder refuses empty classes too)");
    }
  }
  return index;
}

bool is_image_folder(const fs::path& root) {
  std::error_code error;
  if (!fs::is_directory(root, error)) return false;
  for (const fs::directory_entry& entry : fs::directory_iterator(root, error)) {
    if (!entry.is_directory()) continue;
    for (const fs::directory_entry& file : fs::directory_iterator(entry.path(), error)) {
      if (decodable_extension(file.path())) return true;
    }
  }
  return false;
}

ImageFolder::ImageFolder(const fs::path& root, ImageFolderOptions options)
    : root_(root), index_(index_image_folder(root)), options_(std::move(options)) {
  shape_.channels = options_.color == ColorMode::rgb ? 3 : 1;
  bool seen_to_tensor = false;
  int64_t size_height = 0, size_width = 0;  // the fixed output size, once a transform sets one
  mean_.assign(static_cast<size_t>(shape_.channels), 0.0f);
  std_.assign(static_cast<size_t>(shape_.channels), 1.0f);
  for (const ImageTransform& transform : options_.transforms) {
    const bool after_tensor = seen_to_tensor && !std::holds_alternative<Normalize>(transform);
    LOOM_CHECK(!after_tensor, "ImageFolder transforms: only Normalize may follow ToTensor");
    if (const auto* resize = std::get_if<Resize>(&transform)) {
      LOOM_CHECK(resize->size > 0 && resize->width >= 0, "ImageFolder transforms: Resize(", resize->size, ", ",
                 resize->width, ") needs positive sizes");
      size_height = resize->width > 0 ? resize->size : 0;
      size_width = resize->width;
    } else if (const auto* center = std::get_if<CenterCrop>(&transform)) {
      LOOM_CHECK(center->size > 0, "ImageFolder transforms: CenterCrop size ", center->size, " must be positive");
      size_height = size_width = center->size;
    } else if (const auto* random_crop = std::get_if<RandomResizedCrop>(&transform)) {
      LOOM_CHECK(random_crop->size > 0 && random_crop->scale_min > 0 && random_crop->scale_min <= random_crop->scale_max &&
                     random_crop->scale_max <= 1 && random_crop->ratio_min > 0 &&
                     random_crop->ratio_min <= random_crop->ratio_max,
                 "ImageFolder transforms: RandomResizedCrop(", random_crop->size, ", scale=(", random_crop->scale_min,
                 ", ", random_crop->scale_max, "), ratio=(", random_crop->ratio_min, ", ", random_crop->ratio_max,
                 ")) is out of range");
      size_height = size_width = random_crop->size;
    } else if (const auto* flip = std::get_if<RandomHorizontalFlip>(&transform)) {
      LOOM_CHECK(flip->probability >= 0 && flip->probability <= 1, "ImageFolder transforms: RandomHorizontalFlip ",
                 "probability ", flip->probability, " must be in [0, 1]");
    } else if (std::holds_alternative<ToTensor>(transform)) {
      seen_to_tensor = true;
    } else if (const auto* normalize = std::get_if<Normalize>(&transform)) {
      LOOM_CHECK(seen_to_tensor, "ImageFolder transforms: Normalize must come after ToTensor");
      const size_t n = normalize->mean.size();
      LOOM_CHECK(n == normalize->std.size() && (n == 1 || n == static_cast<size_t>(shape_.channels)),
                 "ImageFolder transforms: Normalize has ", n, " means and ", normalize->std.size(),
                 " standard deviations for ", shape_.channels, "-channel images");
      for (int64_t c = 0; c < shape_.channels; ++c) {
        const size_t k = n == 1 ? 0 : static_cast<size_t>(c);
        LOOM_CHECK(normalize->std[k] != 0.0, "ImageFolder transforms: Normalize standard deviation is zero");
        mean_[c] = static_cast<float>(normalize->mean[k]);
        std_[c] = static_cast<float>(normalize->std[k]);
      }
    }
  }
  LOOM_CHECK(seen_to_tensor, "ImageFolder transforms: ToTensor is needed (the loader produces floating-point batches)");
  LOOM_CHECK(size_height > 0 && size_width > 0,
             "ImageFolder transforms: images of different sizes cannot share a batch; end the geometric transforms "
             "with CenterCrop(size), RandomResizedCrop(size) or Resize(height, width)");
  shape_.height = size_height;
  shape_.width = size_width;
  tensor_table_.resize(static_cast<size_t>(shape_.channels * 256));
  for (int64_t c = 0; c < shape_.channels; ++c) {
    // ToTensor then Normalize in f32, as torchvision computes them.
    for (int v = 0; v < 256; ++v) tensor_table_[c * 256 + v] = (static_cast<float>(v) / 255.0f - mean_[c]) / std_[c];
  }
  // torchvision's training pipeline on RGB gets the fused path (get_random_resized_crop).
  const std::vector<ImageTransform>& t = options_.transforms;
  size_t at = 0;
  if (options_.color == ColorMode::rgb && at < t.size() && std::holds_alternative<RandomResizedCrop>(t[at])) {
    const RandomResizedCrop crop_spec = std::get<RandomResizedCrop>(t[at++]);
    std::optional<double> flip;
    if (at < t.size() && std::holds_alternative<RandomHorizontalFlip>(t[at])) {
      flip = std::get<RandomHorizontalFlip>(t[at++]).probability;
    }
    if (at < t.size() && std::holds_alternative<ToTensor>(t[at])) {
      ++at;
      if (at < t.size() && std::holds_alternative<Normalize>(t[at])) ++at;
      if (at == t.size()) {
        crop_pipeline_ = crop_spec;
        flip_probability_ = flip;
      }
    }
  }
}

DecodedImage ImageFolder::transform_pixels(DecodedImage image, Generator& random) const {
  for (const ImageTransform& transform : options_.transforms) {
    if (const auto* resize = std::get_if<Resize>(&transform)) {
      if (resize->width > 0) {
        image = resize_bilinear(image, resize->size, resize->width);
      } else {
        const int64_t short_side = std::min(image.height, image.width), long_side = std::max(image.height, image.width);
        const int64_t new_long = resize->size * long_side / short_side;  // int(size * long / short)
        const bool portrait = image.height >= image.width;
        if (short_side != resize->size) {
          image = resize_bilinear(image, portrait ? new_long : resize->size, portrait ? resize->size : new_long);
        }
      }
    } else if (const auto* center = std::get_if<CenterCrop>(&transform)) {
      // torchvision pads a smaller image ((size - side) // 2 before), then crops round((side - size) / 2).
      const int64_t s = center->size;
      const int64_t pad_top = image.height < s ? (s - image.height) / 2 : 0;
      const int64_t pad_left = image.width < s ? (s - image.width) / 2 : 0;
      const int64_t padded_height = std::max(image.height, s), padded_width = std::max(image.width, s);
      const int64_t top = round_half_even(static_cast<double>(padded_height - s) / 2.0) - pad_top;
      const int64_t left = round_half_even(static_cast<double>(padded_width - s) / 2.0) - pad_left;
      image = crop(image, top, left, s, s);
    } else if (const auto* random_crop = std::get_if<RandomResizedCrop>(&transform)) {
      const auto [top, left, h, w] = random_resized_window(*random_crop, image.height, image.width, random);
      image = resize_bilinear(crop(image, top, left, h, w), random_crop->size, random_crop->size);
    } else if (const auto* flip = std::get_if<RandomHorizontalFlip>(&transform)) {
      if (random.uniform() < flip->probability) image = flip_horizontal(image);
    }
  }
  return image;
}

void ImageFolder::write_sample(const DecodedImage& image, SampleSlot& slot) const {
  LOOM_CHECK(image.height == shape_.height && image.width == shape_.width && image.channels == shape_.channels,
             "ImageFolder: a transformed image of ", image.height, "x", image.width, "x", image.channels,
             " does not match the sample shape");
  const int64_t plane = shape_.height * shape_.width;
  for (int64_t c = 0; c < shape_.channels; ++c) {
    const float* table = tensor_table_.data() + c * 256;
    float* out = slot.pixels + c * plane;
    const uint8_t* in = image.pixels.data() + c;
    for (int64_t i = 0; i < plane; ++i) out[i] = table[in[i * shape_.channels]];
  }
}

void ImageFolder::get_random_resized_crop(const std::vector<uint8_t>& bytes, const fs::path& path,
                                          SampleSlot& slot) const {
  thread_local JpegWindow jpeg_window;
  const bool jpeg = is_jpeg(bytes);
  JpegDecoder* decoder = nullptr;
  DecodedImage whole;  // a PNG, decoded in full
  int64_t image_height = 0, image_width = 0;
  if (jpeg) {
    decoder = &thread_jpeg_decoder();
    read_jpeg_header(*decoder, bytes, path);
    image_height = decoder->info.image_height;
    image_width = decoder->info.image_width;
  } else {
    whole = decode_image(bytes, path, ColorMode::rgb);
    image_height = whole.height;
    image_width = whole.width;
  }
  // The draws in transform_pixels' order: the window, then the flip.
  const auto [top, left, height, width] = random_resized_window(*crop_pipeline_, image_height, image_width, *slot.random);
  const bool flip = flip_probability_ && slot.random->uniform() < *flip_probability_;
  const uint8_t* window = nullptr;
  int64_t stride = 0;
  if (jpeg) {
    jpeg_decode_window(*decoder, path, top, left, height, width, jpeg_window);
    window = jpeg_window.pixels.data() + jpeg_window.offset;
    stride = jpeg_window.stride;
  } else {
    whole.pixels.resize(whole.pixels.size() + 4);  // the resampler reads 4 bytes per pixel
    window = whole.pixels.data() + (top * image_width + left) * 3;
    stride = image_width * 3;
  }
#if LOOM_IMAGE_SSE41
  if (has_sse41()) {
    thread_local ResampleScratch scratch;
    resample_rgb_to_tensor_sse41(window, stride, height, width, shape_.height, shape_.width, flip,
                                 tensor_table_.data(), slot.pixels, scratch);
    return;
  }
#endif
  DecodedImage cropped{height, width, 3, std::vector<uint8_t>(static_cast<size_t>(height * width * 3))};
  for (int64_t y = 0; y < height; ++y) {
    std::copy_n(window + y * stride, width * 3, cropped.pixels.data() + y * width * 3);
  }
  DecodedImage resized = resize_bilinear(cropped, shape_.height, shape_.width);
  write_sample(flip ? flip_horizontal(resized) : resized, slot);
}

int64_t ImageFolder::get(int64_t index, SampleSlot& slot) const {
  LOOM_CHECK(index >= 0 && index < size(), name(), ": sample index ", index, " is out of range for ", size(),
             " images");
  for (int64_t attempt = 0; attempt < size(); ++attempt) {
    const int64_t candidate = (index + attempt) % size();
    const fs::path& file = index_.files[candidate];
    DecodedImage decoded;
    const Generator before = *slot.random;
    try {
      if (crop_pipeline_) {
        get_random_resized_crop(read_file(file), file, slot);
        return index_.labels[candidate];
      }
      decoded = read_image(file, options_.color);
    } catch (const Error& error) {
      if (options_.on_error == OnDecodeError::fail) throw;
      *slot.random = before;  // the replacement draws as if this file had not been read
      static std::mutex reported_mutex;
      static std::set<std::string> reported;
      std::lock_guard lock(reported_mutex);
      if (reported.insert(index_.files[candidate].string()).second) {
        std::fprintf(stderr, "warning: skipping %s\n", error.what());
      }
      ++skipped_;
      continue;
    }
    write_sample(transform_pixels(std::move(decoded), *slot.random), slot);
    return index_.labels[candidate];
  }
  LOOM_FAIL(name(), ": no image decodes");
}

}  // namespace loom::data

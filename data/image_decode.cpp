// Reading image files and decoding them as PIL does, within its size limits:
// JPEG (TurboJPEG's API, and libjpeg's for a window of the image) and PNG (libpng's simplified API).
#include <loom/data/image_internal.h>

#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <fstream>

#include <loom/core/error.h>
#include <loom/data/input_file.h>

namespace loom::data {
namespace fs = std::filesystem;

namespace image {

namespace {

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

void jpeg_error_exit(j_common_ptr info) {
  JpegError* error = reinterpret_cast<JpegError*>(info->err);
  (*info->err->format_message)(info, error->message);
  std::longjmp(error->jump, 1);
}

void jpeg_emit_message(j_common_ptr info, int level) {
  if (level < 0) jpeg_error_exit(info);  // a warning: corrupt data
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

}  // namespace

JpegDecoder::JpegDecoder() {
  info.err = jpeg_std_error(&error.manager);
  error.manager.error_exit = jpeg_error_exit;
  error.manager.emit_message = jpeg_emit_message;
  jpeg_create_decompress(&info);
}

JpegDecoder::~JpegDecoder() { jpeg_destroy_decompress(&info); }

JpegDecoder& thread_jpeg_decoder() {
  thread_local JpegDecoder decoder;
  return decoder;
}

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

bool is_jpeg(const std::vector<uint8_t>& bytes) {
  return bytes.size() >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF;
}

std::vector<uint8_t> read_file(const fs::path& path) {
  InputFile file(path, "image");  // refuses a FIFO or device named like an image, which would block
  // No image loom decodes needs a file larger than its decoded size: a bigger
  // one is refused before it is read, keeping a stray huge file from costing its size in memory.
  if (file.size() > kMaxDecodeBytes) {
    LOOM_FAIL("image ", path.string(), " has ", file.size(), " bytes, over the limit of ", kMaxDecodeBytes >> 20,
              " MiB per image file");
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(file.size()));
  if (file.read(bytes.data(), bytes.size()) != bytes.size()) {
    LOOM_FAIL("image ", path.string(), ": reading failed (the file shrank while it was read)");
  }
  return bytes;
}

namespace {

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

}  // namespace

}  // namespace image

namespace {
using namespace image;
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

}  // namespace loom::data

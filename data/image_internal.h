// Internals of ImageFolder (data/image_folder.cpp), by seam: reading and
// decoding image files (image_decode.cpp) and PIL's bilinear resampling
// (image_resample.cpp). Not part of loom's API.
#pragma once

#include <csetjmp>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <vector>

// jpeglib.h needs FILE and size_t declared first.
#include <jpeglib.h>

#if defined(__x86_64__) || defined(__i386__)
#define LOOM_IMAGE_SSE41 1
#endif

#include <loom/data/image_folder.h>

namespace loom::data::image {

// ---- files and decoding (image_decode.cpp) ----

// True when `bytes` start with a JPEG's signature (FF D8 FF).
bool is_jpeg(const std::vector<uint8_t>& bytes);
// The whole file. Throws naming `path` when it cannot be opened or read.
std::vector<uint8_t> read_file(const std::filesystem::path& path);

// libjpeg's API, for what TurboJPEG 2 cannot do: decoding part of an image.
// Errors and warnings (TurboJPEG's TJFLAG_STOPONWARNING) jump back to the
// caller's setjmp with the message; the frames skipped are libjpeg's (C).
struct JpegError {
  jpeg_error_mgr manager;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

// One decompressor per thread, reused (libjpeg's pools are released by jpeg_abort_decompress).
struct JpegDecoder {
  jpeg_decompress_struct info{};
  JpegError error{};
  JpegDecoder();
  ~JpegDecoder();
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;
};

// This thread's decoder.
JpegDecoder& thread_jpeg_decoder();

// Reads the header of `bytes` into decoder.info (image_height, image_width), then
// checks its size and color space. Throws naming `path`.
void read_jpeg_header(JpegDecoder& decoder, const std::vector<uint8_t>& bytes, const std::filesystem::path& path);

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
void jpeg_decode_window(JpegDecoder& decoder, const std::filesystem::path& path, int64_t top, int64_t left,
                        int64_t height, int64_t width, JpegWindow& window);

// ---- resampling (image_resample.cpp) ----

// PIL's coefficients with the same number of taps at every output position:
// a range that would pass the end of the input is moved left and its weights
// with it (the taps added weigh zero), so that the inner loops have a fixed
// length. The sums are PIL's: only zero terms are added.
struct FixedTaps {
  int64_t taps = 0;
  std::vector<int64_t> first;    // (out)
  std::vector<int32_t> weights;  // (out, taps)
};

// Per worker thread, so that no sample allocates once the sizes have been seen.
struct ResampleScratch {
  FixedTaps horizontal, vertical;
  std::vector<uint8_t> rows;  // the horizontal pass's output, 8-bit as in PIL
  std::vector<int32_t> sums;
  std::vector<uint8_t> line;
};

#if LOOM_IMAGE_SSE41
// True when this CPU runs SSE4.1 (resample_rgb_to_tensor_sse41).
bool has_sse41();

// Resizes the RGB window `source` (rows `stride` bytes apart, 4 bytes readable
// after each pixel) to height x width as resize_bilinear does, then flips it
// if asked and writes ToTensor + Normalize through `table` into (3, height,
// width) floats.
__attribute__((target("sse4.1"))) void resample_rgb_to_tensor_sse41(const uint8_t* source, int64_t stride,
                                                                    int64_t in_height, int64_t in_width,
                                                                    int64_t height, int64_t width, bool flip,
                                                                    const float* table, float* out,
                                                                    ResampleScratch& scratch);
#endif

}  // namespace loom::data::image

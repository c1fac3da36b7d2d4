// Fuzzes ImageFolder's decoding of one file (data/image_folder: JPEG through
// libjpeg-turbo, PNG through libpng): the first byte picks RGB or grayscale,
// the rest is the file. Only loom::Error may come out, and a decoded image
// must hold height x width x channels pixels.
#include <cstdlib>
#include <vector>

#include <loom/core/error.h>
#include <loom/data/image_folder.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const auto mode = (data[0] & 1) ? loom::data::ColorMode::grayscale : loom::data::ColorMode::rgb;
  const std::vector<uint8_t> bytes(data + 1, data + size);
  try {
    const loom::data::DecodedImage image = loom::data::decode_image(bytes, "fuzz.img", mode);
    const int64_t expected_channels = mode == loom::data::ColorMode::grayscale ? 1 : 3;
    if (image.height <= 0 || image.width <= 0 || image.channels != expected_channels ||
        image.pixels.size() != static_cast<size_t>(image.height * image.width * image.channels))
      std::abort();
  } catch (const loom::Error&) {
  }
  return 0;
}

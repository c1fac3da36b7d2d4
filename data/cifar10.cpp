// CIFAR-10 binary reader and writer, and the synthetic generator.
#include <loom/data/cifar10.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <string>

#include <loom/core/error.h>
#include <loom/core/generator.h>
#include <loom/data/input_file.h>
#include <loom/data/pickle.h>

namespace loom::data {
namespace fs = std::filesystem;

namespace {

constexpr int64_t image_bytes = cifar10_record_bytes - 1;
constexpr std::array<const char*, 10> class_names = {"airplane", "automobile", "bird", "cat",  "deer",
                                                     "dog",      "frog",       "horse", "ship", "truck"};

// The batch file names of one layout.
std::vector<std::string> batch_names(Cifar10Layout layout) {
  const char* suffix = layout == Cifar10Layout::binary ? ".bin" : "";
  std::vector<std::string> names;
  for (int i = 1; i <= 5; ++i) names.push_back(str("data_batch_", i, suffix));
  names.push_back(str("test_batch", suffix));
  return names;
}

std::vector<fs::path> candidate_directories(const fs::path& directory) {
  return {directory, directory / "cifar-10-batches-bin", directory / "cifar-10-batches-py"};
}

std::string missing_files(const fs::path& directory, Cifar10Layout layout) {
  std::string missing;
  for (const std::string& name : batch_names(layout)) {
    if (!fs::is_regular_file(directory / name)) missing += str(missing.empty() ? "" : ", ", name);
  }
  return missing;
}

// The labels of a batch: a list of ints (the CIFAR files) or a 1-D integer array.
std::vector<int64_t> labels_of(const pickle::Value& value, const fs::path& path) {
  std::vector<int64_t> labels;
  if (const auto* list = std::get_if<pickle::List>(&value.content)) {
    for (const pickle::ValuePtr& item : list->items) {
      const int64_t* label = std::get_if<int64_t>(&item->content);
      if (!label) LOOM_FAIL("CIFAR-10 file ", path.string(), ": \"labels\" holds something that is not an int");
      labels.push_back(*label);
    }
    return labels;
  }
  const auto* array = std::get_if<pickle::Array>(&value.content);
  if (!array || array->shape.size() != 1 || (array->dtype.type[0] != 'i' && array->dtype.type[0] != 'u')) {
    LOOM_FAIL("CIFAR-10 file ", path.string(), ": \"labels\" is not a list of ints or a 1-D integer array");
  }
  const int64_t size = array->dtype.item_size;
  const bool is_signed = array->dtype.type[0] == 'i';
  for (int64_t i = 0; i < array->shape[0]; ++i) {
    uint64_t bits = 0;
    std::memcpy(&bits, array->data.data() + i * size, static_cast<size_t>(size));  // little-endian host
    if (is_signed && size < 8 && (bits >> (8 * size - 1)) != 0) bits |= ~uint64_t{0} << (8 * size);
    labels.push_back(static_cast<int64_t>(bits));
  }
  return labels;
}

}  // namespace

std::optional<Cifar10Location> find_cifar10(const fs::path& directory) {
  for (const Cifar10Layout layout : {Cifar10Layout::binary, Cifar10Layout::python}) {
    for (const fs::path& candidate : candidate_directories(directory)) {
      if (missing_files(candidate, layout).empty()) return Cifar10Location{candidate, layout};
    }
  }
  return std::nullopt;
}

ImageDataset read_cifar10_pickle_files(const std::vector<fs::path>& paths, const std::string& name) {
  std::vector<uint8_t> pixels;
  std::vector<int64_t> labels;
  for (const fs::path& path : paths) {
    const pickle::Value batch = pickle::load(path);
    const auto* dict = std::get_if<pickle::Dict>(&batch.content);
    if (!dict) LOOM_FAIL("CIFAR-10 file ", path.string(), " holds a pickled value that is not a dict");
    const auto data = dict->find("data");
    auto label_entry = dict->find("labels");
    if (data == dict->end() || label_entry == dict->end()) {
      LOOM_FAIL("CIFAR-10 file ", path.string(), " has no \"data\" or no \"labels\" entry",
                dict->count("label_names") != 0 ? " (it looks like batches.meta)" : "");
    }
    const auto* array = std::get_if<pickle::Array>(&data->second->content);
    if (!array || array->dtype.type != "u1" || array->shape.empty()) {
      LOOM_FAIL("CIFAR-10 file ", path.string(), ": \"data\" is not a uint8 numpy array");
    }
    const std::vector<int64_t> file_labels = labels_of(*label_entry->second, path);
    const auto count = static_cast<int64_t>(file_labels.size());
    if (count == 0) {
      LOOM_FAIL("CIFAR-10 file ", path.string(), " holds no images; expected at least one (",
                cifar10_official_batch_images, " in the official batches)");
    }
    if (array->shape[0] != count || static_cast<int64_t>(array->data.size()) != count * image_bytes) {
      LOOM_FAIL("CIFAR-10 file ", path.string(), ": \"data\" has ", array->data.size(), " bytes for ", count,
                " labels; expected ", count, " x ", image_bytes, " (3x32x32 pixels per image)");
    }
    for (int64_t r = 0; r < count; ++r) {
      if (file_labels[r] < 0 || file_labels[r] >= cifar10_classes) {
        LOOM_FAIL("CIFAR-10 file ", path.string(), ": image ", r, " has label ", file_labels[r],
                  "; labels must be 0..9");
      }
    }
    labels.insert(labels.end(), file_labels.begin(), file_labels.end());
    pixels.insert(pixels.end(), array->data.begin(), array->data.end());
  }
  return ImageDataset(cifar10_channels, cifar10_side, cifar10_side, std::move(pixels), std::move(labels), name);
}


ImageDataset read_cifar10_files(const std::vector<fs::path>& paths, const std::string& name) {
  std::vector<int64_t> counts;
  int64_t count = 0;
  for (const fs::path& path : paths) {
    const uint64_t bytes = InputFile(path, "CIFAR-10 file").size();
    // An empty or cut file would otherwise give fewer images without a word.
    if (bytes == 0 || bytes % cifar10_record_bytes != 0) {
      LOOM_FAIL("CIFAR-10 file ", path.string(), " has ", bytes, " bytes; expected a multiple of ",
                cifar10_record_bytes, " above zero (a label byte and 3x32x32 pixels per image; the official batches hold ",
                cifar10_official_batch_images, " images, ", cifar10_official_batch_images * cifar10_record_bytes,
                " bytes)");
    }
    counts.push_back(static_cast<int64_t>(bytes / cifar10_record_bytes));
    count += counts.back();
  }
  std::vector<uint8_t> pixels(static_cast<size_t>(count * image_bytes));
  std::vector<int64_t> labels(static_cast<size_t>(count));

  int64_t sample = 0;
  std::vector<uint8_t> records;
  for (size_t f = 0; f < paths.size(); ++f) {
    InputFile in(paths[f], "CIFAR-10 file");
    records.resize(static_cast<size_t>(counts[f] * cifar10_record_bytes));
    if (in.read(records.data(), records.size()) != records.size()) {
      LOOM_FAIL("CIFAR-10 file ", paths[f].string(), ": reading ", records.size(), " bytes failed (the file shrank)");
    }
    for (int64_t r = 0; r < counts[f]; ++r, ++sample) {
      const uint8_t* record = records.data() + r * cifar10_record_bytes;
      if (record[0] >= cifar10_classes) {
        LOOM_FAIL("CIFAR-10 file ", paths[f].string(), ": record ", r, " has label ", int{record[0]},
                  "; labels must be 0..9");
      }
      labels[sample] = record[0];
      std::copy(record + 1, record + cifar10_record_bytes, pixels.data() + sample * image_bytes);
    }
  }
  return ImageDataset(cifar10_channels, cifar10_side, cifar10_side, std::move(pixels), std::move(labels), name);
}

TrainTestSplit load_cifar10(const fs::path& requested) {
  if (!fs::is_directory(requested)) {
    LOOM_FAIL("CIFAR-10 directory ", requested.string(), " does not exist or is not a directory");
  }
  const std::optional<Cifar10Location> found = find_cifar10(requested);
  if (!found) {
    std::string looked;
    for (const fs::path& candidate : candidate_directories(requested)) {
      if (!fs::is_directory(candidate)) continue;
      looked += str(looked.empty() ? " " : "; ", candidate.string(), " is missing ", missing_files(candidate, Cifar10Layout::binary),
                    " (binary version), or ", missing_files(candidate, Cifar10Layout::python), " (python version)");
    }
    LOOM_FAIL("no CIFAR-10 batches under ", requested.string(),
              ": expected the binary version (data_batch_1.bin .. data_batch_5.bin and test_batch.bin, as "
              "cifar-10-binary.tar.gz extracts to cifar-10-batches-bin/) or the python version torchvision "
              "downloads (data_batch_1 .. data_batch_5 and test_batch, in cifar-10-batches-py/), in that directory "
              "or in its cifar-10-batches-bin/ or cifar-10-batches-py/; looked in:",
              looked);
  }
  std::vector<fs::path> paths;
  for (const std::string& name : batch_names(found->layout)) paths.push_back(found->directory / name);
  const fs::path test_path = paths.back();
  paths.pop_back();
  if (found->layout == Cifar10Layout::python) {
    return {read_cifar10_pickle_files(paths, "CIFAR-10 train"), read_cifar10_pickle_files({test_path}, "CIFAR-10 test")};
  }
  return {read_cifar10_files(paths, "CIFAR-10 train"), read_cifar10_files({test_path}, "CIFAR-10 test")};
}

void write_cifar10_file(const fs::path& path, const ImageDataset& dataset, int64_t begin, int64_t end) {
  LOOM_CHECK(dataset.channels() == cifar10_channels && dataset.height() == cifar10_side &&
                 dataset.width() == cifar10_side,
             "write_cifar10_file: dataset ", dataset.name(), " has images of (", dataset.channels(), ", ",
             dataset.height(), ", ", dataset.width(), "); CIFAR-10 files hold (3, 32, 32)");
  LOOM_CHECK(0 <= begin && begin <= end && end <= dataset.size(), "write_cifar10_file: range [", begin, ", ", end,
             ") is outside the ", dataset.size(), " samples of ", dataset.name());
  std::vector<uint8_t> records(static_cast<size_t>((end - begin) * cifar10_record_bytes));
  for (int64_t i = begin; i < end; ++i) {
    uint8_t* record = records.data() + (i - begin) * cifar10_record_bytes;
    const int64_t label = dataset.label(i);
    LOOM_CHECK(label >= 0 && label < cifar10_classes, "write_cifar10_file: sample ", i, " has label ", label,
               "; CIFAR-10 labels are 0..9");
    record[0] = static_cast<uint8_t>(label);
    std::copy(dataset.image(i), dataset.image(i) + image_bytes, record + 1);
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(records.data()), static_cast<std::streamsize>(records.size()));
  out.close();
  if (!out) LOOM_FAIL("CIFAR-10 file ", path.string(), ": writing ", records.size(), " bytes failed");
}

void write_cifar10_directory(const fs::path& directory, const ImageDataset& train, const ImageDataset& test) {
  fs::create_directories(directory);
  const int64_t batches = 5;
  for (int64_t b = 0; b < batches; ++b) {
    const int64_t begin = train.size() * b / batches;
    const int64_t end = train.size() * (b + 1) / batches;
    write_cifar10_file(directory / str("data_batch_", b + 1, ".bin"), train, begin, end);
  }
  write_cifar10_file(directory / "test_batch.bin", test, 0, test.size());
  std::ofstream meta(directory / "batches.meta.txt");
  for (const char* name : class_names) meta << name << "\n";
}

ImageDataset synthetic_cifar10(int64_t count, uint64_t seed) {
  LOOM_CHECK(count >= 0, "synthetic_cifar10: count ", count, " must be non-negative");
  // Per class: a base colour and a stripe direction; per image: noise and a
  // random stripe phase. Values stay in 0..255 by clamping.
  std::array<std::array<int, 3>, cifar10_classes> class_colour{};
  for (int64_t c = 0; c < cifar10_classes; ++c) {
    Generator colours(Generator::mix(seed, 1000 + static_cast<uint64_t>(c)));
    for (int& channel : class_colour[c]) channel = 40 + static_cast<int>(colours.below(176));
  }
  std::vector<uint8_t> pixels(static_cast<size_t>(count * image_bytes));
  std::vector<int64_t> labels(static_cast<size_t>(count));
  const int64_t plane = cifar10_side * cifar10_side;
  for (int64_t i = 0; i < count; ++i) {
    Generator random(Generator::mix(seed, static_cast<uint64_t>(i)));
    const int64_t label = static_cast<int64_t>(random.below(cifar10_classes));
    labels[i] = label;
    const int64_t phase = static_cast<int64_t>(random.below(8));
    const bool vertical = label % 2 == 1;
    uint8_t* image = pixels.data() + i * image_bytes;
    for (int64_t y = 0; y < cifar10_side; ++y) {
      for (int64_t x = 0; x < cifar10_side; ++x) {
        const int stripe = (((vertical ? x : y) + phase) / (2 + label / 2)) % 2 == 0 ? 30 : -30;
        const uint64_t noise = random.next_u64();
        for (int64_t c = 0; c < cifar10_channels; ++c) {
          const int value = class_colour[label][c] + stripe + static_cast<int>((noise >> (8 * c)) & 63) - 32;
          image[c * plane + y * cifar10_side + x] = static_cast<uint8_t>(std::clamp(value, 0, 255));
        }
      }
    }
  }
  return ImageDataset(cifar10_channels, cifar10_side, cifar10_side, std::move(pixels), std::move(labels),
                      "synthetic CIFAR-10");
}

}  // namespace loom::data

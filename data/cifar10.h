// CIFAR-10 binary version: reading data_batch_{1..5}.bin and test_batch.bin,
// writing files in the same format, and a synthetic CIFAR-shaped generator.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <loom/data/dataset.h>

namespace loom::data {

inline constexpr int64_t cifar10_channels = 3;
inline constexpr int64_t cifar10_side = 32;
inline constexpr int64_t cifar10_classes = 10;
// One record: a label byte, then the R, G and B planes of 32x32 pixels each.
inline constexpr int64_t cifar10_record_bytes = 1 + cifar10_channels * cifar10_side * cifar10_side;
static_assert(cifar10_record_bytes == 3073);
// Images in each official batch file (data_batch_1..5, test_batch).
inline constexpr int64_t cifar10_official_batch_images = 10000;

// Reads one or more batch files into one dataset, in the order given. Throws
// loom::Error naming the file when it is empty, its size is not a multiple of
// 3073 bytes, it is not a regular file (a FIFO would block), or a record's
// label is above 9. Any positive number of records is accepted (the official
// files hold 10000 each).
ImageDataset read_cifar10_files(const std::vector<std::filesystem::path>& paths, const std::string& name);

// Reads batches of the python version (torchvision's cifar-10-batches-py/:
// data_batch_1..5, test_batch), each a pickled dict whose "data" is a uint8
// numpy array of N x 3072 (R, G, B planes per image) and whose "labels" is a
// list (or integer numpy array) of N labels 0..9. Read with the restricted
// reader of data/pickle.h: nothing in the file is executed.
ImageDataset read_cifar10_pickle_files(const std::vector<std::filesystem::path>& paths, const std::string& name);

// The two layouts load_cifar10 accepts.
enum class Cifar10Layout { binary, python };

// Loads the training set (50000 images) and the test set (10000) from either
// layout: the binary version (data_batch_1..5.bin, test_batch.bin) or the
// python version torchvision downloads (data_batch_1..5, test_batch).
// `directory` may be the folder holding the batches or its parent holding
// cifar-10-batches-bin/ or cifar-10-batches-py/ (torchvision's root). When no
// complete layout is found, the error lists both layouts, the directories
// looked in, and the files missing.
TrainTestSplit load_cifar10(const std::filesystem::path& directory);

// Where load_cifar10 would read from: the folder holding a complete set of
// batches and its layout, or nullopt.
struct Cifar10Location {
  std::filesystem::path directory;
  Cifar10Layout layout;
};
std::optional<Cifar10Location> find_cifar10(const std::filesystem::path& directory);

// Writes samples [begin, end) of a 3x32x32 dataset as one CIFAR-10 batch file.
void write_cifar10_file(const std::filesystem::path& path, const ImageDataset& dataset, int64_t begin, int64_t end);
// Writes a loadable CIFAR-10 directory: `train` split over data_batch_1..5.bin,
// `test` as test_batch.bin, and batches.meta.txt with the class names.
void write_cifar10_directory(const std::filesystem::path& directory, const ImageDataset& train,
                             const ImageDataset& test);

// `count` random CIFAR-shaped images whose colour and stripe pattern depend on
// the label, so a model can learn them; the same (count, seed) gives the same data.
ImageDataset synthetic_cifar10(int64_t count, uint64_t seed);

}  // namespace loom::data

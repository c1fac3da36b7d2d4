// CIFAR-10 binary version: reading data_batch_{1..5}.bin and test_batch.bin,
// writing files in the same format, and a synthetic CIFAR-shaped generator.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "data/dataset.h"

namespace loom::data {

inline constexpr int64_t cifar10_channels = 3;
inline constexpr int64_t cifar10_side = 32;
inline constexpr int64_t cifar10_classes = 10;
// One record: a label byte, then the R, G and B planes of 32x32 pixels each.
inline constexpr int64_t cifar10_record_bytes = 1 + cifar10_channels * cifar10_side * cifar10_side;
static_assert(cifar10_record_bytes == 3073);

// Reads one or more batch files into one dataset, in the order given. Throws
// loom::Error naming the file when its size is not a multiple of 3073 bytes or
// a record's label is above 9.
ImageDataset read_cifar10_files(const std::vector<std::filesystem::path>& paths, const std::string& name);

// Loads the training set (data_batch_1..5.bin, 50000 images) and the test set
// (test_batch.bin, 10000). `directory` may be the folder holding the batches or
// its parent holding cifar-10-batches-bin/. Missing files are listed together.
TrainTestSplit load_cifar10(const std::filesystem::path& directory);

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

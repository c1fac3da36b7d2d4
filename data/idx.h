// IDX files (MNIST, Fashion-MNIST): reading and writing image and label files,
// gzip-compressed (.gz) or raw, and loading a whole dataset directory.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include <loom/data/dataset.h>

namespace loom::data {

// IDX magic numbers: 0x00000803 (unsigned byte, 3 dimensions) and 0x00000801 (1 dimension).
inline constexpr uint32_t idx_image_magic = 2051;
inline constexpr uint32_t idx_label_magic = 2049;

struct IdxImages {
  int64_t count = 0;
  int64_t rows = 0;
  int64_t columns = 0;
  std::vector<uint8_t> pixels;  // (count, rows, columns)
};

// Reads an image file (magic 2051, dimensions count, rows, columns). Files
// ending in .gz are decompressed. Throws loom::Error naming the file for a bad
// magic number, a truncated file or bytes after the declared images, or a
// path that is not a regular file. What a header declares is checked against
// what the file can hold before it is allocated: a raw file's size, or at
// most 1032 times a gzip file's (deflate's best ratio); a gzip payload above
// 64 MiB is inflated once to count it before it is kept.
IdxImages read_idx_images(const std::filesystem::path& path);
// Reads a label file (magic 2049); every label must be below `num_classes`.
std::vector<int64_t> read_idx_labels(const std::filesystem::path& path, int64_t num_classes = 10);

// Pairs an image file with its label file; the counts must match (compared
// from the headers, before either payload is read).
ImageDataset read_idx_dataset(const std::filesystem::path& images_path, const std::filesystem::path& labels_path,
                              int64_t num_classes = 10);

// Loads train-{images-idx3,labels-idx1}-ubyte and t10k-{...}-ubyte, each with
// or without .gz, from `directory`, or from its MNIST/raw/ or
// FashionMNIST/raw/ (torchvision's root, as a download leaves it). A missing
// directory or missing files (listed together, per directory looked in) are
// errors, and so are test images of another size than the training images.
TrainTestSplit load_mnist(const std::filesystem::path& directory);

// The directory load_mnist would read: `directory` or its MNIST/raw/ or
// FashionMNIST/raw/, whichever first holds all four files; nullopt if none does.
std::optional<std::filesystem::path> find_mnist(const std::filesystem::path& directory);

// Writers (tests, dataset conversion). A path ending in .gz is gzip-compressed.
void write_idx_images(const std::filesystem::path& path, const IdxImages& images);
void write_idx_labels(const std::filesystem::path& path, const std::vector<int64_t>& labels);

}  // namespace loom::data

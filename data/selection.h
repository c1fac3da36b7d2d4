// Choosing a dataset as the apps' --dataset and --data flags do: MNIST (IDX
// files), CIFAR-10 (binary or python version) or an image folder (torchvision's
// ImageFolder layout, ROOT/train/<class>/ and ROOT/val/ or ROOT/test/),
// inferred from the directory when unambiguous, and the loaders over it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <loom/data/dataset.h>
#include <loom/data/image_folder.h>
#include <loom/data/loader.h>

namespace loom::data {

enum class DatasetKind { mnist, cifar10, imagefolder };
const char* dataset_kind_name(DatasetKind kind);

// "mnist", "cifar10" or "imagefolder"; nullopt for "auto". Throws naming
// the --dataset flag for anything else.
std::optional<DatasetKind> parse_dataset_kind(const std::string& name);

// What `directory` holds: MNIST files (itself, MNIST/raw/ or FashionMNIST/raw/),
// CIFAR-10 batches (itself, cifar-10-batches-bin/ or cifar-10-batches-py/),
// or image folders (train/ with class sub-directories). nullopt when none;
// throws naming the candidates when more than one is there.
std::optional<DatasetKind> infer_dataset_kind(const std::filesystem::path& directory);

// An image folder's training and test halves: ROOT/train/ and the first of
// ROOT/val/, ROOT/test/; both must have the same classes.
struct ImageFolderSplit {
  std::shared_ptr<const ImageFolder> train;
  std::shared_ptr<const ImageFolder> test;
};
ImageFolderSplit load_image_folders(const std::filesystem::path& root, const ImageFolderOptions& train,
                                    const ImageFolderOptions& test);

// A loaded dataset of either kind: in memory (MNIST, CIFAR-10) or image folders.
struct LoadedData {
  DatasetKind kind = DatasetKind::mnist;
  std::string description;  // "MNIST", "CIFAR-10", "ImageFolder ROOT"
  TrainTestSplit memory;    // mnist, cifar10
  ImageFolderSplit folders;  // imagefolder
  int64_t num_classes = 0;

  int64_t train_size() const;
  int64_t test_size() const;
  // The sample shape the loaders deliver.
  SampleShape sample_shape() const;
  // A loader over the training or the test half: in-memory data with
  // `in_memory` transforms, image folders with their own.
  DataLoader loader(bool train, const Compose& in_memory, DataLoaderOptions options,
                    std::shared_ptr<Sampler> sampler) const;
};

// Loads MNIST or CIFAR-10 from `directory` (the readers' own search and
// errors), or the image folders under it with the given transforms.
LoadedData load_dataset(DatasetKind kind, const std::filesystem::path& directory,
                        const ImageFolderOptions& train_folder_options, const ImageFolderOptions& test_folder_options);

}  // namespace loom::data

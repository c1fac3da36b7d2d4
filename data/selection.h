// Choosing a dataset as the apps' --dataset and --data flags do: MNIST (IDX
// files), CIFAR-10 (binary or python version) or an image folder (torchvision's
// ImageFolder layouts: ROOT/<class>/, or ROOT/train/<class>/ and ROOT/val/ or ROOT/test/),
// inferred from the directory when unambiguous, and the loaders over it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <loom/core/options.h>
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

// Where an image folder's validation images come from.
class ImageFolderSplitOptions {
  // Share of each class held out for validation when there is no separate
  // validation folder (0 < f < 1; unset: 0.1). Set beside one, it is an error.
  LOOM_OPTION(std::optional<double>, val_fraction);
  // Seed of the hold-out's draw (the same on every rank).
  LOOM_OPTION(uint64_t, seed) = 0;
  // A separate validation folder (<class>/ sub-directories); empty: ROOT/val/
  // or ROOT/test/ beside ROOT/train/, else the hold-out.
  LOOM_OPTION(std::filesystem::path, val_directory);
};

// An image folder's training and validation (test) halves, and a line saying
// which split was used.
struct ImageFolderSplit {
  std::shared_ptr<const ImageFolder> train;
  std::shared_ptr<const ImageFolder> test;
  std::string description;
};
// Two layouts, as torchvision reads them: ROOT/train/<class>/ beside
// ROOT/val/<class>/ (or ROOT/test/), the ImageNet example's; or class folders
// directly under ROOT, ImageFolder(ROOT)'s, from which a stratified, seeded
// share is held out (split_image_folder). split.val_directory() replaces
// ROOT/val/ or the hold-out. Both halves must have the same classes.
ImageFolderSplit load_image_folders(const std::filesystem::path& root, const ImageFolderOptions& train,
                                    const ImageFolderOptions& test, const ImageFolderSplitOptions& split = {});

// A loaded dataset of either kind: in memory (MNIST, CIFAR-10) or image folders.
struct LoadedData {
  DatasetKind kind = DatasetKind::mnist;
  std::string description;  // "MNIST", "CIFAR-10", "ImageFolder ROOT"
  TrainTestSplit memory;    // mnist, cifar10
  ImageFolderSplit folders;  // imagefolder
  std::string split;         // image folders: which validation split was used; else empty
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
                        const ImageFolderOptions& train_folder_options, const ImageFolderOptions& test_folder_options,
                        const ImageFolderSplitOptions& split_options = {});

}  // namespace loom::data

// The data each app trains on by default and what --data / --dataset choose:
// train_mnist's MNIST / Fashion-MNIST (or CIFAR-10, or grayscale image
// folders), train_resnet50_cifar's CIFAR-10 (or MNIST, RGB image folders, or
// synthetic CIFAR-shaped images).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include <CLI/CLI.hpp>

#include <loom/data/selection.h>

namespace loom::apps {

// What --data, --dataset and --image-size (and train_resnet50_cifar's
// --synthetic, --synthetic-size) say.
struct DataFlags {
  std::string data;                // '' = the app's default place
  std::string dataset = "auto";    // mnist, cifar10, imagefolder, or auto: what --data holds
  int64_t image_size = 28;         // image folders
  bool synthetic = false;          // generated CIFAR-shaped images
  int64_t synthetic_size = 50000;  // their training images (test: a fifth as many)
  double val_fraction = 0.1;       // image folders without a validation folder: the share held out
  bool val_fraction_given = false; // --val-fraction on the command line (an error beside a validation folder)
  std::string val_data;            // image folders: a separate validation folder
};

// The image-folder split --val-fraction, --val-data and --seed (`seed`) ask for.
data::ImageFolderSplitOptions image_folder_split(const DataFlags& flags, uint64_t seed);

// train_mnist's --data, --dataset, --image-size, --val-fraction and --val-data.
void add_mnist_data_flags(CLI::App& app, DataFlags& flags);
// train_resnet50_cifar's --data (default ./data), --dataset, --image-size (default 224), --val-fraction,
// --val-data, --synthetic, --synthetic-size.
void add_cifar_data_flags(CLI::App& app, DataFlags& flags);

// --data (the IDX files' directory, or torchvision's root holding MNIST/raw/),
// else torchvision's roots ./data and . (the tutorials' ./data/MNIST/raw and
// ./MNIST/raw), else Debian's Fashion-MNIST; an error saying where to put the
// files when none is there.
std::filesystem::path mnist_data_dir(const std::string& flag);

// train_mnist's data from `dir`: --dataset (auto: what `dir` holds, else
// MNIST); image folders in grayscale, Resize(image_size) + CenterCrop(image_size),
// their validation images as `split` says.
data::LoadedData load_mnist_app_data(const std::filesystem::path& dir, const std::string& dataset, int64_t image_size,
                                     const data::ImageFolderSplitOptions& split = {});

// train_resnet50_cifar's data: --dataset (auto: what --data holds, else
// CIFAR-10) from DIR holding the batches (binary or python version) or its
// parent holding cifar-10-batches-bin/ or cifar-10-batches-py/ (torchvision's
// root); MNIST IDX files; or image folders (DIR/<class>/ with a held-out
// share, or DIR/train/<class>/ and DIR/val/, as `split` says) at --image-size.
// A missing CIFAR-10 names both layouts, where to download it, and --synthetic.
data::LoadedData load_cifar_app_data(const std::filesystem::path& dir, const std::string& dataset, int64_t image_size,
                                     const data::ImageFolderSplitOptions& split = {});

// --synthetic: `train_size` generated CIFAR-shaped training images and a fifth
// as many test images, of the same classes (seeded).
data::LoadedData synthetic_cifar_data(int64_t train_size, uint64_t seed);

// train_resnet50_cifar's data as `flags` say: synthetic_cifar_data (`seed`) or load_cifar_app_data.
data::LoadedData load_cifar_app_data(const DataFlags& flags, uint64_t seed);

}  // namespace loom::apps

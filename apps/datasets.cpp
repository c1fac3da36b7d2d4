#include "apps/datasets.h"

#include "apps/app_common.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <vector>

#include <loom/core/error.h>
#include <loom/data/cifar10.h>
#include <loom/data/idx.h>
#include <loom/data/transforms.h>

namespace loom::apps {

namespace fs = std::filesystem;

fs::path mnist_data_dir(const std::string& flag) {
  if (!flag.empty()) {
    if (!fs::is_directory(flag)) throw Error("--data " + flag + ": no such directory");
    return flag;
  }
  for (const char* root : {"./data", "."}) {
    if (std::optional<fs::path> found = data::find_mnist(root)) return *found;
  }
  if (fs::is_directory("/usr/share/datasets/fashion-mnist")) return "/usr/share/datasets/fashion-mnist";
  throw Error(
      "no training data: pass --data DIR with the MNIST IDX files (or torchvision's root holding MNIST/raw/), put "
      "them in ./data/MNIST/raw or ./MNIST/raw, or install Fashion-MNIST with `apt-get install dataset-fashion-mnist`");
}

data::ImageFolderSplitOptions image_folder_split(const DataFlags& flags, uint64_t seed) {
  auto split = data::ImageFolderSplitOptions().seed(seed).val_directory(flags.val_data);
  if (flags.val_fraction_given) split.val_fraction(flags.val_fraction);
  return split;
}

data::LoadedData load_mnist_app_data(const fs::path& dir, const std::string& dataset, int64_t image_size,
                                     const data::ImageFolderSplitOptions& split) {
  std::optional<data::DatasetKind> kind = data::parse_dataset_kind(dataset);
  if (!kind) kind = data::infer_dataset_kind(dir).value_or(data::DatasetKind::mnist);
  // Image folders in grayscale at --image-size: Resize(size) + CenterCrop(size), as MNIST's 28x28.
  const std::vector<data::ImageTransform> folder_transforms = {
      data::Resize{image_size}, data::CenterCrop{image_size}, data::ToTensor{}, data::Normalize{{0.5}, {0.5}}};
  const auto folder_options =
      data::ImageFolderOptions().color(data::ColorMode::grayscale).transforms(folder_transforms);
  return data::load_dataset(*kind, dir, folder_options, folder_options, split);
}

data::LoadedData load_cifar_app_data(const fs::path& dir, const std::string& dataset, int64_t image_size,
                                     const data::ImageFolderSplitOptions& split) {
  std::optional<data::DatasetKind> kind = data::parse_dataset_kind(dataset);
  if (!kind && fs::is_directory(dir)) kind = data::infer_dataset_kind(dir);
  if (!kind) kind = data::DatasetKind::cifar10;
  if (*kind == data::DatasetKind::cifar10 && !data::find_cifar10(dir)) {
    try {
      data::load_cifar10(dir);  // throws the message that lists both layouts and where it looked
    } catch (const Error& error) {
      throw Error(str(error.what(),
                      ". Download cifar-10-binary.tar.gz or cifar-10-python.tar.gz from "
                      "https://www.cs.toronto.edu/~kriz/cifar.html and unpack it into DIR, pass --data DIR, or use "
                      "--synthetic"));
    }
  }
  const auto train_folder = data::ImageFolderOptions().transforms(data::imagenet_train_transforms(image_size));
  const auto test_folder = data::ImageFolderOptions().transforms(data::imagenet_test_transforms(image_size));
  return data::load_dataset(*kind, dir, train_folder, test_folder, split);
}

data::LoadedData synthetic_cifar_data(int64_t train_size, uint64_t seed) {
  // One draw split in two: synthetic_cifar10 picks the class colours from its
  // seed, so the test images must come from the same call as the training ones.
  const int64_t test_size = std::max<int64_t>(1, train_size / 5);
  const data::ImageDataset all = data::synthetic_cifar10(train_size + test_size, seed);
  std::vector<uint8_t> test_pixels(all.image(train_size), all.image(train_size) + test_size * all.image_bytes());
  std::vector<int64_t> test_labels;
  for (int64_t i = train_size; i < train_size + test_size; ++i) test_labels.push_back(all.label(i));
  data::LoadedData loaded;
  loaded.kind = data::DatasetKind::cifar10;
  loaded.description = "Synthetic CIFAR-10";
  loaded.num_classes = data::cifar10_classes;
  loaded.memory = {all.subset(train_size),
                   data::ImageDataset(all.channels(), all.height(), all.width(), std::move(test_pixels),
                                      std::move(test_labels), "synthetic CIFAR-10 test")};
  return loaded;
}

namespace {

// --val-fraction and --val-data, the same in both apps.
void add_validation_flags(CLI::App& app, DataFlags& flags) {
  app.add_option("--val-fraction", flags.val_fraction,
                 "image folders with class folders directly under --data (torchvision's ImageFolder(root)): the share "
                 "of each class held out for validation, seeded by --seed")
      ->capture_default_str()
      ->check(number_where([](double f) { return f > 0.0 && f < 1.0; }, "a number above 0 and below 1", "0 < f < 1"))
      ->each([&flags](const std::string&) { flags.val_fraction_given = true; });
  app.add_option("--val-data", flags.val_data,
                 "image folders: a separate validation folder (<class>/ sub-directories) instead of DIR/val/ or the "
                 "held-out share");
}

}  // namespace

void add_mnist_data_flags(CLI::App& app, DataFlags& flags) {
  add_choice(app, "--dataset", flags.dataset,
             "mnist, cifar10 (with --model resnet*), imagefolder (DIR/<class>/*.jpg|png with --val-fraction held "
             "out, or DIR/train/<class>/ and DIR/val/; read in grayscale), or auto: what --data holds",
             {"auto", "mnist", "cifar10", "imagefolder"});
  add_count(app, "--image-size", flags.image_size, "image folders: Resize(size) + CenterCrop(size)", 8);
  add_validation_flags(app, flags);
  app.add_option("--data", flags.data,
                 "directory with the IDX files, or torchvision's root holding MNIST/raw/ (default ./data/MNIST/raw, "
                 "else ./MNIST/raw, else /usr/share/datasets/fashion-mnist); or CIFAR-10, or image folders");
}

void add_cifar_data_flags(CLI::App& app, DataFlags& flags) {
  flags.data = "./data";
  flags.image_size = 224;
  app.add_option("--data", flags.data,
                 "CIFAR-10, binary or python version: DIR/cifar-10-batches-bin/, DIR/cifar-10-batches-py/ "
                 "(torchvision's root) or DIR itself")
      ->capture_default_str();
  add_choice(app, "--dataset", flags.dataset,
             "cifar10, mnist, imagefolder (DIR/<class>/*.jpg|png with --val-fraction held out, or DIR/train/<class>/ "
             "and DIR/val/), or auto: what --data holds",
             {"auto", "cifar10", "mnist", "imagefolder"});
  add_validation_flags(app, flags);
  add_count(app, "--image-size", flags.image_size,
            "image folders: RandomResizedCrop size for training, Resize(size * 8 / 7) + CenterCrop(size) for testing",
            8);
  app.add_flag("--synthetic", flags.synthetic, "train on generated CIFAR-shaped images instead of CIFAR-10");
  add_count(app, "--synthetic-size", flags.synthetic_size, "synthetic training images (test: a fifth as many)", 1);
}

data::LoadedData load_cifar_app_data(const DataFlags& flags, uint64_t seed) {
  return flags.synthetic ? synthetic_cifar_data(flags.synthetic_size, seed)
                         : load_cifar_app_data(flags.data, flags.dataset, flags.image_size,
                                               image_folder_split(flags, seed));
}

}  // namespace loom::apps

// Dataset selection for the apps: kind names, inference from a directory's
// contents, image-folder splits, and loaders over either kind of data.
#include <loom/data/selection.h>

#include <algorithm>
#include <vector>

#include <loom/core/enum_names.h>
#include <loom/core/error.h>
#include <loom/data/cifar10.h>
#include <loom/data/idx.h>

namespace loom::data {
namespace fs = std::filesystem;

namespace {
constexpr EnumNames<DatasetKind, 3> kDatasetKindNames{
    {{DatasetKind::mnist, "mnist"}, {DatasetKind::cifar10, "cifar10"}, {DatasetKind::imagefolder, "imagefolder"}}};
}  // namespace

const char* dataset_kind_name(DatasetKind kind) { return kDatasetKindNames.name(kind); }

std::optional<DatasetKind> parse_dataset_kind(const std::string& name) {
  if (name == "auto") return std::nullopt;
  if (auto kind = kDatasetKindNames.parse(name)) return kind;
  LOOM_FAIL("--dataset ", name, ": expected mnist, cifar10, imagefolder or auto");
}

std::optional<DatasetKind> infer_dataset_kind(const fs::path& directory) {
  std::vector<DatasetKind> found;
  if (find_mnist(directory)) found.push_back(DatasetKind::mnist);
  if (find_cifar10(directory)) found.push_back(DatasetKind::cifar10);
  if (is_image_folder(directory / "train") || is_image_folder(directory)) found.push_back(DatasetKind::imagefolder);
  if (found.empty()) return std::nullopt;
  if (found.size() > 1) {
    std::string names;
    for (const DatasetKind kind : found) names += str(names.empty() ? "" : ", ", dataset_kind_name(kind));
    LOOM_FAIL("--data ", directory.string(), " holds more than one dataset (", names,
              "); choose one with --dataset");
  }
  return found.front();
}

namespace {

// Both halves must number the classes alike, or their labels would not agree.
void check_same_classes(const ImageFolder& train, const fs::path& train_root, const ImageFolder& test,
                        const fs::path& test_root) {
  if (train.classes() == test.classes()) return;
  LOOM_FAIL("image folders: ", train_root.string(), " has ", train.classes().size(), " classes and ",
            test_root.string(), " has ", test.classes().size(),
            (train.classes().size() == test.classes().size() ? " with other names" : ""), "; labels would not agree");
}

}  // namespace

ImageFolderSplit load_image_folders(const fs::path& root, const ImageFolderOptions& train,
                                    const ImageFolderOptions& test, const ImageFolderSplitOptions& split) {
  if (!fs::is_directory(root)) {
    LOOM_FAIL("image folders: ", root.string(), " does not exist or is not a directory");
  }
  const bool train_folder = fs::is_directory(root / "train");  // the ImageNet example's ROOT/train + ROOT/val
  const fs::path train_root = train_folder ? root / "train" : root;
  fs::path test_root = split.val_directory();
  if (!test_root.empty() && !fs::is_directory(test_root)) {
    LOOM_FAIL("image folders: the validation folder ", test_root.string(), " does not exist or is not a directory");
  }
  if (test_root.empty() && train_folder) {
    for (const char* name : {"val", "test"}) {
      if (fs::is_directory(root / name)) {
        test_root = root / name;
        break;
      }
    }
  }
  ImageFolderSplit out;
  if (!test_root.empty()) {
    if (split.val_fraction()) {
      LOOM_FAIL("image folders: a validation fraction (", *split.val_fraction(), ") and a validation folder (",
                test_root.string(), ") are both given; use one");
    }
    out.train = std::make_shared<const ImageFolder>(train_root, train);
    out.test = std::make_shared<const ImageFolder>(test_root, test);
    check_same_classes(*out.train, train_root, *out.test, test_root);
    out.description = str("Validation split: the separate folder ", test_root.string(), " (", out.test->size(),
                          " images); training on ", train_root.string(), " (", out.train->size(), " images)");
    return out;
  }
  if (!train_folder && !is_image_folder(root)) {
    LOOM_FAIL("image folders: ", root.string(), " holds neither class folders nor train/; expected ",
              "ROOT/<class>/*.jpg|jpeg|png as torchvision's ImageFolder(ROOT) reads (a validation share is held out), "
              "or ROOT/train/<class>/ beside ROOT/val/<class>/ (or ROOT/test/)");
  }
  const double fraction = split.val_fraction().value_or(0.1);
  ImageFolderHoldOut halves = split_image_folder(index_image_folder(train_root), fraction, split.seed());
  if (halves.held_out.files.empty()) {
    LOOM_FAIL("image folders: ", train_root.string(), " has ", halves.train.files.size(),
              " images, too few to hold out a validation share (each class needs at least two images)");
  }
  const size_t held = halves.held_out.files.size(), kept = halves.train.files.size();
  out.train = std::make_shared<const ImageFolder>(train_root, std::move(halves.train), train);
  out.test = std::make_shared<const ImageFolder>(train_root, std::move(halves.held_out), test);
  out.description = str("Validation split: ", fraction, " of each class of ", train_root.string(),
                        " held out (seed ", split.seed(), "): ", kept, " training, ", held, " validation images");
  return out;
}

int64_t LoadedData::train_size() const {
  return kind == DatasetKind::imagefolder ? folders.train->size() : memory.train.size();
}

int64_t LoadedData::test_size() const {
  return kind == DatasetKind::imagefolder ? folders.test->size() : memory.test.size();
}

SampleShape LoadedData::sample_shape() const {
  if (kind == DatasetKind::imagefolder) return folders.train->sample_shape();
  return {memory.train.channels(), memory.train.height(), memory.train.width()};
}

DataLoader LoadedData::loader(bool train, const Compose& in_memory, DataLoaderOptions options,
                              std::shared_ptr<Sampler> sampler) const {
  if (kind == DatasetKind::imagefolder) {
    return DataLoader(train ? folders.train : folders.test, std::move(options), std::move(sampler));
  }
  return DataLoader(train ? memory.train : memory.test, in_memory, std::move(options), std::move(sampler));
}

LoadedData load_dataset(DatasetKind kind, const fs::path& directory, const ImageFolderOptions& train_folder_options,
                        const ImageFolderOptions& test_folder_options, const ImageFolderSplitOptions& split_options) {
  if (kind != DatasetKind::imagefolder && (split_options.val_fraction() || !split_options.val_directory().empty())) {
    LOOM_FAIL("a validation split (the apps' --val-fraction / --val-data) applies to image folders only: ",
              directory.string(), " holds ", kind == DatasetKind::mnist ? "MNIST" : "CIFAR-10",
              ", whose test files are the validation set");
  }
  LoadedData out;
  out.kind = kind;
  switch (kind) {
    case DatasetKind::mnist: {
      out.memory = load_mnist(directory);
      out.description = out.memory.train.name();
      out.num_classes = 10;  // MNIST and Fashion-MNIST; read_idx_labels checked labels < 10
      break;
    }
    case DatasetKind::cifar10:
      out.memory = load_cifar10(directory);
      out.description = "CIFAR-10";
      out.num_classes = cifar10_classes;
      break;
    case DatasetKind::imagefolder:
      out.folders = load_image_folders(directory, train_folder_options, test_folder_options, split_options);
      out.split = out.folders.description;
      out.num_classes = static_cast<int64_t>(out.folders.train->classes().size());
      out.description = str("ImageFolder ", directory.string(), " (", out.num_classes, " classes)");
      break;
  }
  return out;
}

}  // namespace loom::data

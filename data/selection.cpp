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
  if (is_image_folder(directory / "train")) found.push_back(DatasetKind::imagefolder);
  if (found.empty()) return std::nullopt;
  if (found.size() > 1) {
    std::string names;
    for (const DatasetKind kind : found) names += str(names.empty() ? "" : ", ", dataset_kind_name(kind));
    LOOM_FAIL("--data ", directory.string(), " holds more than one dataset (", names,
              "); choose one with --dataset");
  }
  return found.front();
}

ImageFolderSplit load_image_folders(const fs::path& root, const ImageFolderOptions& train,
                                    const ImageFolderOptions& test) {
  if (!fs::is_directory(root / "train")) {
    LOOM_FAIL("image folders: ", (root / "train").string(),
              " does not exist; expected ROOT/train/<class>/*.jpg|png and ROOT/val/<class>/ (or ROOT/test/), "
              "as torchvision's ImageNet example reads them");
  }
  fs::path test_root;
  for (const char* name : {"val", "test"}) {
    if (fs::is_directory(root / name)) {
      test_root = root / name;
      break;
    }
  }
  if (test_root.empty()) LOOM_FAIL("image folders: ", root.string(), " has train/ but neither val/ nor test/");
  ImageFolderSplit split{std::make_shared<const ImageFolder>(root / "train", train),
                         std::make_shared<const ImageFolder>(test_root, test)};
  if (split.train->classes() != split.test->classes()) {
    LOOM_FAIL("image folders: ", (root / "train").string(), " has ", split.train->classes().size(), " classes and ",
              test_root.string(), " has ", split.test->classes().size(),
              (split.train->classes().size() == split.test->classes().size() ? " with other names" : ""),
              "; labels would not agree");
  }
  return split;
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
                        const ImageFolderOptions& test_folder_options) {
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
      out.folders = load_image_folders(directory, train_folder_options, test_folder_options);
      out.num_classes = static_cast<int64_t>(out.folders.train->classes().size());
      out.description = str("ImageFolder ", directory.string(), " (", out.num_classes, " classes)");
      break;
  }
  return out;
}

}  // namespace loom::data

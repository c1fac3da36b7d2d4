// Image folders as torchvision's ImageFolder(root) takes them (#50): class
// folders directly under ROOT with a seeded, stratified validation share held
// out; ROOT/train + ROOT/val as before; a separate validation folder; and the
// entries that are not regular files (a FIFO named .jpg) refused by name.
// The files need not decode: the split works on the index alone.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <set>

#include <loom/data/image_folder.h>
#include <loom/data/selection.h>
#include "tests/data/helpers.h"

using namespace loom::data;
using namespace loom::data::testing;
namespace fs = std::filesystem;

namespace {

// ROOT/<class>/<i>.jpg for each (class, count); the bytes are not an image.
void make_classes(const fs::path& root, const std::map<std::string, int>& counts) {
  for (const auto& [name, count] : counts) {
    fs::create_directories(root / name);
    for (int i = 0; i < count; ++i) write_bytes(root / name / (std::to_string(100 + i) + ".jpg"), {0xFF, 0xD8, 0xFF});
  }
}

ImageFolderOptions small_options() { return ImageFolderOptions().transforms({CenterCrop{8}, ToTensor{}}); }

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::multiset<int64_t> label_counts(const ImageFolderIndex& index) {
  return std::multiset<int64_t>(index.labels.begin(), index.labels.end());
}

}  // namespace

TEST_CASE("split_image_folder holds out round(f x n) per class, at least one, never all, in the index's order") {
  TempDir dir;
  make_classes(dir.path(), {{"a", 10}, {"b", 5}, {"c", 2}, {"d", 1}});
  const ImageFolderIndex index = index_image_folder(dir.path());
  const ImageFolderHoldOut split = split_image_folder(index, 0.2, 7);
  // By hand: a 10 x 0.2 = 2; b 5 x 0.2 = 1; c 2 x 0.2 = 0.4 -> at least 1; d has one image: it stays.
  const std::multiset<int64_t> held = label_counts(split.held_out);
  CHECK(held.count(0) == 2);
  CHECK(held.count(1) == 1);
  CHECK(held.count(2) == 1);
  CHECK(held.count(3) == 0);
  const std::multiset<int64_t> kept = label_counts(split.train);
  CHECK(kept.count(0) == 8);
  CHECK(kept.count(1) == 4);
  CHECK(kept.count(2) == 1);
  CHECK(kept.count(3) == 1);
  CHECK(split.train.classes == index.classes);
  CHECK(split.held_out.classes == index.classes);
  // Disjoint, together the whole index, each half in the index's order with its labels.
  std::set<fs::path> seen;
  for (const ImageFolderIndex* half : {&split.train, &split.held_out}) {
    size_t previous = 0;
    for (size_t i = 0; i < half->files.size(); ++i) {
      const auto at = std::find(index.files.begin(), index.files.end(), half->files[i]);
      REQUIRE(at != index.files.end());
      const auto position = static_cast<size_t>(at - index.files.begin());
      CHECK(half->labels[i] == index.labels[position]);
      if (i > 0) CHECK(position > previous);
      previous = position;
      CHECK(seen.insert(half->files[i]).second);
    }
  }
  CHECK(seen.size() == index.files.size());
}

TEST_CASE("the hold-out is the same for the same seed and moves with the seed") {
  TempDir dir;
  make_classes(dir.path(), {{"cat", 20}, {"dog", 20}});
  const ImageFolderIndex index = index_image_folder(dir.path());
  CHECK(split_image_folder(index, 0.25, 3).held_out.files == split_image_folder(index, 0.25, 3).held_out.files);
  bool moved = false;
  for (uint64_t seed = 4; seed < 8; ++seed) {
    moved = moved || split_image_folder(index, 0.25, seed).held_out.files != split_image_folder(index, 0.25, 3).held_out.files;
  }
  CHECK(moved);
  for (double bad : {0.0, 1.0, -0.5, 1.5}) {
    CAPTURE(bad);
    CHECK(contains(error_message([&] { split_image_folder(index, bad, 0); }), "must be above 0 and below 1"));
  }
}

TEST_CASE("ROOT/<class>/ loads with a held-out share and says so; inferred as an image folder") {
  TempDir dir;
  make_classes(dir.path(), {{"ants", 10}, {"bees", 20}});
  CHECK(infer_dataset_kind(dir.path()) == DatasetKind::imagefolder);
  const ImageFolderSplit split = load_image_folders(dir.path(), small_options(), small_options(),
                                                    ImageFolderSplitOptions().seed(5));
  CHECK(split.train->size() == 27);  // default 0.1: 1 ant and 2 bees held out
  CHECK(split.test->size() == 3);
  CHECK(split.train->classes() == std::vector<std::string>{"ants", "bees"});
  CHECK(split.test->classes() == split.train->classes());
  CHECK_MESSAGE(contains(split.description, "Validation split: 0.1 of each class of " + dir.path().string() +
                                                " held out (seed 5): 27 training, 3 validation images"),
                split.description);
  const ImageFolderSplit quarter = load_image_folders(dir.path(), small_options(), small_options(),
                                                      ImageFolderSplitOptions().val_fraction(0.25));
  CHECK(quarter.test->size() == 3 + 5);
  const LoadedData loaded =
      load_dataset(DatasetKind::imagefolder, dir.path(), small_options(), small_options(), ImageFolderSplitOptions());
  CHECK(loaded.split == loaded.folders.description);
  CHECK(loaded.num_classes == 2);
}

TEST_CASE("ROOT/train + ROOT/val is kept; a separate validation folder replaces it; conflicts are refused") {
  TempDir dir;
  make_classes(dir / "train", {{"a", 4}, {"b", 4}});
  make_classes(dir / "val", {{"a", 2}, {"b", 1}});
  const ImageFolderSplit split = load_image_folders(dir.path(), small_options(), small_options());
  CHECK(split.train->size() == 8);
  CHECK(split.test->size() == 3);
  CHECK(contains(split.description, "Validation split: the separate folder " + (dir / "val").string() + " (3 images)"));
  CHECK(contains(error_message([&] {
                   load_image_folders(dir.path(), small_options(), small_options(),
                                      ImageFolderSplitOptions().val_fraction(0.2));
                 }),
                 "a validation fraction (0.2) and a validation folder (" + (dir / "val").string() +
                     ") are both given; use one"));
  // --val-data: a folder elsewhere, for either layout.
  make_classes(dir / "elsewhere", {{"a", 1}, {"b", 1}});
  const ImageFolderSplit other = load_image_folders(
      dir / "train", small_options(), small_options(), ImageFolderSplitOptions().val_directory(dir / "elsewhere"));
  CHECK(other.train->size() == 8);
  CHECK(other.test->size() == 2);
  CHECK(contains(error_message([&] {
                   load_image_folders(dir / "train", small_options(), small_options(),
                                      ImageFolderSplitOptions().val_directory(dir / "nope"));
                 }),
                 "the validation folder " + (dir / "nope").string() + " does not exist"));
  // ROOT/train without val/ or test/: the share is held out of train/.
  fs::remove_all(dir / "val");
  const ImageFolderSplit held = load_image_folders(dir.path(), small_options(), small_options());
  CHECK(held.train->size() == 6);
  CHECK(held.test->size() == 2);
  // Different classes in the validation folder.
  make_classes(dir / "val", {{"a", 1}, {"c", 1}});
  CHECK(contains(error_message([&] { load_image_folders(dir.path(), small_options(), small_options()); }),
                 "with other names; labels would not agree"));
}

TEST_CASE("a folder with neither layout, or too few images to hold any out, is refused naming it") {
  TempDir dir;
  fs::create_directories(dir / "empty");
  const std::string neither = error_message([&] { load_image_folders(dir / "empty", small_options(), small_options()); });
  CHECK_MESSAGE(contains(neither, (dir / "empty").string() + " holds neither class folders nor train/"), neither);
  CHECK(contains(neither, "ROOT/<class>/*.jpg|jpeg|png"));
  make_classes(dir / "ones", {{"a", 1}, {"b", 1}});
  CHECK(contains(error_message([&] { load_image_folders(dir / "ones", small_options(), small_options()); }),
                 "has 2 images, too few to hold out a validation share"));
}

TEST_CASE("a FIFO named like an image is refused by name when the folder is indexed, never opened") {
  TempDir dir;
  make_classes(dir.path(), {{"a", 2}});
  REQUIRE(::mkfifo((dir / "a" / "pipe.jpg").c_str(), 0600) == 0);
  const std::string message = error_message([&] { index_image_folder(dir.path()); });
  CHECK_MESSAGE(contains(message, (dir / "a" / "pipe.jpg").string() + " is a FIFO (named pipe), not an image file"),
                message);
  fs::remove(dir / "a" / "pipe.jpg");
  fs::create_symlink(dir / "a" / "missing.jpg", dir / "a" / "dangling.jpg");
  CHECK(contains(error_message([&] { index_image_folder(dir.path()); }), "is a broken symbolic link"));
}

// Checkpoints as safetensors files: a model's state_dict under PyTorch's names
// (so torch's load_state_dict takes it directly) and, beside it under the
// "__training__." prefix, what an exactly resumed run needs (epoch, step,
// optimizer state, LR schedule position, RNG, sampler epoch, and any extra
// tensors and strings such as a loss scaler's).
//
// File layout (https://github.com/huggingface/safetensors): an 8-byte
// little-endian header length N, N bytes of JSON
//   {"conv1.weight": {"dtype": "F32", "shape": [64, 3, 7, 7], "data_offsets": [0, 37632]},
//    ..., "__metadata__": {"format": "pt", ...}}
// padded with spaces, then the tensors' raw little-endian bytes, offsets
// counted from the end of the header.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <loom/nn/module.h>

namespace loom::nn {

using Metadata = std::map<std::string, std::string>;

// The safetensors dtype strings of loom's dtypes: "F32", "F64", "F16", "BF16",
// "I64", "I32", "U8".
const char* safetensors_dtype_name(DType dtype);
// The loom dtype of one of those strings, or nullopt for any other.
std::optional<DType> parse_safetensors_dtype(const std::string& name);

struct SafetensorsFile {
  NamedTensors tensors;  // in the header's order
  Metadata metadata;     // the "__metadata__" object (string to string)
};

// Metadata key of the CRC-32 (zlib's) of the data section, which
// save_safetensors adds and load_safetensors checks when present (and removes
// from the metadata it returns).
inline constexpr const char* kDataCrc32Key = "loom.data_crc32";

// Writes `tensors` (any device; undefined ones are an error naming them) and
// `metadata` atomically: a temporary file in the same directory, fsync, rename
// over `path`, fsync of the directory. A reader sees the old file or the new
// one, never a partial one. A failed write (a full disk, an I/O error, a
// read-only directory) throws loom::Error naming the file and the cause; the
// temporary file is removed and whatever was at `path` stays as it was. A
// process killed mid-write leaves at most a hidden ".NAME.tmp-XXXXXX" beside it
// (remove_stale_temporaries clears those).
void save_safetensors(const std::filesystem::path& path, const NamedTensors& tensors, const Metadata& metadata = {});

// Reads a safetensors file onto `device`. Every way a file can be truncated
// or malformed (header length past the end, invalid JSON, an unknown dtype,
// offsets out of range, overlapping or inconsistent with the shape) is a
// loom::Error that names the file and the tensor.
SafetensorsFile load_safetensors(const std::filesystem::path& path, Device device = Device::cpu());

// Only the "__metadata__" object of a safetensors file: reads the header, not
// the data (cheap for a large file). Throws like load_safetensors for a header
// that is truncated or malformed; says nothing about the data.
Metadata read_safetensors_metadata(const std::filesystem::path& path);

// Removes the temporary files ".NAME.tmp-XXXXXX" that writers killed in the
// middle of save_safetensors left in `directory`; returns their paths. Call it
// only when no other process writes there.
std::vector<std::filesystem::path> remove_stale_temporaries(const std::filesystem::path& directory);

// Key prefix of the training state: tensors "__training__.optimizer.<name>"
// and "__training__.extra.<name>", metadata "__training__.<field>". torch
// users drop these keys before load_state_dict.
inline constexpr const char* kTrainingPrefix = "__training__.";

// The version of the training state's layout this loom writes: 1 (no
// "__training__.format_version" key) before elastic resume; 2 adds the
// writing world size, the global batch and the epoch's samples consumed.
// load_checkpoint refuses a newer version with one line naming the file.
inline constexpr int64_t kCheckpointFormatVersion = 2;

// A generator's position (Generator::seed() and counter()).
struct GeneratorState {
  uint64_t seed = 0;
  uint64_t counter = 0;
  bool operator==(const GeneratorState&) const = default;
};

// Everything besides the model that a resumed run needs to continue exactly
// as an uninterrupted one.
struct TrainingState {
  int64_t epoch = 0;  // epochs completed: the (0-based) epoch a resumed run starts with
  int64_t step = 0;   // optimizer steps taken in all
  // Batches of epoch `epoch` already trained: a checkpoint written in the
  // middle of an epoch; the resumed run starts that epoch at this batch.
  int64_t epoch_step = 0;
  // Samples of epoch `epoch` consumed by all ranks together: a position in
  // the epoch's global sample order (DistributedSampler's padded list), so a
  // run of any world size continues the epoch there. Absent in version 1.
  std::optional<int64_t> epoch_samples;
  std::optional<int64_t> world_size;         // processes that trained up to the checkpoint
  std::optional<int64_t> global_batch_size;  // samples per step over all of them
  NamedTensors optimizer;                       // Optimizer::state()
  std::optional<int64_t> scheduler_last_epoch;  // LRScheduler::last_epoch()
  std::optional<int64_t> sampler_epoch;         // Sampler::epoch() of the training loader
  std::map<std::string, GeneratorState> generators;  // e.g. "default" for default_generator()
  // Room for state without a field of its own, e.g. a GradScaler's scale and
  // growth tracker ("grad_scaler.scale") or the run's settings ("model").
  NamedTensors extra_tensors;
  Metadata extra_metadata;
};

struct Checkpoint {
  NamedTensors model;                     // Module::state_dict(), PyTorch's names
  std::optional<TrainingState> training;  // absent in a plain state_dict file (e.g. one torch wrote)
};

// Writes the checkpoint atomically (see save_safetensors). Training-state
// names may not contain the prefix themselves; model names may not start with it.
void save_checkpoint(const std::filesystem::path& path, const Checkpoint& checkpoint);

// Throws loom::Error naming the file when `metadata` (read from `path`) has a
// training-state format version above kCheckpointFormatVersion.
void check_checkpoint_version(const Metadata& metadata, const std::filesystem::path& path);

// Reads a checkpoint onto `device`. Tensors without the training prefix form
// the model state; `training` is present when the file holds a training state.
// Throws loom::Error naming the file and the key for a malformed file or a
// malformed training entry.
Checkpoint load_checkpoint(const std::filesystem::path& path, Device device = Device::cpu());

// Copies `state` into `module` after checking that names, shapes and dtypes
// all match; every mismatch is listed by name in one loom::Error that starts
// with `source` (e.g. "checkpoint ./checkpoint/1GPU_2epoch.checkpoint"):
// tensors of another shape or dtype first (with both), then missing and
// unexpected names.
void load_model_state(Module& module, const NamedTensors& state, const std::string& source = "state_dict");

}  // namespace loom::nn

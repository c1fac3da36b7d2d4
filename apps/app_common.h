// What the apps share: flag errors as one line, durations printed like
// Python's timedelta, thread setup, the training device of a rank, --version.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

#include "core/device.h"

namespace loom::apps {

// The device a process trains on, from --device: "cpu" and "cuda:N" as given;
// "cuda", and "auto" when a GPU is visible, this process's own GPU,
// cuda:(local_rank mod device_count): the one an NCCL group drives by default
// (cuda::local_rank_device), so the ranks of a node spread over its GPUs, and
// a rank shown only its own GPU (CUDA_VISIBLE_DEVICES per task) takes cuda:0.
// "auto" without a GPU is the CPU. `device_count`: the visible CUDA devices.
Device training_device(const std::string& name, int local_rank, int device_count);

// training_device() with this machine's devices; throws one line when the
// CUDA device is not there (a build without CUDA, no visible GPU, cuda:N
// beyond the visible ones).
Device resolve_training_device(const std::string& name, int local_rank);

// "0:00:12.345678", as the tutorials print datetime.now() - start.
std::string format_duration(std::chrono::steady_clock::duration elapsed);

// Peak resident set size of this process in bytes (VmHWM), 0 if unknown.
long peak_rss_bytes();

// What `PROGRAM --version` prints: "PROGRAM 0.6.0", loom::build_summary()
// (commit, CUDA, cuDNN, NCCL, CPU libraries), then what this machine runs:
// the f32 GEMM kernel chosen at run time and the visible CUDA devices.
std::string version_text(const std::string& program);

}  // namespace loom::apps

#include <CLI/CLI.hpp>

namespace loom::apps {

// Flag validators whose messages a user can act on, e.g.
// "--epochs: must be a number >= 0, got '-1'".
CLI::Validator at_least(double minimum);
// The same for whole numbers.
CLI::Validator whole_at_least(long long minimum);

// Adds --version (version_text); CLI11 reports it as CLI::CallForVersion, a
// CLI::Success, which app.exit() prints to stdout with exit status 0.
void add_version_flag(CLI::App& app, const std::string& program);

}  // namespace loom::apps

// What the apps share: flag errors as one line, durations printed like
// Python's timedelta, thread setup, the training device of a rank.
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

}  // namespace loom::apps

#include <CLI/CLI.hpp>

namespace loom::apps {

// Flag validators whose messages a user can act on, e.g.
// "--epochs: must be a number >= 0, got '-1'".
CLI::Validator at_least(double minimum);
// The same for whole numbers.
CLI::Validator whole_at_least(long long minimum);

// Options as Python's argparse takes them: a repeated option keeps its last
// value (so a wrapper script can pass defaults that its user overrides).
// Call before adding options.
void argparse_option_rules(CLI::App& app);

// Reports a fatal error the way every app does: "PROGRAM: rank N: MESSAGE" on
// stderr (the rank when several run) and, under torchrun, in the error file
// its summary shows (TORCHELASTIC_ERROR_FILE). Returns the exit code, 1.
int report_fatal_error(const char* program, const std::exception& error);

// A bad command line: "PROGRAM: MESSAGE" on stderr and in torchrun's error
// file. Returns the exit code, 2.
int report_usage_error(const char* program, const std::exception& error);

}  // namespace loom::apps

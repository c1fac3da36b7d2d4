// Elastic resume on CUDA (issue #49): the phases of tests/dist/elastic_phases.h
// with every rank's model, optimizer and batches on cuda:0, over gloo and shm
// (CUDA tensors staged through host memory; NCCL would need a GPU per rank):
// a run stopped at world 2 goes on at world 1, is stopped by SIGTERM and ends
// at world 3, in f32 and under amp O2 (f16 weights, f32 masters, dynamic loss
// scale). Each epoch covers the dataset once; losses and parameters follow
// uninterrupted runs within their spread; a stop and resume at world 2 ends
// bit for bit (nothing in this model sums with atomics on the GPU). The
// tolerances are the CPU test's, with a floor for f32: on the GPU the worlds'
// different batch shapes may take other GEMM kernels, whose rounding differs.
// Part of test_gpu_nccl (its main starts the ranks and skips without a GPU);
// written and compiled without a GPU, and run on the CPU through the same
// code (dist.elastic), not yet on a GPU.
#include <doctest/doctest.h>

#include "tests/dist/elastic_phases.h"

using namespace loom::dist::testing;

TEST_SUITE("elastic_cuda") {
  TEST_CASE("CUDA, f32, over gloo and shm: world 2 -> 1 -> 3 as uninterrupted, 2 -> 2 bit for bit") {
    for (const char* backend : {"gloo", "shm"})
      expect_world_changes_as_uninterrupted({.device = "cuda", .backend = backend},
                                            {.noise_limit = 1e-5, .floor = 1e-6});
  }

  TEST_CASE("CUDA, amp O2, over shm: the f32 masters and the loss scale carry over world 2 -> 1 -> 3") {
    expect_world_changes_as_uninterrupted({.device = "cuda", .backend = "shm", .amp = "O2"}, {.noise_limit = 1e-2});
  }
}

// Every binary of the fake build (test_gpu, convnet_throughput, ...). Its key
// is the gpu-check step that runs it (gpu.<suite>, its suites for a sanitizer
// step, bench.loom_convnet_*, bench.resnet50_cifar, train_mnist, or
// train_mnist.<backend>_g<N> with --backend and -g: the staged.* steps;
// train_resnet50_cifar), or for gpu-perf's runs (--repeats given)
// perf.<stem or convnet>.<amp: O0, O2, bf16, autocast_f16> (batch_norm_bandwidth:
// perf.batch_norm.<--dtypes>); it records its arguments in
// $FAKE_STATE/ran.log, prints a line WITHOUT flushing (only line-buffered
// output, as `stdbuf -oL` gives, shows it before a kill), then fails when the
// key is in FAKE_FAIL, hangs when it is in FAKE_HANG (its pid in
// $FAKE_STATE/pids/KEY.pid), or prints what the real binary prints on success.
// --help lists the benchmarks' flags (resnet50_throughput's --channels-last only
// when FAKE_EXTRA_FLAGS names it), as gpu-perf's variant check reads them.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int listed(const char* list, const char* key) {
  if (!list) return 0;
  size_t n = strlen(key);
  for (const char* p = strstr(list, key); p; p = strstr(p + 1, key)) {
    if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0')) return 1;
  }
  return 0;
}

static int has(int argc, char** argv, const char* arg) {
  for (int i = 1; i < argc; ++i)
    if (strcmp(argv[i], arg) == 0) return 1;
  return 0;
}

// The value after `flag`, or "" when it is not there.
static const char* value_of(int argc, char** argv, const char* flag) {
  for (int i = 1; i + 1 < argc; ++i)
    if (strcmp(argv[i], flag) == 0) return argv[i + 1];
  return "";
}

// gpu-perf's figures: ms per step by stem and precision, 0.8 times that with
// --channels-last; launches and host syncs per step, peak bytes.
static void print_perf_line(int argc, char** argv, const char* name, const char* key) {
  const int convnet = strcmp(name, "convnet_throughput") == 0;
  const char* amp = strchr(strchr(key, '.') + 1, '.') + 1;
  const int f32 = strcmp(amp, "O0") == 0;
  double ms = convnet ? (f32 ? 1.0 : 0.8) : strstr(key, ".imagenet.") ? (f32 ? 300.0 : 100.0) : (f32 ? 40.0 : 10.0);
  if (has(argc, argv, "--channels-last")) ms *= 0.8;
  printf("{\"bench\": \"loom %s train\", \"amp\": \"%s\", \"images_per_s\": %.1f, \"step_ms\": %.3f, "
         "\"timing\": \"cuda_events\", \"repeats\": 3, \"ms_per_step\": [%.4f, %.4f, %.4f], \"median_ms\": %.4f, "
         "\"min_ms\": %.4f, \"max_ms\": %.4f, \"launches_per_step\": %d, \"kernel_launches_per_step\": %d, "
         "\"library_calls_per_step\": 161, \"device_copies_per_step\": 0, \"syncs_per_step\": %s, "
         "\"sync_kinds_per_step\": {\"stream\": 0, \"event\": 0, \"device\": 0, \"device_to_host_copy\": %s, "
         "\"blocking_copy\": 0}, \"peak_allocated_bytes\": %d, \"peak_reserved_bytes\": %d, \"gpu\": \"NVIDIA H200 (fake)\"}\n",
         convnet ? "convnet" : "resnet50", amp, 1000.0 / ms, ms, ms * 1.02, ms, ms * 0.99, ms, ms * 0.99, ms * 1.02,
         f32 ? 1000 : 1400, f32 ? 839 : 1239, f32 ? "0" : "1", f32 ? "0" : "1", f32 ? 2000000000 : 1000000000,
         f32 ? 2100000000 : 1100000000);
}

// batch_norm_bandwidth's lines: one configuration, v1 at 1000 GB/s and v2 at
// 2500 of a 4800 GB/s peak.
static void print_bandwidth_lines(const char* dtype) {
  const char* kernels[] = {"v1", "v2"};
  const double gbs[] = {1000.0, 2500.0};
  for (int i = 0; i < 2; ++i)
    printf("{\"bench\": \"loom batch_norm_bandwidth\", \"device\": \"cuda:0\", \"shape\": [128, 256, 32, 32], "
           "\"dtype\": \"%s\", \"layout\": \"nhwc\", \"fusion\": \"relu\", \"pass\": \"forward\", "
           "\"kernels\": \"%s\", \"median_ms\": %.5f, \"min_ms\": %.5f, \"bytes\": 67108864, \"gbs\": %.1f, "
           "\"pass_bytes\": 100663296, \"pass_gbs\": %.1f, \"peak_gbs\": 4800.0, \"fraction_of_peak\": %.3f, "
           "\"speedup_vs_v1\": %.3f, \"reference\": \"v1\", \"max_rel_diff\": 0, \"tolerance\": 0.01, "
           "\"check\": \"passed\"}\n",
           dtype, kernels[i], 67.108864 / gbs[i], 67.108864 / gbs[i], gbs[i], gbs[i] * 1.5, gbs[i] / 4800.0,
           gbs[i] / gbs[0]);
}

static void print_help(const char* name) {
  printf("loom benchmark (fake)\nOptions:\n  -h,--help  Print this help message and exit\n");
  printf("  --steps INT\n  --warmup INT\n  --repeats INT\n  --device TEXT\n  --cuda-profile-step\n");
  if (strcmp(name, "batch_norm_bandwidth") == 0) {
    printf("  --shapes TEXT\n  --dtypes TEXT\n  --layouts TEXT\n  --fusions TEXT\n  --passes TEXT\n  --peak-gbs FLOAT\n");
  } else if (strcmp(name, "convnet_throughput") == 0) {
    printf("  --batch-size INT\n  --data TEXT\n  --channels-last  on a GPU, feed NHWC images\n  --autocast TEXT\n");
  } else {
    printf("  --batch INT\n  --size INT\n  --stem TEXT\n  --amp TEXT:{O0,O1,O2,O3,bf16}=O0\n");
    const char* extra = getenv("FAKE_EXTRA_FLAGS");
    if (extra && listed(extra, "--channels-last")) printf("  --channels-last  store and run NHWC\n");
  }
}

int main(int argc, char** argv) {
  const char* name = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
  const char* state = getenv("FAKE_STATE");
  const char* gpus = getenv("FAKE_GPUS") ? getenv("FAKE_GPUS") : "1";
  const int perf = has(argc, argv, "--repeats");
  if (has(argc, argv, "--help")) {
    print_help(name);
    return 0;
  }
  char key[256];
  if (perf && strcmp(name, "batch_norm_bandwidth") == 0) {
    snprintf(key, sizeof key, "perf.batch_norm.%s", value_of(argc, argv, "--dtypes"));
  } else if (perf) {
    const char* amp = value_of(argc, argv, "--amp");
    const char* autocast = value_of(argc, argv, "--autocast");
    if (strcmp(name, "convnet_throughput") == 0) amp = strcmp(autocast, "f16") == 0 ? "autocast_f16" : "O0";
    snprintf(key, sizeof key, "perf.%s.%s", strcmp(name, "convnet_throughput") == 0 ? "convnet" : value_of(argc, argv, "--stem"),
             amp);
  } else if ((strcmp(name, "test_gpu") == 0 || strcmp(name, "test_gpu_nccl") == 0) && argc > 1 &&
             strncmp(argv[1], "--test-suite=", 13) == 0)
    snprintf(key, sizeof key, "gpu.%s", argv[1] + 13);
  else if (strcmp(name, "test_gpu_nccl") == 0)
    snprintf(key, sizeof key, "gpu.nccl");
  else if (strcmp(name, "train_mnist") == 0 && value_of(argc, argv, "--backend")[0] != '\0')
    snprintf(key, sizeof key, "train_mnist.%s_g%s", value_of(argc, argv, "--backend"), value_of(argc, argv, "-g"));
  else if (strcmp(name, "resnet50_throughput") == 0)
    snprintf(key, sizeof key, "bench.resnet50_cifar");
  else if (strcmp(name, "convnet_throughput") == 0)
    snprintf(key, sizeof key, "bench.loom_convnet_%s",
             has(argc, argv, "--tf32") ? "tf32" : has(argc, argv, "--channels-last") ? "channels_last_f16" : "f32");
  else
    snprintf(key, sizeof key, "%s", name);
  if (state) {
    char path[4096];
    snprintf(path, sizeof path, "%s/ran.log", state);
    FILE* f = fopen(path, "a");
    if (f) {
      fprintf(f, "%s", key);
      for (int i = 1; i < argc; ++i) fprintf(f, " %s", argv[i]);
      fprintf(f, "\n");
      fclose(f);
    }
  }
  printf("fake %s: running\n", key);
  if (listed(getenv("FAKE_FAIL"), key)) {
    printf("fake %s: failing as asked\n", key);
    return 1;
  }
  if (listed(getenv("FAKE_HANG"), key)) {
    if (state) {
      char path[4096];
      snprintf(path, sizeof path, "%s/pids/%s.pid", state, key);
      FILE* f = fopen(path, "w");
      if (f) {
        fprintf(f, "%d\n", (int)getpid());
        fclose(f);
      }
    }
    for (;;) sleep(1000);
  }
  if (strncmp(key, "perf.batch_norm.", 16) == 0) {
    print_bandwidth_lines(value_of(argc, argv, "--dtypes"));
  } else if (perf) {
    print_perf_line(argc, argv, name, key);
  } else if (strncmp(key, "gpu.", 4) == 0) {
    printf("CUDA devices: %s (NVIDIA H200)\n", gpus);
    printf("[doctest] test cases: 3 | 3 passed | 0 failed | 0 skipped\n");
    printf("[doctest] assertions: 42 | 42 passed | 0 failed |\n[doctest] Status: SUCCESS!\n");
  } else if (strncmp(key, "bench.loom", 10) == 0) {
    int tf32 = has(argc, argv, "--tf32"), channels_last = has(argc, argv, "--channels-last");
    printf("{\"bench\": \"loom convnet train\", \"on\": \"cuda:0\", \"images_per_s\": %.1f, \"step_ms\": 1.0, "
           "\"device\": \"NVIDIA H200\", \"channels_last\": %s, \"tf32\": %s, \"autocast\": \"%s\", "
           "\"peak_allocated_mb\": 12.5}\n",
           tf32 ? 120000.0 : channels_last ? 150000.0 : 100000.0, channels_last ? "true" : "false",
           tf32 ? "true" : "false", channels_last ? "f16" : "none");
  } else if (strcmp(key, "bench.resnet50_cifar") == 0) {
    const char* amp = value_of(argc, argv, "--amp");
    printf("{\"bench\": \"loom resnet50 train\", \"stem\": \"cifar\", \"device\": \"cuda:0\", \"amp\": \"%s\", "
           "\"batch\": 128, \"images_per_s\": %.1f}\n",
           amp, strcmp(amp, "O0") == 0 ? 2500.0 : 5000.0);
  } else if (strncmp(key, "train_mnist", 11) == 0) {
    const char* backend = value_of(argc, argv, "--backend");
    const int processes = backend[0] != '\0' ? atoi(value_of(argc, argv, "-g")) : 1;
    if (processes > 1)
      printf("Distributed: %d processes (spawned by train_mnist -g), backend %s, batch 50 per process\n", processes,
             backend);
    printf("Throughput: %.1f images/s (%d process%s), time waiting for data: 0.100 s\n", 90000.0 / processes, processes,
           processes == 1 ? "" : "es");
    printf("Test accuracy: 0.8800 (8800/10000)\n");
  }
  return 0;
}

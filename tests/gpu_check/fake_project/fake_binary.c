// Every binary of the fake build (test_gpu, convnet_throughput, ...). Its key
// is the gpu-check step that runs it (gpu.<suite>, bench.loom_convnet_*,
// bench.resnet50_cifar, train_mnist); it records its arguments in $FAKE_STATE/ran.log, prints a
// line WITHOUT flushing (only line-buffered output, as `stdbuf -oL` gives,
// shows it before a kill), then fails when the key is in FAKE_FAIL, hangs
// when it is in FAKE_HANG (its pid in $FAKE_STATE/pids/KEY.pid), or prints
// what the real binary prints on success.
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

int main(int argc, char** argv) {
  const char* name = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
  const char* state = getenv("FAKE_STATE");
  const char* gpus = getenv("FAKE_GPUS") ? getenv("FAKE_GPUS") : "1";
  char key[256];
  if (strcmp(name, "test_gpu") == 0 && argc > 1 && strncmp(argv[1], "--test-suite=", 13) == 0)
    snprintf(key, sizeof key, "gpu.%s", argv[1] + 13);
  else if (strcmp(name, "test_gpu_nccl") == 0)
    snprintf(key, sizeof key, "gpu.nccl");
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
  if (strncmp(key, "gpu.", 4) == 0) {
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
  } else if (strcmp(key, "train_mnist") == 0) {
    printf("Throughput: 90000.0 images/s (1 process), time waiting for data: 0.100 s\n");
    printf("Test accuracy: 0.8800 (8800/10000)\n");
  }
  return 0;
}

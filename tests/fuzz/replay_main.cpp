// Runs a fuzz harness over committed inputs without libFuzzer: the seed
// corpus and the regression cases (inputs that once crashed, hung or ran out
// of memory). CTest runs it in every build (fuzz_regression.<harness>), so a
// fixed bug that comes back fails the ordinary suite.
//   fuzz_replay_<harness> <file or directory>...
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  std::vector<std::filesystem::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path arg = argv[i];
    if (std::filesystem::is_directory(arg)) {
      for (const auto& entry : std::filesystem::directory_iterator(arg))
        if (entry.is_regular_file() && entry.path().filename() != "README") inputs.push_back(entry.path());
    } else if (std::filesystem::is_regular_file(arg)) {
      inputs.push_back(arg);
    } else if (!std::filesystem::exists(arg)) {
      continue;  // a harness without regression cases yet has no directory for them
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "fuzz replay: no inputs found in the paths given\n");
    return 1;
  }
  std::sort(inputs.begin(), inputs.end());
  for (const auto& path : inputs) {
    std::ifstream in(path, std::ios::binary);
    const std::vector<char> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    std::printf("%s (%zu bytes)\n", path.c_str(), bytes.size());
    std::fflush(stdout);
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("fuzz replay: %zu inputs, no failure\n", inputs.size());
  return 0;
}

// Fuzzes the apps' command-line parsing (apps/app_common: argparse's rules
// for repeated options, the number validators, the checkpoint flags and
// their signal names) with CLI11 as the apps use it. The input is the
// argument list, arguments separated by NUL bytes. Only CLI11's parse errors
// (which the apps report as usage errors) and loom::Error may come out.
#include <string>
#include <vector>

#include "apps/app_common.h"
#include <loom/train/stop.h>
#include <loom/core/error.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args;
  std::string current;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      args.push_back(current);
      current.clear();
    } else {
      current.push_back(static_cast<char>(data[i]));
    }
  }
  args.push_back(current);
  std::vector<const char*> argv{"fuzz"};
  for (const auto& arg : args) argv.push_back(arg.c_str());

  CLI::App app{"fuzz"};
  loom::apps::argparse_option_rules(app);
  int64_t epochs = 1, batch_size = 64;
  double lr = 0.1;
  std::string device = "auto", data_dir = "./data";
  bool verbose = false;
  app.add_option("--epochs", epochs)->check(loom::apps::whole_at_least(0));
  app.add_option("--batch-size,-b", batch_size)->check(loom::apps::whole_at_least(1));
  app.add_option("--lr", lr)->check(loom::apps::at_least(0));
  app.add_option("--device", device);
  app.add_option("--data", data_dir);
  app.add_flag("--verbose,-v", verbose);
  loom::apps::CheckpointFlags checkpoint;
  loom::apps::add_checkpoint_flags(app, checkpoint);
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
    (void)loom::train::parse_signal_name(checkpoint.signal);
    (void)loom::apps::training_device(device, 0, 2);
  } catch (const CLI::Error&) {
  } catch (const loom::Error&) {
  }
  return 0;
}

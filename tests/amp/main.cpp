// Entry point of test_amp and test_train_ddp: one rank of a multi-process scenario (when
// re-executed by spawn_ranks) or the doctest runner.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "tests/dist/multiprocess.h"

int main(int argc, char** argv) {
  const int scenario_exit = loom::dist::testing::run_scenario_if_requested(argc, argv);
  if (scenario_exit >= 0) return scenario_exit;
  doctest::Context context(argc, argv);
  return context.run();
}

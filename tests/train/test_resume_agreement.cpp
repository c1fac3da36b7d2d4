// The resume decision every rank takes together: with no --resume given, a
// run resumes (auto) when the launcher restarted the job of any rank. A node
// that joins a torchrun elastic job gets TORCHELASTIC_RESTART_COUNT=0 from its
// own agent while the running node's workers count their restarts; without
// the agreement one rank resumed and the other started over (#49).
#include <doctest/doctest.h>

#include <chrono>
#include <map>
#include <string>

#include "tests/dist/multiprocess.h"
#include <loom/dist/process_group.h>
#include <loom/train/checkpoints.h>

using namespace std::chrono_literals;
using namespace loom;

LOOM_DIST_SCENARIO("resume_agreement") {
  auto group = dist::init_process_group(dist::InitOptions().init_method("env://").timeout(30s));
  const bool expected = std::string(std::getenv("EXPECT_RESTARTED")) == "1";
  const bool restarted = train::any_rank_restarted(group.get());
  dist::testing::expect(restarted == expected, "rank ", group->rank(), ": any_rank_restarted ", restarted,
                        " with TORCHELASTIC_RESTART_COUNT=", train::launcher_restart_count());
  group->barrier()->wait();
}

TEST_SUITE("resume_agreement") {
  TEST_CASE("a run resumes when the launcher restarted any rank's job, rank 0's or another's") {
    // counts[r]: rank r's TORCHELASTIC_RESTART_COUNT; the new node may be rank 0.
    const std::map<std::string, std::pair<std::vector<std::string>, std::string>> cases = {
        {"none restarted", {{"0", "0", "0"}, "0"}},
        {"a joining node is rank 0", {{"0", "2", "2"}, "1"}},
        {"a joining node is rank 2", {{"1", "1", "0"}, "1"}},
    };
    for (const auto& [name, setup] : cases) {
      const auto& [counts, expected] = setup;
      dist::testing::SpawnOptions options{.deadline = 60s, .environment = {{"EXPECT_RESTARTED", expected}}};
      options.rank_environment = [&counts](int rank) {
        return std::map<std::string, std::string>{{"TORCHELASTIC_RESTART_COUNT", counts.at(rank)}};
      };
      for (const auto& rank : dist::testing::spawn_ranks("resume_agreement", 3, options))
        CHECK_MESSAGE(rank.ok(), name, ": ", rank.describe());
    }
  }
}

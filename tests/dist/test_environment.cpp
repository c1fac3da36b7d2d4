// Launch-environment parsing: torchrun, SLURM, Open MPI and explicit values,
// and one clear error naming the variable for each kind of bad value.
#include <doctest/doctest.h>

#include <unistd.h>

#include <fstream>
#include <map>
#include <sstream>

#include <loom/core/error.h>
#include <loom/dist/environment.h>
#include "tests/dist/multiprocess.h"

using namespace loom::dist;
using loom::dist::testing::contains;
using loom::dist::testing::environment_from;

namespace {

// The message of the loom::Error that resolving `values` throws.
std::string error_for(std::map<std::string, std::string> values, LaunchOverrides overrides = {}) {
  return testing::error_of([&] { resolve_launch_environment(overrides, environment_from(std::move(values))); });
}

// Checks every field of what `values` (and no explicit value) resolve to.
void check_resolves_to(const std::map<std::string, std::string>& values, const LaunchEnvironment& expected) {
  const LaunchEnvironment env = resolve_launch_environment({}, environment_from(values));
  CHECK(env.launcher == expected.launcher);
  CHECK(env.rank == expected.rank);
  CHECK(env.world_size == expected.world_size);
  CHECK(env.local_rank == expected.local_rank);
  CHECK(env.local_world_size == expected.local_world_size);
  CHECK(env.node_rank == expected.node_rank);
  CHECK(env.master_addr == expected.master_addr);
  CHECK(env.master_port == expected.master_port);
}

}  // namespace

TEST_SUITE("environment") {
  TEST_CASE("no launcher variables: a single process") {
    check_resolves_to({}, {.launcher = Launcher::none, .rank = 0, .world_size = 1, .local_rank = 0,
                           .local_world_size = 1, .node_rank = 0, .master_addr = "127.0.0.1",
                           .master_port = kDefaultMasterPort});
    CHECK(detect_launcher(environment_from({})) == Launcher::none);
  }

  TEST_CASE("torchrun variables") {
    check_resolves_to({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
                       {"GROUP_RANK", "1"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "1234"}},
                      {.launcher = Launcher::torchrun, .rank = 5, .world_size = 8, .local_rank = 1,
                       .local_world_size = 4, .node_rank = 1, .master_addr = "node0", .master_port = 1234});
  }

  TEST_CASE("torchrun without local variables assumes one node and port 29500") {
    check_resolves_to({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}},
                      {.launcher = Launcher::torchrun, .rank = 3, .world_size = 4, .local_rank = 3,
                       .local_world_size = 4, .node_rank = 0, .master_addr = "h", .master_port = 29500});
  }

  TEST_CASE("SLURM variables, with MASTER_ADDR / MASTER_PORT overriding") {
    std::map<std::string, std::string> slurm = {{"SLURM_PROCID", "5"},        {"SLURM_NTASKS", "6"},
                                                {"SLURM_LOCALID", "1"},       {"SLURM_NODEID", "2"},
                                                {"SLURM_TASKS_PER_NODE", "2(x3)"}, {"SLURM_SRUN_COMM_HOST", "login1"},
                                                {"SLURM_STEP_ID", "0"}};
    check_resolves_to(slurm, {.launcher = Launcher::slurm, .rank = 5, .world_size = 6, .local_rank = 1,
                              .local_world_size = 2, .node_rank = 2, .master_addr = "login1", .master_port = 29500});

    slurm.insert_or_assign("MASTER_ADDR", std::string("node7"));
    slurm.insert_or_assign("MASTER_PORT", std::string("4000"));
    slurm.insert_or_assign("SLURM_NTASKS_PER_NODE", std::string("3"));
    auto env = resolve_launch_environment({}, environment_from(slurm));
    CHECK(env.master_addr == "node7");
    CHECK(env.master_port == 4000);
    CHECK(env.local_world_size == 3);
  }

  TEST_CASE("SLURM_TASKS_PER_NODE with uneven nodes") {
    check_resolves_to({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "5"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "2"},
                       {"SLURM_TASKS_PER_NODE", "2(x2),1"}, {"SLURM_SRUN_COMM_HOST", "h"}, {"SLURM_STEP_ID", "3"}},
                      {.launcher = Launcher::slurm, .rank = 4, .world_size = 5, .local_rank = 0,
                       .local_world_size = 1, .node_rank = 2, .master_addr = "h", .master_port = 29500});
  }

  TEST_CASE("SLURM_TASKS_PER_NODE whose repeats add up past 2^31 (an int overflow before)") {
    // Node 2147483647 is the second item's: its sum was an int overflow.
    check_resolves_to({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"},
                       {"SLURM_NODEID", "2147483647"}, {"SLURM_TASKS_PER_NODE", "1(x2147483647),1"},
                       {"SLURM_SRUN_COMM_HOST", "h"}, {"SLURM_STEP_ID", "0"}},
                      {.launcher = Launcher::slurm, .rank = 0, .world_size = 2, .local_rank = 0,
                       .local_world_size = 1, .node_rank = 2147483647, .master_addr = "h", .master_port = 29500});
  }

  TEST_CASE("Open MPI variables") {
    check_resolves_to({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                       {"MASTER_ADDR", "10.0.0.1"}},
                      {.launcher = Launcher::open_mpi, .rank = 3, .world_size = 4, .local_rank = 1,
                       .local_world_size = 2, .node_rank = 1, .master_addr = "10.0.0.1",
                       .master_port = kDefaultMasterPort});
  }

  TEST_CASE("the launcher that started the process wins: torchrun, then Open MPI, then an srun task") {
    CHECK(detect_launcher(environment_from({{"RANK", "0"}, {"SLURM_PROCID", "1"}, {"SLURM_STEP_ID", "0"},
                                            {"OMPI_COMM_WORLD_RANK", "2"}})) == Launcher::torchrun);
    // loomrun under srun: its workers carry srun's variables too.
    CHECK(detect_launcher(environment_from({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"},
                                            {"SLURM_STEP_ID", "0"}})) == Launcher::torchrun);
    CHECK(detect_launcher(environment_from({{"SLURM_PROCID", "1"}, {"SLURM_STEP_ID", "0"}})) == Launcher::slurm);
    CHECK(detect_launcher(environment_from({{"SLURM_PROCID", "1"}, {"SLURM_STEPID", "0"}})) == Launcher::slurm);
    CHECK(detect_launcher(environment_from({{"OMPI_COMM_WORLD_RANK", "2"}})) == Launcher::open_mpi);
    // mpirun's processes on other nodes run under the srun step that started Open MPI's daemons.
    CHECK(detect_launcher(environment_from({{"SLURM_PROCID", "1"}, {"SLURM_STEP_ID", "0"},
                                            {"OMPI_COMM_WORLD_RANK", "2"}})) == Launcher::open_mpi);
    // The batch script's own environment describes the job, not this process.
    CHECK(detect_launcher(environment_from({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}})) == Launcher::none);
  }

  TEST_CASE("mpirun inside an sbatch script: Open MPI's ranks, not the batch script's SLURM_PROCID=0") {
    // What a batch script on one node with --ntasks=2 passes to both of mpirun's processes.
    std::map<std::string, std::string> batch = {{"SLURM_PROCID", "0"},         {"SLURM_NTASKS", "2"},
                                                {"SLURM_LOCALID", "0"},        {"SLURM_NODEID", "0"},
                                                {"SLURM_TASKS_PER_NODE", "2"}, {"SLURM_JOB_ID", "17"}};
    for (int rank = 0; rank < 2; ++rank) {
      auto values = batch;
      values["OMPI_COMM_WORLD_RANK"] = std::to_string(rank);
      values["OMPI_COMM_WORLD_SIZE"] = "2";
      values["OMPI_COMM_WORLD_LOCAL_RANK"] = std::to_string(rank);
      values["OMPI_COMM_WORLD_LOCAL_SIZE"] = "2";
      auto env = resolve_launch_environment({}, environment_from(values));
      CHECK(env.launcher == Launcher::open_mpi);
      CHECK(env.rank == rank);
      CHECK(env.world_size == 2);
      CHECK(env.local_rank == rank);
      CHECK(env.master_addr == "127.0.0.1");
    }
    // The batch script running the program directly: one process, not rank 0 of 2.
    auto alone = resolve_launch_environment({}, environment_from(batch));
    CHECK(alone.launcher == Launcher::none);
    CHECK(alone.world_size == 1);
  }

  TEST_CASE("mpirun on one machine needs nothing set; across machines the error says what to set") {
    std::map<std::string, std::string> local = {{"OMPI_COMM_WORLD_RANK", "1"},
                                                {"OMPI_COMM_WORLD_SIZE", "2"},
                                                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                                {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};
    auto env = resolve_launch_environment({}, environment_from(local));
    CHECK(env.master_addr == "127.0.0.1");
    CHECK(env.master_port == kDefaultMasterPort);
    // The port follows the job (Open MPI 4's job id, Open MPI 5's PMIx namespace): the same in every rank.
    local["OMPI_MCA_ess_base_jobid"] = "1245052929";
    env = resolve_launch_environment({}, environment_from(local));
    CHECK(env.master_port == open_mpi_default_port("1245052929"));
    CHECK(env.master_port >= kOpenMpiPortBase);
    CHECK(env.master_port < kOpenMpiPortBase + kOpenMpiPortCount);
    CHECK(open_mpi_default_port("1245052929") != open_mpi_default_port("1245052930"));
    local.erase("OMPI_MCA_ess_base_jobid");
    local["PMIX_NAMESPACE"] = "prterun-vm-9928@1";
    CHECK(resolve_launch_environment({}, environment_from(local)).master_port ==
          open_mpi_default_port("prterun-vm-9928@1"));
    local["MASTER_ADDR"] = "10.1.1.1";
    local["MASTER_PORT"] = "4444";
    env = resolve_launch_environment({}, environment_from(local));
    CHECK(env.master_addr == "10.1.1.1");
    CHECK(env.master_port == 4444);

    std::string across = error_for({{"OMPI_COMM_WORLD_RANK", "3"},
                                    {"OMPI_COMM_WORLD_SIZE", "4"},
                                    {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                    {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
    CHECK(contains(across, "OMPI_COMM_WORLD_SIZE=4 but MASTER_ADDR is not set"));
    CHECK(contains(across, "several machines (OMPI_COMM_WORLD_LOCAL_SIZE=2)"));
    CHECK(contains(across, "mpirun -x MASTER_ADDR=HOST -x MASTER_PORT=PORT"));
  }

  TEST_CASE("explicit values win over the environment") {
    LaunchOverrides overrides;
    overrides.rank = 1;
    overrides.world_size = 2;
    overrides.master_addr = "127.0.0.1";
    overrides.master_port = 0;
    auto env = resolve_launch_environment(
        overrides, environment_from({{"RANK", "abc"}, {"WORLD_SIZE", "9"}, {"MASTER_ADDR", "x"},
                                     {"MASTER_PORT", "1"}}));
    CHECK(env.rank == 1);
    CHECK(env.world_size == 2);
    CHECK(env.master_addr == "127.0.0.1");
    CHECK(env.master_port == 0);
  }

  TEST_CASE("each invalid value gets an error naming its variable") {
    std::map<std::string, std::string> good = {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}};
    auto with = [&](const std::string& name, const std::string& value) {
      auto values = good;
      values.insert_or_assign(name, value);
      return values;
    };
    auto without = [&](const std::string& name) {
      auto values = good;
      values.erase(name);
      return values;
    };
    CHECK(contains(error_for(with("RANK", "abc")), "RANK='abc' is not a number"));
    CHECK(contains(error_for(with("RANK", "1x")), "RANK='1x' is not a number"));
    CHECK(contains(error_for(with("RANK", "")), "RANK='' is not a number"));
    CHECK(contains(error_for(with("WORLD_SIZE", "two")), "WORLD_SIZE='two' is not a number"));
    CHECK(contains(error_for(with("RANK", "-1")), "RANK=-1 must not be negative"));
    CHECK(contains(error_for(with("RANK", "2")), "RANK=2 must be smaller than WORLD_SIZE=2"));
    CHECK(contains(error_for(with("WORLD_SIZE", "0")), "WORLD_SIZE=0 must be at least 1"));
    CHECK(contains(error_for(with("RANK", "99999999999")), "RANK=99999999999 is out of range"));
    CHECK(contains(error_for(without("MASTER_ADDR")), "MASTER_ADDR is not set"));
    CHECK(contains(error_for(with("MASTER_ADDR", "")), "MASTER_ADDR is set but empty"));
    CHECK(contains(error_for(with("MASTER_PORT", "70000")), "MASTER_PORT=70000 is out of range"));
    CHECK(contains(error_for(with("MASTER_PORT", "0")), "MASTER_PORT=0 is out of range"));
    CHECK(contains(error_for(with("MASTER_PORT", "http")), "MASTER_PORT='http' is not a number"));
    CHECK(contains(error_for(without("WORLD_SIZE")), "RANK=1 is set but WORLD_SIZE is not"));
    CHECK(contains(error_for(without("RANK")), "WORLD_SIZE=2 is set but RANK is not"));
    auto local = with("LOCAL_WORLD_SIZE", "2");
    local.insert_or_assign("LOCAL_RANK", std::string("2"));
    CHECK(contains(error_for(local), "LOCAL_RANK=2 must be smaller than LOCAL_WORLD_SIZE=2"));
    CHECK(contains(error_for(with("LOCAL_RANK", "x")), "LOCAL_RANK='x' is not a number"));
  }

  TEST_CASE("SLURM and Open MPI errors name their variables") {
    CHECK(contains(error_for({{"SLURM_PROCID", "abc"}, {"SLURM_NTASKS", "2"}, {"SLURM_SRUN_COMM_HOST", "h"},
                              {"SLURM_STEP_ID", "0"}}),
                   "SLURM_PROCID='abc' is not a number"));
    CHECK(contains(error_for({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "2"}, {"SLURM_SRUN_COMM_HOST", "h"},
                              {"SLURM_STEP_ID", "0"}}),
                   "SLURM_PROCID=2 must be smaller than SLURM_NTASKS=2"));
    std::string no_host = error_for({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_ID", "0"}});
    CHECK(contains(no_host, "MASTER_ADDR is not set"));
    CHECK(contains(no_host, "SLURM_SRUN_COMM_HOST"));
    CHECK(contains(error_for({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "0"}}),
                   "OMPI_COMM_WORLD_SIZE=0 must be at least 1"));
    CHECK(contains(error_for({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"}}),
                   "OMPI_COMM_WORLD_SIZE=4 but MASTER_ADDR is not set"));
  }

  TEST_CASE("invalid explicit values name the argument") {
    LaunchOverrides overrides;
    overrides.rank = 4;
    overrides.world_size = 4;
    CHECK(contains(error_for({}, overrides), "rank argument 4 must be smaller than world_size argument 4"));
    overrides.rank = -2;
    CHECK(contains(error_for({}, overrides), "rank argument -2 must not be negative"));
    LaunchOverrides port;
    port.master_port = 70000;
    CHECK(contains(error_for({}, port), "master_port argument 70000 is out of range"));
  }

  TEST_CASE("rank_prefix names the rank only when several run") {
    CHECK(rank_prefix(environment_from({})) == "");
    CHECK(rank_prefix(environment_from({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}})) == "rank 1: ");
    CHECK(rank_prefix(environment_from({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                                        {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}})) == "rank 1: ");
    CHECK(rank_prefix(environment_from({{"RANK", "0"}, {"WORLD_SIZE", "1"}})) == "");
    CHECK(rank_prefix(environment_from({{"RANK", "x"}, {"WORLD_SIZE", "2"}})) == "");  // never throws
  }

  TEST_CASE("the torchelastic error file: PyTorch's JSON layout, the message escaped") {
    CHECK(write_torchelastic_error_file("ignored", environment_from({})));  // no variable: nothing to do
    std::string path = "/tmp/loom_error_file_" + std::to_string(::getpid()) + ".json";
    CHECK(write_torchelastic_error_file("train_mnist: rank 1: bad \"x\"\tC:\\y\n",
                                        environment_from({{"TORCHELASTIC_ERROR_FILE", path}})));
    std::ifstream file(path);
    std::stringstream text;
    text << file.rdbuf();
    ::unlink(path.c_str());
    const std::string escaped = "\"train_mnist: rank 1: bad \\\"x\\\"\\tC:\\\\y\\n\"";
    CHECK(text.str().rfind("{\"message\": {\"message\": " + escaped + ", \"extraInfo\": {\"py_callstack\": " + escaped +
                               ", \"timestamp\": \"",
                           0) == 0);
    CHECK(!write_torchelastic_error_file(
        "x", environment_from({{"TORCHELASTIC_ERROR_FILE", "/nonexistent/dir/f.json"}})));
  }
}

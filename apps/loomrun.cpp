// loomrun: a torchrun-compatible launcher. Starts --nproc_per_node copies of a
// program on this node with RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE /
// GROUP_RANK / MASTER_ADDR / MASTER_PORT (and TORCHELASTIC_*) set, forwards
// SIGINT / SIGTERM, and when one process fails ends the others and exits
// non-zero naming the failed rank.
//   loomrun --nproc_per_node=2 build/apps/train_mnist --epochs 2
//   loomrun --nnodes=2 --node_rank=0 --master_addr=10.0.0.1 --master_port=29500 --nproc_per_node=1 PROGRAM ARGS...
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "apps/app_common.h"
#include <loom/core/cuda/runtime.h>
#include <loom/core/error.h>
#include <loom/dist/elastic_rendezvous.h>
#include <loom/dist/launcher.h>
#include <loom/dist/store.h>

using namespace loom;
namespace fs = std::filesystem;

namespace {

constexpr const char* kUsage =
    "usage: loomrun [options] PROGRAM [ARGS...]\n"
    "\n"
    "Starts PROGRAM once per local process with torchrun's environment variables\n"
    "(RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,\n"
    "MASTER_PORT, TORCHELASTIC_RESTART_COUNT, ...). Options take --opt=VALUE or\n"
    "--opt VALUE, with '_' or '-' inside the name:\n"
    "  --nproc_per_node=N     processes on this node: a number, gpu (one per CUDA\n"
    "                         device), cpu (one per core) or auto (gpu if there\n"
    "                         are GPUs, else 1); default 1\n"
    "  --nnodes=N|MIN:MAX     number of nodes (default 1); MIN:MAX is torchrun's elastic mode: each\n"
    "                         rendezvous round at --rdzv_endpoint waits up to its timeout for MIN\n"
    "                         nodes, then up to last_call_timeout for MAX, and starts with those\n"
    "                         that came (node ranks in join order); a node that comes later, or\n"
    "                         a failure (--max_restarts), starts a new round (a node that comes\n"
    "                         while MAX run is parked until that round ends), once every node\n"
    "                         of the running round has stopped its processes\n"
    "  --rdzv_conf=K=V,...    elastic mode: timeout=SECONDS (600), last_call_timeout=SECONDS (30)\n"
    "  --node_rank=K          this node's rank, 0 .. nnodes-1 (default 0)\n"
    "  --master_addr=HOST     address of node 0, where rank 0 listens (default 127.0.0.1;\n"
    "                         required with several nodes)\n"
    "  --master_port=PORT     port rank 0 listens on (default 29500)\n"
    "  --rdzv_endpoint=HOST[:PORT]  same as --master_addr / --master_port\n"
    "  --rdzv_id=ID           job id, passed on as TORCHELASTIC_RUN_ID\n"
    "  --rdzv_backend=NAME    accepted for compatibility (static and c10d behave alike)\n"
    "  --standalone           one node on 127.0.0.1 with a free port\n"
    "  --max_restarts=N       start the local processes again up to N times after a failure (default 0)\n"
    "  --term_grace=SECONDS   after a failure, time the other processes get between SIGTERM and SIGKILL (default 10)\n"
    "  --log_dir=DIR          write each process's output to files: DIR/<rdzv_id>_<random>/\n"
    "                         attempt_<restart>/<local rank>/stdout.log and stderr.log; without\n"
    "                         --redirects or --tee every stream is teed (as --tee=3)\n"
    "  -r, --redirects=STREAMS  send these streams to the files only: 0 none, 1 stdout, 2 stderr,\n"
    "                         3 both, or per local rank LOCAL_RANK:VALUE,... (e.g. 0:1,1:3)\n"
    "  -t, --tee=STREAMS      send these streams to the files and to this terminal, each line\n"
    "                         prefixed \"[rank N]:\" (same values as --redirects). Without\n"
    "                         --log_dir the files go to a new directory under $TMPDIR\n"
    "  --local_ranks_filter=R,R  show only these local ranks' teed lines on the terminal\n"
    "  --no_python            accepted for compatibility: PROGRAM is always run as given\n"
    "                         (a PROGRAM ending in .py is run with python3 unless this is given)\n"
    "  -h, --help             this text\n"
    "  --version              loom's version and what this build holds\n"
    "\n"
    "Like torchrun's agent, loomrun on node 0 hosts the rendezvous store (a c10d\n"
    "TCPStore at the master address and port) and its processes join it\n"
    "(TORCHELASTIC_USE_AGENT_STORE=True). An option given twice takes its last value.\n"
    "OMP_NUM_THREADS is set to 1 for every process when several run per node and\n"
    "it is not set already. Restarts write new attempt_<restart> directories.\n"
    "Exit status: 0 when every process succeeded, 128+N after forwarding signal N,\n"
    "otherwise 1 with the failed rank named on stderr.\n";

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "loomrun: %s (see loomrun --help)\n", message.c_str());
  std::exit(2);
}

int parse_int(const std::string& flag, const std::string& text, int minimum) {
  char* end = nullptr;
  errno = 0;
  long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE || value > 1 << 30)
    usage_error(str(flag, ": '", text, "' is not a whole number"));
  if (value < minimum) usage_error(str(flag, ": must be at least ", minimum, ", got ", value));
  return static_cast<int>(value);
}

int processes_per_node(const std::string& text) {
  if (text == "gpu" || text == "auto") {
    int devices = cuda::device_count();
    if (text == "gpu" && devices == 0) usage_error("--nproc_per_node=gpu: this machine has no CUDA device");
    return devices > 0 ? devices : 1;
  }
  if (text == "cpu") {
    long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
    return cores > 0 ? static_cast<int>(cores) : 1;
  }
  return parse_int("--nproc_per_node", text, 1);
}

}  // namespace

int main(int argc, char** argv) {
  dist::WorkerGroupSpec spec;
  spec.name = "loomrun";
  std::string nproc_text = "1";
  std::optional<std::string> master_addr;
  std::optional<int> master_port;
  bool standalone = false, no_python = false;
  std::optional<std::string> log_dir;
  bool tee_given = false, redirects_given = false;
  std::optional<std::pair<int, int>> elastic;  // --nnodes MIN:MAX with MIN < MAX
  dist::ElasticRendezvousOptions rendezvous_options;

  // Options until the first argument that is not one (the program).
  int index = 1;
  for (; index < argc; ++index) {
    std::string argument = argv[index];
    if (argument == "--") {
      ++index;
      break;
    }
    if (argument == "-h" || argument == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (argument == "--version") {
      std::fputs(apps::version_text("loomrun").c_str(), stdout);
      return 0;
    }
    // torchrun's short forms: -r VALUE / -rVALUE, -t VALUE / -tVALUE.
    if (argument.size() >= 2 && (argument.compare(0, 2, "-r") == 0 || argument.compare(0, 2, "-t") == 0)) {
      const std::string name = argument[1] == 'r' ? "--redirects" : "--tee";
      if (argument.size() > 2) {
        argument = name + "=" + argument.substr(2);
      } else {
        argument = name;
      }
    }
    if (argument.rfind("--", 0) != 0) break;
    std::string name = argument.substr(2);
    std::optional<std::string> value;
    if (size_t equals = name.find('='); equals != std::string::npos) {
      value = name.substr(equals + 1);
      name = name.substr(0, equals);
    }
    for (char& c : name)
      if (c == '-') c = '_';
    const std::string flag = "--" + name;
    if (name == "standalone" || name == "no_python") {
      if (value) usage_error(str(flag, " takes no value"));
      (name == "standalone" ? standalone : no_python) = true;
      continue;
    }
    if (!value) {
      if (index + 1 >= argc) usage_error(str(flag, " needs a value"));
      value = argv[++index];
    }
    if (name == "nproc_per_node") {
      nproc_text = *value;
    } else if (name == "nnodes") {
      std::string text = *value;
      elastic.reset();
      if (size_t colon = text.find(':'); colon != std::string::npos) {
        const int min_nodes = parse_int(flag, text.substr(0, colon), 1), max_nodes = parse_int(flag, text.substr(colon + 1), 1);
        if (min_nodes > max_nodes) usage_error(str("--nnodes=", text, ": MIN must not be larger than MAX"));
        if (min_nodes != max_nodes) elastic = std::make_pair(min_nodes, max_nodes);
        text = text.substr(0, colon);
      }
      spec.nnodes = elastic ? 1 : parse_int(flag, text, 1);  // elastic: each round's rendezvous sets it
    } else if (name == "node_rank") {
      spec.node_rank = parse_int(flag, *value, 0);
    } else if (name == "master_addr") {
      if (value->empty()) usage_error("--master_addr is empty; give the host name or address of node 0");
      master_addr = *value;
    } else if (name == "master_port") {
      master_port = parse_int(flag, *value, 1);
    } else if (name == "rdzv_endpoint") {
      // HOST, HOST:PORT, [V6] or [V6]:PORT.
      std::string host = *value, port;
      if (!host.empty() && host.front() == '[') {
        size_t close = host.find(']');
        if (close == std::string::npos) usage_error(str(flag, "=", *value, ": missing ']'"));
        if (close + 1 < host.size()) {
          if (host[close + 1] != ':') usage_error(str(flag, "=", *value, " is not [HOST]:PORT"));
          port = host.substr(close + 2);
        }
        host = host.substr(1, close - 1);
      } else if (size_t colon = host.find(':'); colon != std::string::npos && host.find(':', colon + 1) == std::string::npos) {
        port = host.substr(colon + 1);
        host = host.substr(0, colon);
      }
      if (host.empty()) usage_error(str(flag, "=", *value, " has no host"));
      master_addr = host;
      if (!port.empty()) master_port = parse_int(flag, port, 1);
    } else if (name == "rdzv_conf") {
      size_t begin = 0;
      while (begin < value->size()) {
        size_t end = value->find(',', begin);
        if (end == std::string::npos) end = value->size();
        const std::string item = value->substr(begin, end - begin);
        const size_t equals = item.find('=');
        const std::string key = item.substr(0, equals);
        if (equals == std::string::npos || (key != "timeout" && key != "last_call_timeout"))
          usage_error(str("--rdzv_conf: '", item, "' is not timeout=SECONDS or last_call_timeout=SECONDS"));
        const auto seconds = std::chrono::seconds(parse_int(flag, item.substr(equals + 1), key == "timeout" ? 1 : 0));
        key == "timeout" ? rendezvous_options.join_timeout(seconds) : rendezvous_options.last_call(seconds);
        begin = end + 1;
      }
    } else if (name == "rdzv_id") {
      spec.run_id = *value;
    } else if (name == "rdzv_backend") {
      if (*value != "static" && *value != "c10d")
        usage_error(str("--rdzv_backend=", *value, ": only static and c10d are supported"));
    } else if (name == "max_restarts") {
      spec.max_restarts = parse_int(flag, *value, 0);
    } else if (name == "term_grace") {
      spec.termination_grace = std::chrono::seconds(parse_int(flag, *value, 0));
    } else if (name == "log_dir") {
      if (value->empty()) usage_error("--log_dir is empty; give the directory for the processes' output");
      log_dir = *value;
    } else if (name == "redirects" || name == "tee") {
      try {
        (name == "tee" ? spec.tee : spec.redirects) = dist::parse_streams(flag, *value);
      } catch (const Error& error) {
        usage_error(error.what());
      }
      (name == "tee" ? tee_given : redirects_given) = true;
    } else if (name == "local_ranks_filter") {
      std::string text = *value;
      size_t begin = 0;
      while (begin <= text.size()) {
        size_t end = text.find(',', begin);
        if (end == std::string::npos) end = text.size();
        spec.console_local_ranks.insert(parse_int(flag, text.substr(begin, end - begin), 0));
        begin = end + 1;
      }
    } else if (name == "monitor_interval") {
      // torchrun's polling period; loomrun polls every 10 ms.
    } else {
      usage_error(str("unknown option --", name));
    }
  }
  if (index >= argc) usage_error("no program to run was given");
  for (; index < argc; ++index) spec.command.push_back(argv[index]);
  if (!no_python && spec.command[0].size() > 3 && spec.command[0].ends_with(".py"))
    spec.command.insert(spec.command.begin(), "python3");

  spec.nproc_per_node = processes_per_node(nproc_text);
  if (standalone) {
    if (spec.nnodes != 1 || elastic) usage_error("--standalone runs one node; drop --nnodes");
    spec.master_addr = "127.0.0.1";
    spec.master_port = 0;  // the store below takes a free one
  } else {
    if (elastic && !master_addr)
      usage_error(str("--nnodes=", elastic->first, ":", elastic->second,
                      " needs --rdzv_endpoint, the HOST:PORT where the nodes meet"));
    if (elastic) spec.node_rank = 0;  // each round's rendezvous sets it
    if (spec.nnodes > 1 && !master_addr)
      usage_error(str("--nnodes=", spec.nnodes, " needs --master_addr, the address of node 0 that every node can reach"));
    if (master_addr) spec.master_addr = *master_addr;
    if (master_port) spec.master_port = *master_port;
  }
  if (spec.node_rank >= spec.nnodes)
    usage_error(str("--node_rank=", spec.node_rank, " must be smaller than --nnodes=", spec.nnodes));
  if (spec.nproc_per_node > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    std::fprintf(stderr,
                 "loomrun: setting OMP_NUM_THREADS=1 for each process so that %d processes do not overload this "
                 "node; set it yourself to tune\n",
                 spec.nproc_per_node);
    spec.environment["OMP_NUM_THREADS"] = "1";
  }

  // Output files: with --log_dir alone every stream is teed; --tee or
  // --redirects alone write under a new temporary directory, as torchrun.
  if (log_dir && !tee_given && !redirects_given) spec.tee.all = dist::Streams::both;
  if (!spec.console_local_ranks.empty() && !tee_given && !redirects_given) spec.tee.all = dist::Streams::both;
  if (spec.tee.any() || spec.redirects.any()) {
    std::error_code error;
    const fs::path root = log_dir ? fs::path(*log_dir) : fs::temp_directory_path(error);
    fs::create_directories(root, error);
    if (error) usage_error(str("--log_dir=", root.string(), ": cannot create it: ", error.message()));
    // A directory of its own for this run, so that no earlier run's files are overwritten.
    std::string run_directory = (root / (spec.run_id + "_XXXXXX")).string();
    if (::mkdtemp(run_directory.data()) == nullptr)
      usage_error(str("--log_dir=", root.string(), ": cannot create a directory in it: ", std::strerror(errno)));
    spec.log_dir = run_directory;
    std::fprintf(stderr, "loomrun: the processes' output goes to %s/attempt_<restart>/<local rank>/\n",
                 run_directory.c_str());
  }

  try {
    // Like torchrun's agent, node 0's loomrun hosts the rendezvous store (for
    // every restart) and the workers join it as clients, their keys under
    // /worker/attempt_<restart>; --standalone takes the port the store got.
    std::unique_ptr<dist::TCPStore> agent_store;
    std::unique_ptr<dist::ElasticRendezvous> rendezvous;
    if (elastic) {
      // Elastic: the launcher that binds the endpoint hosts the store; node ranks come from each round.
      rendezvous = std::make_unique<dist::ElasticRendezvous>(
          spec.master_addr, spec.master_port, rendezvous_options.min_nodes(elastic->first).max_nodes(elastic->second));
      spec.rendezvous = [&rendezvous](dist::WorkerGroupSpec& group, int after_round) {
        const dist::RendezvousRound round = rendezvous->join(after_round);
        group.nnodes = round.nodes;
        group.node_rank = round.node_rank;
        std::fprintf(stderr, "loomrun: rendezvous round %d: %d node%s, this one node rank %d\n", round.round,
                     round.nodes, round.nodes == 1 ? "" : "s", round.node_rank);
        std::fflush(stderr);
        return round.round;
      };
      spec.node_waiting = [&rendezvous](int round) { return rendezvous->node_waiting(round); };
    } else if (spec.node_rank == 0) {
      agent_store = std::make_unique<dist::TCPStore>(spec.master_addr, standalone ? 0 : spec.master_port,
                                                     dist::TCPStoreOptions().is_server(true));
      spec.master_port = agent_store->port();
    }
    spec.environment["TORCHELASTIC_USE_AGENT_STORE"] = "True";
    dist::WorkerGroupResult result = dist::run_worker_group(spec);
    if (result.received_signal != 0) {
      std::fprintf(stderr, "loomrun: stopped by %s\n", dist::signal_name(result.received_signal).c_str());
    } else if (!result.succeeded && result.first_failure) {
      std::fprintf(stderr, "loomrun: failed%s: %s\n",
                   result.restarts > 0 ? str(" after ", result.restarts, " restart", result.restarts == 1 ? "" : "s").c_str() : "",
                   result.first_failure->describe().c_str());
    }
    return result.exit_code();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "loomrun: %s\n", error.what());
    return 1;
  }
}

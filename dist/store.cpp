// Store helpers shared by every store, and PrefixStore.
#include <loom/dist/store.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include <loom/core/error.h>
#include <loom/core/log.h>

namespace loom::dist {

std::string Store::get_string(const std::string& key, Milliseconds timeout) {
  Bytes value = get(key, timeout);
  return std::string(value.begin(), value.end());
}

void Store::throw_timeout(const char* what, const std::vector<std::string>& keys, Milliseconds timeout) {
  std::string names;
  for (size_t i = 0; i < keys.size(); ++i) names += str(i ? ", '" : "'", keys[i], "'");
  double seconds = static_cast<double>(timeout.count()) / 1000.0;
  LOOM_FAIL(what, ": timed out after ", seconds, " s waiting for key", keys.size() == 1 ? " " : "s ", names,
            "; the rank that should set it may have failed or not started");
}

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> inner)
    : Store(inner ? inner->timeout() : kDefaultTimeout), prefix_(std::move(prefix)), inner_(std::move(inner)) {
  LOOM_CHECK(inner_ != nullptr, "PrefixStore '", prefix_, "': the inner store is null");
}

std::vector<std::string> PrefixStore::prefixed(const std::vector<std::string>& keys) const {
  std::vector<std::string> result;
  result.reserve(keys.size());
  for (const auto& key : keys) result.push_back(prefixed(key));
  return result;
}

void PrefixStore::do_set(const std::string& key, const Bytes& value) { inner_->set(prefixed(key), value); }
Bytes PrefixStore::do_get(const std::string& key, Milliseconds timeout) { return inner_->get(prefixed(key), timeout); }
int64_t PrefixStore::add(const std::string& key, int64_t delta) { return inner_->add(prefixed(key), delta); }
void PrefixStore::do_wait(const std::vector<std::string>& keys, Milliseconds timeout) {
  inner_->wait(prefixed(keys), timeout);
}
bool PrefixStore::check(const std::vector<std::string>& keys) { return inner_->check(prefixed(keys)); }

// ---- Rendezvous ----

std::string describe_this_process() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "(unknown host)");
  return str("host ", host, ", pid ", ::getpid());
}

void claim_rank(Store& store, int rank, const std::string& who, Milliseconds timeout) {
  const std::string key = str("loom/rank/", rank);
  if (store.add(key + "/claims", 1) == 1) {
    store.set(key + "/owner", who);
    return;
  }
  std::string first = "(a process that has not yet said who it is)";
  try {
    first = store.get_string(key + "/owner", std::min(timeout, Milliseconds(std::chrono::seconds(30))));
  } catch (const Error&) {
  }
  LOOM_FAIL("duplicate rank ", rank, ": this process (", who, ") and another (", first, ") were both given rank ",
            rank, " of the same job; check that the launcher's variables (RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK) "
            "differ per process and that two jobs do not share MASTER_ADDR:MASTER_PORT");
}

namespace {

// Rank 0's server when the port is taken: another rank 0 of this job (a
// launcher that gave two processes rank 0) answers as a store and has
// claimed rank 0; anything else keeps the original error.
[[noreturn]] void explain_address_in_use(const AddressInUse& error, const LaunchEnvironment& launch,
                                         Milliseconds timeout) {
  std::string first;
  try {
    TCPStore probe(launch.master_addr, launch.master_port,
                   TCPStoreOptions().is_server(false).timeout(std::chrono::seconds(3)));
    // The first rank 0 claims its rank right after it starts serving.
    first = probe.get_string("loom/rank/0/owner", std::min(timeout, Milliseconds(std::chrono::seconds(3))));
  } catch (const Error&) {
  }
  if (first.empty()) throw error;
  LOOM_FAIL("duplicate rank 0: this process (", describe_this_process(), ") and another (", first,
            ") were both given rank 0 (", launcher_name(launch.launcher), ", world size ", launch.world_size,
            "), so both tried to host the store on ", host_port(launch.master_addr, launch.master_port),
            "; check that the launcher's variables differ per process");
}

}  // namespace

std::shared_ptr<Store> connect_rendezvous_store(const LaunchEnvironment& launch, Milliseconds timeout,
                                                const EnvironmentLookup& environment) {
  std::shared_ptr<Store> store;
  auto agent_store = environment("TORCHELASTIC_USE_AGENT_STORE");
  if (launch.launcher == Launcher::torchrun && agent_store && *agent_store == "True") {
    auto tcp = std::make_shared<TCPStore>(launch.master_addr, launch.master_port,
                                          TCPStoreOptions().is_server(false).timeout(timeout));
    std::string attempt = environment("TORCHELASTIC_RESTART_COUNT").value_or("0");
    store = std::make_shared<PrefixStore>("/worker/attempt_" + attempt, tcp);
    log_debug("rendezvous: connected to the launcher's store at ", host_port(launch.master_addr, launch.master_port),
              " (TORCHELASTIC_USE_AGENT_STORE=True), keys under /worker/attempt_", attempt);
  } else {
    if (launch.rank == 0) {
      log_debug("rendezvous: rank 0 hosts the TCPStore on port ", launch.master_port, " (MASTER_PORT) of ",
                launch.master_addr, " (MASTER_ADDR)");
    } else {
      log_debug("rendezvous: connecting to rank 0's TCPStore at ", host_port(launch.master_addr, launch.master_port),
                " (MASTER_ADDR:MASTER_PORT), retrying for up to ",
                std::chrono::duration<double>(timeout).count(), " s");
    }
    try {
      store = std::make_shared<TCPStore>(launch.master_addr, launch.master_port,
                                         TCPStoreOptions().is_server(launch.rank == 0).timeout(timeout));
    } catch (const AddressInUse& error) {
      explain_address_in_use(error, launch, timeout);
    }
    log_debug("rendezvous: connected to the TCPStore at ",
              host_port(launch.master_addr, static_cast<TCPStore&>(*store).port()));
  }
  const std::string who = describe_this_process();
  claim_rank(*store, launch.rank, who, timeout);
  log_debug("rendezvous: claimed rank ", launch.rank, " of ", launch.world_size, " as ", who);
  return store;
}

}  // namespace loom::dist

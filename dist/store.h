// Rendezvous key-value stores: the abstract Store, PrefixStore (a namespace
// inside another store), TCPStore (server thread on rank 0) and FileStore (a
// file on a shared filesystem). Process groups exchange addresses and ids here.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <loom/core/options.h>
#include <loom/dist/environment.h>
#include <loom/dist/socket.h>

namespace loom::dist {

using Bytes = std::vector<uint8_t>;
using Milliseconds = std::chrono::milliseconds;

// A key-value store shared by all ranks. Values are bytes; add() keeps a
// decimal integer. Every method is thread-safe. Waiting methods take a
// timeout; without one they use the store's default timeout. A timeout throws
// loom::Error naming the keys and the timeout.
class Store {
 public:
  static constexpr Milliseconds kDefaultTimeout = std::chrono::minutes(5);

  explicit Store(Milliseconds timeout = kDefaultTimeout) : timeout_(timeout) {}
  virtual ~Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  void set(const std::string& key, const Bytes& value) { do_set(key, value); }
  void set(const std::string& key, std::string_view value) { do_set(key, Bytes(value.begin(), value.end())); }

  // Waits until `key` exists, then returns its value.
  Bytes get(const std::string& key) { return do_get(key, timeout_); }
  Bytes get(const std::string& key, Milliseconds timeout) { return do_get(key, timeout); }
  std::string get_string(const std::string& key) { return get_string(key, timeout_); }
  std::string get_string(const std::string& key, Milliseconds timeout);

  // Adds `delta` to the integer under `key` (0 when absent); returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;

  // Waits until every key exists.
  void wait(const std::vector<std::string>& keys) { do_wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, Milliseconds timeout) { do_wait(keys, timeout); }

  // Whether every key exists now; never waits.
  [[nodiscard]] virtual bool check(const std::vector<std::string>& keys) = 0;

  Milliseconds timeout() const { return timeout_; }
  void set_timeout(Milliseconds timeout) { timeout_ = timeout; }

 protected:
  // What a store implements of set, get and wait: one overload each, behind
  // the public ones (as std::locale's facets do), so that a store overrides
  // them without hiding the others.
  virtual void do_set(const std::string& key, const Bytes& value) = 0;
  virtual Bytes do_get(const std::string& key, Milliseconds timeout) = 0;
  virtual void do_wait(const std::vector<std::string>& keys, Milliseconds timeout) = 0;

  // "Store: timed out after 2 s waiting for key(s) 'a', 'b'" (`what` names the store).
  [[noreturn]] static void throw_timeout(const char* what, const std::vector<std::string>& keys, Milliseconds timeout);

 private:
  std::atomic<Milliseconds> timeout_;
};

// Every key of `inner` prefixed with "<prefix>/": lets several groups or
// rendezvous rounds share one store without collisions.
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> inner);

  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;

  const std::shared_ptr<Store>& inner() const { return inner_; }

 private:
  void do_set(const std::string& key, const Bytes& value) override;
  Bytes do_get(const std::string& key, Milliseconds timeout) override;
  void do_wait(const std::vector<std::string>& keys, Milliseconds timeout) override;
  std::string prefixed(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const;
  std::string prefix_;
  std::shared_ptr<Store> inner_;
};

class TCPStoreServer;

class TCPStoreOptions {
  // Rank 0 runs the server; every rank (rank 0 too) is a client.
  LOOM_OPTION(bool, is_server) = false;
  // Default timeout of the store's waiting calls, and how long a client keeps
  // retrying to reach the server.
  LOOM_OPTION(Milliseconds, timeout) = Store::kDefaultTimeout;
};

// Client of a key-value server at host:port speaking PyTorch's c10d TCPStore
// protocol, so it can use a store PyTorch hosts (torchrun's agent store) and
// PyTorch's TCPStore can use one loom hosts. With options.is_server this
// object also owns the server (a thread serving every client with poll(2));
// the server stops when this object is destroyed, so rank 0 must outlive the
// others' use of the store. Errors name the master's address: a server that
// went away, one that does not answer, a waiting call's timeout.
class TCPStore final : public Store {
 public:
  // port 0 with is_server: listen on any free port (see port()).
  TCPStore(std::string host, int port, TCPStoreOptions options = {});
  ~TCPStore() override;

  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;

  const std::string& host() const { return host_; }
  int port() const { return port_; }

 private:
  void do_set(const std::string& key, const Bytes& value) override;
  Bytes do_get(const std::string& key, Milliseconds timeout) override;
  void do_wait(const std::vector<std::string>& keys, Milliseconds timeout) override;
  // One connection taken from the idle pool (or opened, with the validation
  // handshake) for one call; back to the pool when the call finished its
  // exchange (done()), else closed, so that no half-read answer is reused.
  class Lease {
   public:
    explicit Lease(TCPStore& store);
    ~Lease();
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    void send(const Bytes& request);
    void receive(void* data, size_t size);
    Bytes receive_bytes();
    bool wait(const std::vector<std::string>& keys, Milliseconds timeout);
    void done() { healthy_ = true; }

   private:
    TCPStore& store_;
    FileDescriptor connection_;
    bool healthy_ = true;
  };

  // The first connection waits up to the timeout for the master to listen;
  // later ones (`first` false) fail at once when it refuses: it has exited.
  FileDescriptor open_connection(bool first);
  std::string peer() const;  // "master HOST:PORT"

  std::string host_;
  int port_;
  std::unique_ptr<TCPStoreServer> server_;
  // Connections not carrying a request. A call takes one (or opens a new one
  // when all are busy), so a thread blocked in get() never holds up another
  // thread's set().
  std::mutex idle_mutex_;
  std::vector<FileDescriptor> idle_connections_;
};

// Keys and values appended as records to one file, read under flock(2).
// Processes on a shared filesystem see each other's writes; waiting calls poll
// the file. The last FileStore to close the file deletes it; a file left by a
// crashed job still holds that job's keys, so use a fresh path per job.
class FileStore final : public Store {
 public:
  explicit FileStore(std::string path, Milliseconds timeout = kDefaultTimeout);
  ~FileStore() override;

  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;

  const std::string& path() const { return path_; }

 private:
  void do_set(const std::string& key, const Bytes& value) override;
  Bytes do_get(const std::string& key, Milliseconds timeout) override;
  void do_wait(const std::vector<std::string>& keys, Milliseconds timeout) override;
  struct State;
  std::string path_;
  std::unique_ptr<State> state_;
};

// ---- Rendezvous ----

// "host H, pid P": names this process in errors other processes show.
std::string describe_this_process();

// Registers `rank` in `store` as taken by `who` (describe_this_process()).
// Throws loom::Error naming both processes when another one claimed the same
// rank first (a launcher gave two processes one rank): "duplicate rank 0:
// host a, pid 1 and host b, pid 2 both ...". `timeout` bounds the wait for
// the first claimant's name.
void claim_rank(Store& store, int rank, const std::string& who, Milliseconds timeout);

// The store a process started by a launcher meets the others in:
//  - under torchrun / loomrun with TORCHELASTIC_USE_AGENT_STORE=True, the
//    launcher's own store at MASTER_ADDR:MASTER_PORT, every rank a client,
//    keys under "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>" (as PyTorch's
//    workers do: torch.distributed.rendezvous._create_c10d_store);
//  - otherwise a TCPStore rank 0 hosts at MASTER_ADDR:MASTER_PORT. When rank
//    0 finds the port taken by another loom rank 0 of the same job, the error
//    names both processes.
// Then claims this rank (claim_rank).
std::shared_ptr<Store> connect_rendezvous_store(const LaunchEnvironment& launch, Milliseconds timeout,
                                                const EnvironmentLookup& environment = process_environment());

}  // namespace loom::dist

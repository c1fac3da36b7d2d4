// ProcessGroupGloo: validates tensors on the caller's thread, then runs each
// collective with libgloo on one worker thread, in the order they were
// enqueued, so every rank issues the same sequence of gloo operations.
#include <loom/dist/process_group_gloo.h>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/context.h>
#include <gloo/transport/context.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>
#include <thread>

#include <loom/core/autograd.h>
#include <loom/core/error.h>
#include <loom/core/profiler.h>

namespace loom::dist {

namespace {

using detail::summarize;
using detail::view_into;

std::string host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

// Whether process `pid` of this host has ended: gone, or a zombie its parent
// has not reaped yet (a rank killed under a launcher or a test harness).
bool process_ended(int pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;  // it ended between the two looks
  // "pid (comm) S ...": the state follows the last ')' (comm may hold one).
  const size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && (line[close + 2] == 'Z' || line[close + 2] == 'X');
}

// A socket's address as host and port; gloo prints them as "[127.0.0.1]:41000"
// (IPv4 may show through an IPv6 socket as "[::ffff:127.0.0.1]:41000").
struct Endpoint {
  std::string host;
  std::string port;
  bool operator==(const Endpoint&) const = default;
  // "127.0.0.1:41000", "[fe80::1]:41000".
  std::string str() const { return host.find(':') == std::string::npos ? host + ":" + port : "[" + host + "]:" + port; }
};

std::string normalized_host(std::string host) {
  if (host.rfind("::ffff:", 0) == 0) host = host.substr(7);  // an IPv4 address seen through an IPv6 socket
  return host;
}

// Every address in `text`, in gloo's form or as plain "a.b.c.d:port".
std::vector<Endpoint> endpoints_in(const std::string& text) {
  static const std::regex pattern(R"(\[([0-9A-Za-z:.%_-]+)\]:([0-9]{1,5})|\b([0-9]{1,3}(?:\.[0-9]{1,3}){3}):([0-9]{1,5}))");
  std::vector<Endpoint> found;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), pattern); it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    found.push_back(m[1].matched ? Endpoint{normalized_host(m[1]), m[2]} : Endpoint{m[3].str(), m[4]});
  }
  return found;
}

// What happened to the connection, from gloo's message (gloo/transport/tcp/pair.cc
// and unbound_buffer.cc): the phrase that follows the peer's name in loom's error.
std::string connection_event(const std::string& gloo_message) {
  auto has = [&](const char* part) { return gloo_message.find(part) != std::string::npos; };
  if (has("reset by peer")) return "reset the connection";  // ECONNRESET: an abortive close, or data it never read
  if (has("Connection refused")) return "refused the connection (nothing listens at its address)";
  if (has("Connection closed by peer") || has("Socket closed") || has("Socket unexpectedly closed") ||
      has("Broken pipe"))
    return "closed the connection";
  if (has("imeout") || has("Timed out") || has("timed out")) return "did not answer within the timeout";
  return "failed";
}

// A gloo context over a transport context whose pairs loom connected itself
// (see ProcessGroupGloo::Impl::connect).
class MeshContext final : public gloo::Context {
 public:
  MeshContext(int rank, int size, std::shared_ptr<gloo::transport::Device> device,
              std::shared_ptr<gloo::transport::Context> transport)
      : gloo::Context(rank, size) {
    device_ = std::move(device);
    transportContext_ = std::move(transport);
  }
};

// One address of a gloo pair: as gloo prints it in its messages, to
// recognise it there, and as it is, to show it. They differ: the gloo of
// 2022 prints the port in network byte order (port 40372 as "]:46237").
struct PairAddress {
  Endpoint printed;
  Endpoint real;
};

PairAddress pair_address(const std::vector<char>& bytes) {
  const gloo::transport::tcp::Address address(bytes);
  PairAddress result;
  if (const std::vector<Endpoint> printed = endpoints_in(address.str()); printed.size() == 1) result.printed = printed[0];
  const sockaddr_storage& socket_address = address.getSockaddr();
  char host[NI_MAXHOST], port[NI_MAXSERV];
  const socklen_t length = socket_address.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&socket_address), length, host, sizeof(host), port,
                    sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV) == 0)
    result.real = {normalized_host(host), port};
  return result;
}

// Elementwise reductions for gloo: out[i] = op(a[i], b[i]). 16-bit floats go
// through float.
template <class T>
using Promoted = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float, T>;

template <class T, class Combine>
void reduce_elements(void* out, const void* a, const void* b, size_t count, Combine combine) {
  T* result = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < count; ++i) {
    result[i] = T(combine(static_cast<Promoted<T>>(x[i]), static_cast<Promoted<T>>(y[i])));
  }
}

gloo::AllreduceOptions::Func reduce_function(DType dtype, ReduceOp op) {
  return visit_dtype(dtype, [&]<class T>() -> gloo::AllreduceOptions::Func {
    using P = Promoted<T>;
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg:  // the inputs were scaled by 1 / size
        return [](void* o, const void* a, const void* b, size_t n) {
          reduce_elements<T>(o, a, b, n, [](P x, P y) { return static_cast<P>(x + y); });
        };
      case ReduceOp::max:
        return [](void* o, const void* a, const void* b, size_t n) {
          reduce_elements<T>(o, a, b, n, [](P x, P y) { return x < y ? y : x; });
        };
      case ReduceOp::min:
        return [](void* o, const void* a, const void* b, size_t n) {
          reduce_elements<T>(o, a, b, n, [](P x, P y) { return y < x ? y : x; });
        };
    }
    LOOM_FAIL("unknown reduce op");
  });
}

void check_cpu_tensor(const char* collective, const Tensor& tensor, const std::string& role) {
  detail::check_cpu_tensor("gloo", collective, tensor, role);
}

double seconds_since(Work::Clock::time_point start) {
  return std::chrono::duration<double>(Work::Clock::now() - start).count();
}

}  // namespace

std::string local_address_towards(const std::string& master_addr) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* addresses = nullptr;
  if (::getaddrinfo(master_addr.c_str(), "9", &hints, &addresses) != 0 || addresses == nullptr) return "";
  std::string result;
  // A UDP "connect" sends nothing; it asks the kernel which local address routes to the master.
  FileDescriptor probe(::socket(addresses->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (probe.valid() && ::connect(probe.get(), addresses->ai_addr, addresses->ai_addrlen) == 0) {
    sockaddr_storage local{};
    socklen_t length = sizeof(local);
    char text[NI_MAXHOST];
    if (::getsockname(probe.get(), reinterpret_cast<sockaddr*>(&local), &length) == 0 &&
        ::getnameinfo(reinterpret_cast<sockaddr*>(&local), length, text, sizeof(text), nullptr, 0, NI_NUMERICHOST) ==
            0) {
      result = text;
    }
  }
  ::freeaddrinfo(addresses);
  return result;
}

struct ProcessGroupGloo::Impl {
  struct Task {
    WorkHandle work;
    std::function<void()> run;
  };

  int rank;
  int size;
  std::shared_ptr<Store> store;
  std::atomic<Milliseconds> timeout;

  std::shared_ptr<gloo::Context> context;  // worker thread only
  // Who is at the other end of each of this rank's gloo pairs, by rank, to
  // name a peer in errors. Filled by connect(); `host` and `pid` may stay
  // unknown for a rank that fails before publishing them.
  struct Peer {
    // Its pair to this rank, gloo names either address when the pair fails:
    PairAddress listening;  // where it listened for this rank (before connecting)
    PairAddress connected;  // its end of the connection (empty until connected)
    std::string host;       // its host name and process id, as it published them
    int pid = 0;
  };
  std::vector<Peer> peers;  // worker thread only
  uint32_t next_tag = 0;                                 // worker thread only
  std::string first_failure;                             // worker thread only

  std::mutex mutex;
  std::condition_variable queue_changed;
  std::deque<Task> queue;
  bool stopping = false;
  uint64_t sequence = 0;
  std::thread worker;

  Impl(std::shared_ptr<Store> store_, int rank_, int size_, Milliseconds timeout_)
      : rank(rank_), size(size_), store(std::move(store_)), timeout(timeout_) {
    // The worker (and the gloo loop thread it creates) block SIGPIPE, so a
    // write to a dead peer fails with EPIPE instead of killing the process.
    sigset_t pipe_only, previous;
    sigemptyset(&pipe_only);
    sigaddset(&pipe_only, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_only, &previous);
    worker = std::thread([this] { run_worker(); });
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  }

  ~Impl() {
    std::deque<Task> abandoned;
    {
      std::lock_guard lock(mutex);
      stopping = true;
      abandoned.swap(queue);
    }
    queue_changed.notify_all();
    for (auto& task : abandoned) {
      task.work->finish(std::make_exception_ptr(
          Error(str("ProcessGroupGloo: ", task.work->description(), " did not run: the process group was destroyed"))));
    }
    if (worker.joinable()) worker.join();
  }

  std::string prefix() const { return str("ProcessGroupGloo rank ", rank, " of ", size, ": "); }

  // `what` is a description without the sequence number: "all_reduce (f32[4], sum)".
  WorkHandle enqueue(const std::string& name, const std::string& details, std::function<void()> run) {
    std::lock_guard lock(mutex);
    LOOM_CHECK(!stopping, "ProcessGroupGloo: ", name, " called on a process group being destroyed");
    auto work = std::make_shared<Work>(str(name, " #", sequence++, " (", details, ")"));
    queue.push_back({work, std::move(run)});
    queue_changed.notify_one();
    return work;
  }

  void run_worker() {
    profiler::set_thread_name("gloo communication");
    set_grad_mode(false);  // collectives copy gradient buffers; nothing here is differentiable
    while (true) {
      Task task;
      {
        std::unique_lock lock(mutex);
        queue_changed.wait(lock, [&] { return stopping || !queue.empty(); });
        if (queue.empty()) return;
        task = std::move(queue.front());
        queue.pop_front();
      }
      task.work->mark_started();
      if (!first_failure.empty()) {
        task.work->finish(std::make_exception_ptr(Error(str(prefix(), task.work->description(),
                                                            " was not run because an earlier collective failed: ",
                                                            first_failure))));
        continue;
      }
      auto start = Work::Clock::now();
      try {
        task.run();
        task.work->finish();
      } catch (const std::exception& error) {
        std::string message = explain_failure(task.work->description(), error.what(), seconds_since(start));
        first_failure = message;
        task.work->finish(std::make_exception_ptr(Error(message)));
      }
    }
  }

  // The error for a failed collective: which peer did what ("peer rank 1
  // (pid 4242 on node0, 127.0.0.1:36743) closed the connection during
  // all_reduce #12 ..."), when, and gloo's own message at the end.
  std::string explain_failure(const std::string& description, const std::string& cause, double seconds) {
    const double timeout_s = static_cast<double>(timeout.load().count()) / 1000.0;
    const std::string during = str(description, ", ", std::round(seconds * 100) / 100, " s after it started (timeout ",
                                   timeout_s, " s)");
    const std::vector<int> involved = ranks_involved(cause);
    std::string what;
    if (involved.empty()) {
      what = str(during, " failed; gloo's message names no peer this group knows, and no rank's process on this host "
                         "has ended: a peer may have died, hung, or stopped calling collectives");
    } else {
      std::string named;
      bool all_ended = true;
      for (int r : involved) {
        named += str(named.empty() ? "peer " : ", ", describe_peer(r));
        all_ended = all_ended && peer_process_ended(r);
      }
      const std::string event = connection_event(cause);
      const std::string likely = all_ended                                         ? "that process has ended"
                                 : event == "did not answer within the timeout" ? "it may have died, hung, or stopped "
                                                                                  "calling collectives"
                                                                                : "that process has probably died, or "
                                                                                  "gave up after an error of its own";
      what = str(named, " ", event, " during ", during, "; ", likely);
    }
    return str(prefix(), what, ". This process group is unusable from now on. (Gloo: ", cause, ")");
  }

  // The ranks a gloo failure involves. Exact when gloo's message shows an
  // address of the peer's side of one of this rank's pairs (gloo names the
  // peer of a closed, reset or refused socket so); else, as a timeout shows no address, this
  // rank's only peer in a world of two; else the ranks on this host whose
  // process has ended. Empty when none of these tells.
  std::vector<int> ranks_involved(const std::string& gloo_message) {
    for (const Endpoint& shown : endpoints_in(gloo_message))
      for (int r = 0; r < static_cast<int>(peers.size()); ++r)
        for (const PairAddress* address : {&peers[r].connected, &peers[r].listening})
          if (r != rank && !address->printed.port.empty() && address->printed == shown) return {r};
    if (size == 2) return {1 - rank};
    std::vector<int> ended;
    for (int r = 0; r < size; ++r)
      if (r != rank && peer_process_ended(r)) ended.push_back(r);
    return ended;
  }

  // "rank 1 (pid 4242 on node0, 127.0.0.1:36743)", with what is known of it.
  std::string describe_peer(int r) {
    read_peer_processes();
    const Peer& peer = peers[r];
    std::string known = peer.pid > 0 ? str("pid ", peer.pid, " on ", peer.host) : "";
    const Endpoint& address = peer.connected.real.port.empty() ? peer.listening.real : peer.connected.real;
    if (!address.port.empty()) known += (known.empty() ? "" : ", ") + address.str();
    return known.empty() ? str("rank ", r) : str("rank ", r, " (", known, ")");
  }

  // Whether rank r's process is known to have ended (only ranks on this host can be seen).
  bool peer_process_ended(int r) {
    read_peer_processes();
    const Peer& peer = peers[r];
    return peer.pid > 0 && peer.host == host_name() && process_ended(peer.pid);
  }

  // This rank's host and pid, published before connecting, so that even a
  // failed connection can name a peer whose process ended.
  void publish_process() { store->set(str("gloo_process/", rank), str(host_name(), " ", ::getpid())); }

  // Reads the hosts and pids the other ranks published (those not there yet stay unknown).
  void read_peer_processes() {
    peers.resize(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) {
      Peer& peer = peers[static_cast<size_t>(r)];
      if (r == rank || peer.pid > 0) continue;
      const std::string key = str("gloo_process/", r);
      try {
        if (!store->check({key})) continue;
        std::istringstream fields(store->get_string(key, Milliseconds(1000)));
        fields >> peer.host >> peer.pid;
      } catch (const std::exception&) {
        // The store itself may be gone with the peer (rank 0 hosts it); the rank stays unnamed.
      }
    }
  }

  uint32_t tag() { return next_tag++; }

  // Connects the full mesh; runs on the worker thread.
  void connect(const GlooOptions& options) {
    publish_process();
    gloo::transport::tcp::attr attr;
    std::string interface = options.interface();
    for (const char* variable : {"LOOM_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"}) {
      if (interface.empty() && std::getenv(variable)) interface = std::getenv(variable);
    }
    if (!interface.empty()) {
      attr.iface = interface;
    } else if (!options.hostname().empty()) {
      attr.hostname = options.hostname();
    } else {
      char name[256] = {};
      ::gethostname(name, sizeof(name) - 1);
      attr.hostname = name;
    }
    std::shared_ptr<gloo::transport::Device> device;
    try {
      device = gloo::transport::tcp::CreateDevice(attr);
    } catch (const std::exception& error) {
      LOOM_FAIL(prefix(), "cannot listen on ", attr.iface.empty() ? "host " + attr.hostname : "interface " + attr.iface,
                ": ", error.what(), ". Set LOOM_SOCKET_IFNAME to a network interface every rank can reach");
    }
    // The full mesh, as gloo::rendezvous::Context::connectFullMesh makes it,
    // but keeping both addresses of every peer's side of its pair to this
    // rank: the one it listened on and, once connected, its end of the
    // connection. Gloo names one or the other when the pair fails.
    std::shared_ptr<gloo::transport::Context> transport = device->createContext(rank, size);
    transport->setTimeout(timeout.load());
    auto gloo_store = std::make_shared<PrefixStore>("gloo", store);
    auto publish = [&](const char* what, int peer, const gloo::transport::Address& address) {
      const std::vector<char> bytes = address.bytes();
      gloo_store->set(str(what, "/", rank, "/", peer), Bytes(bytes.begin(), bytes.end()));
    };
    auto read = [&](const char* what, int peer) {
      const Bytes bytes = gloo_store->get(str(what, "/", peer, "/", rank), timeout.load());
      return std::vector<char>(bytes.begin(), bytes.end());
    };
    peers.resize(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r)
      if (r != rank) publish("listening", r, transport->createPair(r)->address());
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      const std::vector<char> theirs = read("listening", r);
      peers[r].listening = pair_address(theirs);
      transport->getPair(r)->connect(theirs);  // a failure names the peer through explain_failure
    }
    context = std::make_shared<MeshContext>(rank, size, device, transport);
    context->setTimeout(timeout.load());
    for (int r = 0; r < size; ++r)
      if (r != rank) publish("connected", r, context->getPair(r)->address());
    for (int r = 0; r < size; ++r)
      if (r != rank) peers[r].connected = pair_address(read("connected", r));
    read_peer_processes();  // all published before connecting: later failures need no store
  }

  // ---- collectives, worker thread ----

  void all_reduce_buffer(const Tensor& buffer, ReduceOp op) {
    if (buffer.numel() == 0) return;
    // avg: scaled before the sum, as DDP's pre-division does, so 16-bit sums
    // of large gradients do not overflow on the way.
    if (op == ReduceOp::avg) Tensor(buffer).mul_(1.0 / size);
    visit_dtype(buffer.dtype(), [&]<class T>() {
      gloo::AllreduceOptions options(context);
      options.setOutput<T>(static_cast<T*>(buffer.raw_data()), static_cast<size_t>(buffer.numel()));
      options.setReduceFunction(reduce_function(buffer.dtype(), op));
      options.setTag(tag());
      options.setTimeout(timeout.load());
      gloo::allreduce(options);
    });
  }

  // Reduces each tensor in place; tensors of one dtype share one gloo call.
  void all_reduce(const std::vector<Tensor>& tensors, ReduceOp op) {
    for (const std::vector<Tensor>& group : detail::by_dtype(tensors)) {
      if (group.size() == 1 && group[0].is_contiguous()) {
        all_reduce_buffer(group[0], op);
        continue;
      }
      int64_t total = 0;
      for (const auto& t : group) total += t.numel();
      Tensor buffer = Tensor::empty({total}, group[0].dtype());
      int64_t offset = 0;
      for (const auto& t : group) {
        copy_cpu(view_into(buffer, t.sizes(), offset), t);
        offset += t.numel();
      }
      all_reduce_buffer(buffer, op);
      offset = 0;
      for (const auto& t : group) {
        copy_cpu(t, view_into(buffer, t.sizes(), offset));
        offset += t.numel();
      }
    }
  }

  void broadcast(const Tensor& tensor, int root) {
    if (tensor.numel() == 0) return;
    Tensor buffer = tensor;
    if (!tensor.is_contiguous()) {
      buffer = Tensor::empty(tensor.sizes(), tensor.dtype());
      if (rank == root) copy_cpu(buffer, tensor);
    }
    visit_dtype(buffer.dtype(), [&]<class T>() {
      gloo::BroadcastOptions options(context);
      options.setOutput<T>(static_cast<T*>(buffer.raw_data()), static_cast<size_t>(buffer.numel()));
      options.setRoot(root);
      options.setTag(tag());
      options.setTimeout(timeout.load());
      gloo::broadcast(options);
    });
    if (!buffer.is_same(tensor) && rank != root) copy_cpu(tensor, buffer);
  }

  // output: size * input.numel() elements.
  void all_gather_into(const Tensor& output, const Tensor& input) {
    if (input.numel() == 0) return;
    Tensor source = input;
    if (!input.is_contiguous()) {
      source = Tensor::empty(input.sizes(), input.dtype());
      copy_cpu(source, input);
    }
    Tensor target = output.is_contiguous() ? output : Tensor::empty(output.sizes(), output.dtype());
    visit_dtype(input.dtype(), [&]<class T>() {
      gloo::AllgatherOptions options(context);
      options.setInput<T>(static_cast<T*>(source.raw_data()), static_cast<size_t>(source.numel()));
      options.setOutput<T>(static_cast<T*>(target.raw_data()), static_cast<size_t>(target.numel()));
      options.setTag(tag());
      options.setTimeout(timeout.load());
      gloo::allgather(options);
    });
    if (!target.is_same(output)) copy_cpu(output, target);
  }

  // Reduces a copy of `input` (size * output.numel() elements) and keeps this rank's chunk.
  void reduce_scatter_from(const Tensor& output, const Tensor& input, ReduceOp op) {
    Tensor buffer = Tensor::empty({input.numel()}, input.dtype());
    copy_cpu(view_into(buffer, input.sizes(), 0), input);
    all_reduce_buffer(buffer, op);
    copy_cpu(output, view_into(buffer, output.sizes(), rank * output.numel()));
  }

  void barrier() {
    gloo::BarrierOptions options(context);
    options.setTag(tag());
    options.setTimeout(timeout.load());
    gloo::barrier(options);
  }
};

ProcessGroupGloo::ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size, GlooOptions options)
    : ProcessGroup(rank, size) {
  LOOM_CHECK(store != nullptr, "ProcessGroupGloo: the rendezvous store is null");
  impl_ = std::make_unique<Impl>(std::move(store), rank, size, options.timeout());
  WorkHandle connected = impl_->enqueue("connect", str(size, " ranks"), [this, options] { impl_->connect(options); });
  connected->wait();
}

ProcessGroupGloo::~ProcessGroupGloo() = default;

void ProcessGroupGloo::set_timeout(Milliseconds timeout) {
  LOOM_CHECK(timeout.count() > 0, "ProcessGroupGloo: timeout must be positive, got ", timeout.count(), " ms");
  impl_->timeout = timeout;
}

Milliseconds ProcessGroupGloo::timeout() const { return impl_->timeout.load(); }

WorkHandle ProcessGroupGloo::all_reduce(const std::vector<Tensor>& tensors, ReduceOp op) {
  detail::check_all_reduce(tensors, op, check_cpu_tensor);
  return impl_->enqueue("all_reduce", str(summarize(tensors), ", ", reduce_op_name(op)),
                        [impl = impl_.get(), tensors, op] { impl->all_reduce(tensors, op); });
}

WorkHandle ProcessGroupGloo::broadcast(const Tensor& tensor, int root) {
  detail::check_broadcast(tensor, root, size(), check_cpu_tensor);
  return impl_->enqueue("broadcast", str(summarize({tensor}), ", root ", root),
                        [impl = impl_.get(), tensor, root] { impl->broadcast(tensor, root); });
}

WorkHandle ProcessGroupGloo::all_gather_into(const Tensor& output, const Tensor& input) {
  detail::check_all_gather_into(output, input, size(), check_cpu_tensor);
  return impl_->enqueue("all_gather", summarize({input}),
                        [impl = impl_.get(), output, input] { impl->all_gather_into(output, input); });
}

WorkHandle ProcessGroupGloo::all_gather(const std::vector<Tensor>& outputs, const Tensor& input) {
  detail::check_all_gather(outputs, input, size(), check_cpu_tensor);
  return impl_->enqueue("all_gather", summarize({input}), [impl = impl_.get(), outputs, input, world = size()] {
    Tensor flat = Tensor::empty({input.numel() * world}, input.dtype());
    impl->all_gather_into(flat, input);
    for (int r = 0; r < world; ++r) copy_cpu(outputs[r], view_into(flat, outputs[r].sizes(), r * input.numel()));
  });
}

WorkHandle ProcessGroupGloo::reduce_scatter_from(const Tensor& output, const Tensor& input, ReduceOp op) {
  detail::check_reduce_scatter_from(output, input, op, size(), check_cpu_tensor);
  return impl_->enqueue("reduce_scatter", str(summarize({input}), ", ", reduce_op_name(op)),
                        [impl = impl_.get(), output, input, op] { impl->reduce_scatter_from(output, input, op); });
}

WorkHandle ProcessGroupGloo::reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op) {
  detail::check_reduce_scatter(output, inputs, op, size(), check_cpu_tensor);
  return impl_->enqueue("reduce_scatter", str(summarize(inputs), ", ", reduce_op_name(op)),
                        [impl = impl_.get(), output, inputs, op, world = size()] {
                          Tensor flat = Tensor::empty({output.numel() * world}, output.dtype());
                          for (int r = 0; r < world; ++r)
                            copy_cpu(view_into(flat, inputs[r].sizes(), r * output.numel()), inputs[r]);
                          impl->reduce_scatter_from(output, flat, op);
                        });
}

WorkHandle ProcessGroupGloo::barrier() {
  return impl_->enqueue("barrier", str(size(), " ranks"), [impl = impl_.get()] { impl->barrier(); });
}

}  // namespace loom::dist

// loomrun's elastic rendezvous: rounds joined through atomic counters in a TCPStore.
#include <loom/dist/elastic_rendezvous.h>

#include <thread>

#include <loom/core/error.h>

namespace loom::dist {

namespace {

using Clock = std::chrono::steady_clock;

// Added to a round's join counter when it closes: a later add() sees a value
// this large and knows it came too late.
constexpr int64_t kClosed = int64_t{1} << 40;
constexpr auto kPoll = std::chrono::milliseconds(50);

std::string joined_key(int round) { return str("/loomrun/rdzv/", round, "/joined"); }
std::string size_key(int round) { return str("/loomrun/rdzv/", round, "/size"); }

}  // namespace

ElasticRendezvous::ElasticRendezvous(const std::string& host, int port, ElasticRendezvousOptions options)
    : options_(std::move(options)) {
  LOOM_CHECK(options_.min_nodes() >= 1 && options_.min_nodes() <= options_.max_nodes(), "--nnodes=",
             options_.min_nodes(), ":", options_.max_nodes(), ": MIN must be at least 1 and at most MAX");
  try {
    store_ = std::make_unique<TCPStore>(host, port, TCPStoreOptions().is_server(true));
  } catch (const Error&) {
    store_ = std::make_unique<TCPStore>(host, port, TCPStoreOptions().timeout(options_.join_timeout()));
  }
}

RendezvousRound ElasticRendezvous::join(int after) {
  const auto deadline = Clock::now() + options_.join_timeout();
  // Rounds closed before this node came count it past kClosed: it goes on to
  // the next, and joins the first open one (which running launchers then see
  // it waiting in).
  int round = after + 1;
  while (true) {
    const int64_t order = store_->add(joined_key(round), 1);
    if (order > kClosed) {
      ++round;
      continue;
    }
    if (order == 1) {
      // The first to join closes the round: at max_nodes, or a last call after min_nodes.
      std::optional<Clock::time_point> last_call;
      while (true) {
        const int64_t joined = store_->add(joined_key(round), 0);
        if (joined >= options_.min_nodes() && !last_call) last_call = Clock::now() + options_.last_call();
        if (joined >= options_.max_nodes() || (last_call && Clock::now() >= *last_call)) break;
        LOOM_CHECK(Clock::now() < deadline, "rendezvous round ", round, ": ", joined, " of at least ",
                   options_.min_nodes(), " nodes joined within the join timeout");
        std::this_thread::sleep_for(kPoll);
      }
      const int64_t joined = store_->add(joined_key(round), kClosed) - kClosed;  // closes: later joiners see > kClosed
      const int64_t nodes = std::min<int64_t>(joined, options_.max_nodes());
      store_->set(size_key(round), std::to_string(nodes));
    }
    store_->wait({size_key(round)}, options_.join_timeout() + options_.last_call());
    const Bytes size = store_->get(size_key(round));
    const int nodes = std::stoi(std::string(size.begin(), size.end()));
    if (order <= nodes) return {round, static_cast<int>(order - 1), nodes};
    ++round;  // joined past max_nodes: the next round
  }
}

bool ElasticRendezvous::node_waiting(int round) {
  const int64_t joined = store_->add(joined_key(round + 1), 0);
  return joined > 0 && joined < kClosed;
}

}  // namespace loom::dist

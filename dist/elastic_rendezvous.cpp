// loomrun's elastic rendezvous: rounds joined through atomic counters in a TCPStore.
#include <loom/dist/elastic_rendezvous.h>

#include <optional>
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
// Launchers of the round that left it (their processes ended).
std::string left_key(int round) { return str("/loomrun/rdzv/", round, "/left"); }
// Heartbeats of the round's launchers, one counter for all: it stands still
// only when every launcher still in the round is gone.
std::string heartbeat_key(int round) { return str("/loomrun/rdzv/", round, "/heartbeat"); }

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

ElasticRendezvous::~ElasticRendezvous() {
  try {
    leave();
  } catch (const std::exception&) {
    // The store's host went away first: nobody waits for this node's leave.
  }
}

void ElasticRendezvous::leave() {
  if (current_round_ < 0) return;
  store_->add(left_key(current_round_), 1);
  current_round_ = -1;
}

void ElasticRendezvous::wait_until_left(int round, Clock::time_point deadline) {
  store_->wait({size_key(round)}, options_.join_timeout());  // set right after the round closed
  const Bytes size = store_->get(size_key(round));
  const int64_t nodes = std::stoll(std::string(size.begin(), size.end()));
  int64_t last_heartbeat = -1;
  auto heartbeat_changed = Clock::now();
  while (true) {
    const int64_t left = store_->add(left_key(round), 0);
    if (left >= nodes) return;
    const int64_t heartbeat = store_->add(heartbeat_key(round), 0);
    if (heartbeat != last_heartbeat) {
      last_heartbeat = heartbeat;
      heartbeat_changed = Clock::now();
    } else if (Clock::now() - heartbeat_changed >= options_.heartbeat_timeout()) {
      return;  // the launchers still in it are silent: dead (their processes died with them)
    }
    LOOM_CHECK(Clock::now() < deadline, "rendezvous round ", round + 1, ": ", nodes - left, " of the ", nodes,
               " nodes of round ", round, " did not leave it within the join timeout (while a round of --nnodes MAX ",
               "nodes runs, a further node waits for it to end, as torchrun parks it)");
    std::this_thread::sleep_for(kPoll);
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
    leave();  // only now: the closer of this round never sees the previous one left without this node here
    if (order > kClosed) {
      ++round;
      continue;
    }
    if (order == 1) {
      // The first to join closes the round: once the previous round's
      // launchers left it (their processes ended), at max_nodes, or a last
      // call after min_nodes.
      if (round > 0) wait_until_left(round - 1, deadline);
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
    if (order <= nodes) {
      current_round_ = round;
      return {round, static_cast<int>(order - 1), nodes};
    }
    ++round;  // joined past max_nodes: the next round
  }
}

bool ElasticRendezvous::node_waiting(int round) {
  store_->add(heartbeat_key(round), 1);
  const int64_t joined = store_->add(joined_key(round + 1), 0);
  if (joined <= 0 || joined >= kClosed) return false;
  // A full round goes on: the node waits (parked) until it ends.
  const Bytes size = store_->get(size_key(round));
  return std::stoi(std::string(size.begin(), size.end())) < options_.max_nodes();
}

}  // namespace loom::dist

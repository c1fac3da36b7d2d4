// The rendezvous of loomrun's elastic mode (--nnodes MIN:MAX), torchrun's c10d
// semantics over a TCPStore at the rendezvous endpoint: the launchers of a
// round join it; once MIN have joined it stays open until MAX have, or until
// the last call after MIN ran out, then closes with the nodes that joined
// (node ranks in join order). A round never closes while launchers of the
// round before it are still in it (their processes may still run and write
// the checkpoint directory): as torchrun's join waits for the previous
// round's participants to leave, it waits until each has joined this one or
// gone quiet (no heartbeat, a launcher that died). A launcher that comes while
// a round of fewer than MAX nodes runs joins the next one, and the running
// launchers see it waiting and start a new round with it; one that comes
// while a round of MAX nodes runs is parked in the next round (as torchrun's
// redundancy list) until that round ends. The launcher that bound the
// endpoint hosts the store; it must stay for the whole job, as torchrun's c10d
// host must.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <loom/core/options.h>
#include <loom/dist/store.h>

namespace loom::dist {

class ElasticRendezvousOptions {
  // Nodes a round needs at least, and takes at most.
  LOOM_OPTION(int, min_nodes) = 1;
  LOOM_OPTION(int, max_nodes) = 1;
  // How long a round waits for min_nodes (and for the previous round's
  // launchers to leave) before the join fails (torchrun's timeout).
  LOOM_OPTION(std::chrono::milliseconds, join_timeout) = std::chrono::seconds(600);
  // How long a round with min_nodes waits for more before it closes (torchrun's last_call_timeout).
  LOOM_OPTION(std::chrono::milliseconds, last_call) = std::chrono::seconds(30);
  // A launcher of the previous round that neither left it nor sent a
  // heartbeat (node_waiting()) for this long is taken as dead: the next round
  // no longer waits for it (torchrun: keep_alive_interval x keep_alive_max_attempt).
  LOOM_OPTION(std::chrono::milliseconds, heartbeat_timeout) = std::chrono::seconds(5);
};

// Where this node stands in a closed round.
struct RendezvousRound {
  int round = 0;      // the workers' TORCHELASTIC_RESTART_COUNT and store prefix
  int node_rank = 0;  // in join order
  int nodes = 1;
};

class ElasticRendezvous {
 public:
  // Hosts the store at host:port when it can bind it, else joins the one there.
  ElasticRendezvous(const std::string& host, int port, ElasticRendezvousOptions options);
  // Leaves the round this node is in (see leave()). Never throws.
  ~ElasticRendezvous();
  ElasticRendezvous(const ElasticRendezvous&) = delete;
  ElasticRendezvous& operator=(const ElasticRendezvous&) = delete;

  // Joins the first round this node can still join after `after` (-1: any),
  // leaves the round it was in (once in the next, so that the next round's
  // closer never misses it), waits until the round closes and returns this
  // node's place in it. Throws when min_nodes did not join, or the previous
  // round's launchers did not leave it, within join_timeout.
  RendezvousRound join(int after = -1);
  // Whether a node waits to join the round after `round` and the running
  // round (of this node) has fewer than max_nodes, so that it must end to take
  // it in. Each call is also this node's heartbeat in `round`: call it
  // regularly while the round's processes run and while they stop.
  bool node_waiting(int round);
  // Tells the store this node left its round: its processes have ended. Join
  // and the destructor call it; idempotent.
  void leave();
  int port() const { return store_->port(); }

 private:
  // Waits (until `deadline`) for every launcher of `round` to leave it or go quiet.
  void wait_until_left(int round, std::chrono::steady_clock::time_point deadline);

  ElasticRendezvousOptions options_;
  std::unique_ptr<TCPStore> store_;
  int current_round_ = -1;  // the round this node is in and has not left; -1: none
};

}  // namespace loom::dist

// The rendezvous of loomrun's elastic mode (--nnodes MIN:MAX), torchrun's c10d
// semantics over a TCPStore at the rendezvous endpoint: the launchers of a
// round join it; once MIN have joined it stays open until MAX have, or until
// the last call after MIN ran out, then closes with the nodes that joined
// (node ranks in join order). A launcher that comes while a round runs joins
// the next one, and the running launchers see it waiting and start a new
// round with it. The launcher that bound the endpoint hosts the store; it must
// stay for the whole job, as torchrun's c10d host must.
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
  // How long a round waits for min_nodes before the join fails (torchrun's timeout).
  LOOM_OPTION(std::chrono::milliseconds, join_timeout) = std::chrono::seconds(600);
  // How long a round with min_nodes waits for more before it closes (torchrun's last_call_timeout).
  LOOM_OPTION(std::chrono::milliseconds, last_call) = std::chrono::seconds(30);
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
  // Joins the first round this node can still join after `after` (-1: any),
  // waits until it closes and returns this node's place in it. Throws when
  // min_nodes did not join within join_timeout.
  RendezvousRound join(int after = -1);
  // Whether a node waits to join the round after `round` (the running round must end).
  bool node_waiting(int round);
  int port() const { return store_->port(); }

 private:
  ElasticRendezvousOptions options_;
  std::unique_ptr<TCPStore> store_;
};

}  // namespace loom::dist

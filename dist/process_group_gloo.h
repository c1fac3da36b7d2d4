// ProcessGroupGloo: collectives on CPU tensors over libgloo's TCP transport,
// rendezvous through a loom Store, executed in order on one worker thread.
#pragma once

#include <memory>
#include <string>

#include <loom/dist/process_group.h>

namespace loom::dist {

class GlooOptions {
  // Timeout per collective, and for connecting the mesh.
  LOOM_OPTION(Milliseconds, timeout) = kDefaultCollectiveTimeout;
  // Network interface to listen on ("eth0"); wins over `hostname`. Empty: the
  // LOOM_SOCKET_IFNAME or GLOO_SOCKET_IFNAME variable when set.
  LOOM_OPTION(std::string, interface);
  // Address or host name to listen on; empty: this host's name.
  LOOM_OPTION(std::string, hostname);
};

// The local address this host uses to reach `master_addr` (loopback when the
// master is local); "" when it cannot be determined.
std::string local_address_towards(const std::string& master_addr);

// Supports f32, f64, f16, bf16, i64 and i32 tensors on the CPU (f16 / bf16
// are reduced through float). After a collective fails (peer death, timeout)
// the group is broken: every later collective fails with the first error.
class ProcessGroupGloo final : public ProcessGroup {
 public:
  // Connects the full mesh of `size` ranks through `store` (blocking); throws
  // when a rank does not show up within options.timeout.
  ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size, GlooOptions options = {});
  // Fails collectives that have not started, waits for the running one.
  ~ProcessGroupGloo() override;

  const char* backend_name() const override { return "gloo"; }

  using ProcessGroup::all_reduce;
  WorkHandle all_reduce(const std::vector<Tensor>& tensors, ReduceOp op = ReduceOp::sum) override;
  WorkHandle broadcast(const Tensor& tensor, int root = 0) override;
  WorkHandle all_gather(const std::vector<Tensor>& outputs, const Tensor& input) override;
  WorkHandle all_gather_into(const Tensor& output, const Tensor& input) override;
  WorkHandle reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs,
                            ReduceOp op = ReduceOp::sum) override;
  WorkHandle reduce_scatter_from(const Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::sum) override;
  WorkHandle barrier() override;

  void set_timeout(Milliseconds timeout) override;
  Milliseconds timeout() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::dist

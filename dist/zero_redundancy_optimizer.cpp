#include <loom/dist/zero_redundancy_optimizer.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <utility>

#include <loom/core/autograd.h>
#include <loom/core/error.h>

namespace loom::dist {

namespace {

// An optimizer state name, "<group>.<index>.<kind>" (optim/optimizer.h).
struct SlotName {
  size_t group = 0, index = 0;
  std::string kind;
};

std::optional<SlotName> parse_slot_name(const std::string& name) {
  const size_t first = name.find('.');
  const size_t second = first == std::string::npos ? first : name.find('.', first + 1);
  if (second == std::string::npos || first == 0 || second == first + 1 || second + 1 == name.size()) return std::nullopt;
  const std::string group = name.substr(0, first), index = name.substr(first + 1, second - first - 1);
  if (group.find_first_not_of("0123456789") != std::string::npos ||
      index.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return SlotName{std::stoul(group), std::stoul(index), name.substr(second + 1)};
}

std::string slot_name(size_t group, size_t index, const std::string& kind) {
  return str(group, ".", index, ".", kind);
}

// `text` from rank `root` on every rank: its length, then its bytes in i64
// words (every backend moves i64; NCCL has no u8 in loom), on `device`.
std::string broadcast_text(ProcessGroup& group, const std::string& text, int root, Device device) {
  const bool sender = group.rank() == root;
  Tensor length = Tensor::full({1}, sender ? static_cast<double>(text.size()) : 0.0, DType::i64, device);
  group.broadcast(length, root)->wait();
  const auto size = static_cast<size_t>(length.to(Device::cpu()).to_vector<int64_t>()[0]);
  if (size == 0) return "";
  const auto words = static_cast<int64_t>((size + 7) / 8);
  Tensor packed = Tensor::zeros({words}, DType::i64);
  if (sender) std::memcpy(packed.raw_data(), text.data(), size);
  packed = packed.to(device);
  group.broadcast(packed, root)->wait();
  if (sender) return text;
  packed = packed.to(Device::cpu());
  return std::string(static_cast<const char*>(packed.raw_data()), size);
}

// Rank `root`'s `tensors` on every rank (`tensors` is read on the root only):
// their names, dtypes and shapes as lines of text, then the values
// (broadcast_coalesced) on `device`.
nn::NamedTensors broadcast_named_tensors(ProcessGroup& group, const nn::NamedTensors& tensors, int root,
                                         Device device) {
  std::ostringstream header;
  if (group.rank() == root) {
    for (const auto& [name, t] : tensors) {
      header << name << '\t' << dtype_name(t.dtype()) << '\t';
      for (size_t d = 0; d < t.sizes().size(); ++d) header << (d ? "," : "") << t.sizes()[d];
      header << '\n';
    }
  }
  std::istringstream lines(broadcast_text(group, header.str(), root, device));
  nn::NamedTensors received;
  std::string line;
  for (size_t i = 0; std::getline(lines, line); ++i) {
    if (group.rank() == root) {
      received.emplace_back(tensors[i].first, tensors[i].second.to(device).contiguous());
      continue;
    }
    const size_t tab = line.find('\t'), tab2 = line.find('\t', tab + 1);
    Shape shape;
    std::istringstream dims(line.substr(tab2 + 1));
    for (std::string dim; std::getline(dims, dim, ',');) shape.push_back(std::stoll(dim));
    received.emplace_back(line.substr(0, tab),
                          Tensor::empty(shape, parse_dtype(line.substr(tab + 1, tab2 - tab - 1)), device));
  }
  std::vector<Tensor> values;
  for (const auto& entry : received) values.push_back(entry.second);
  broadcast_coalesced(group, values, root);
  return received;
}

// Orders a consolidated state as the unsharded optimizer's state() orders
// it: by parameter, each parameter's kinds in the order its optimizer lists
// them (which a stable sort of the ranks' parts keeps).
void sort_like_unsharded(nn::NamedTensors& state) {
  std::stable_sort(state.begin(), state.end(), [](const auto& a, const auto& b) {
    const SlotName x = *parse_slot_name(a.first), y = *parse_slot_name(b.first);
    return std::pair(x.group, x.index) < std::pair(y.group, y.index);
  });
}

LocalOptimizerFactory sgd_factory(const optim::SGDOptions& options) {
  return [options](std::vector<Tensor> parameters) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::SGD>(std::move(parameters), options);
  };
}

LocalOptimizerFactory adam_factory(const optim::AdamOptions& options) {
  return [options](std::vector<Tensor> parameters) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::Adam>(std::move(parameters), options);
  };
}

}  // namespace

std::vector<std::vector<size_t>> partition_parameters(const std::vector<int64_t>& numels, int world) {
  LOOM_CHECK(world >= 1, "partition_parameters: world must be >= 1, got ", world);
  std::vector<size_t> order(numels.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return numels[a] > numels[b]; });
  std::vector<std::vector<size_t>> shards(static_cast<size_t>(world));
  std::vector<int64_t> sizes(static_cast<size_t>(world), 0);
  for (size_t index : order) {
    const auto rank = static_cast<size_t>(std::min_element(sizes.begin(), sizes.end()) - sizes.begin());
    shards[rank].push_back(index);
    sizes[rank] += numels[index];
  }
  for (auto& shard : shards) std::sort(shard.begin(), shard.end());
  return shards;
}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<Tensor> parameters, std::shared_ptr<ProcessGroup> group,
                                                 LocalOptimizerFactory make_local)
    : group_(std::move(group)) {
  LOOM_CHECK(group_ != nullptr, "ZeroRedundancyOptimizer: the process group is null");
  LOOM_CHECK(make_local != nullptr, "ZeroRedundancyOptimizer: the local optimizer factory is empty");
  LOOM_CHECK(!parameters.empty(), "ZeroRedundancyOptimizer: the parameter list is empty");
  std::vector<int64_t> numels;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const Tensor& p = parameters[i];
    LOOM_CHECK(p.defined(), "ZeroRedundancyOptimizer: parameter ", i, " is undefined");
    // One flat broadcast per shard, as PyTorch's: parameters of one dense type.
    LOOM_CHECK(p.dtype() == parameters[0].dtype() && p.device() == parameters[0].device(),
               "ZeroRedundancyOptimizer: every parameter must have one dtype and device; parameter ", i, " is ",
               p.str(), ", parameter 0 ", parameters[0].str());
    numels.push_back(p.numel());
  }
  shards_ = partition_parameters(numels, group_->size());
  for (const auto& shard : shards_) {
    std::vector<Tensor>& tensors = shard_tensors_.emplace_back();
    for (size_t index : shard) tensors.push_back(parameters[index]);
  }
  const std::vector<Tensor>& mine = shard_tensors_[static_cast<size_t>(group_->rank())];
  local_ = make_local(mine);
  LOOM_CHECK(local_ != nullptr, "ZeroRedundancyOptimizer: the local optimizer factory returned no optimizer");
  LOOM_CHECK(local_->num_groups() == 1 && local_->group_params(0).size() == mine.size() &&
                 std::equal(mine.begin(), mine.end(), local_->group_params(0).begin(),
                            [](const Tensor& a, const Tensor& b) { return a.is_same(b); }),
             "ZeroRedundancyOptimizer: the local optimizer must have one parameter group holding exactly the "
             "parameters it was built over");
  add_group(std::move(parameters), local_->lr(0));
  check_same_parameters_on_every_rank();
}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<Tensor> parameters, std::shared_ptr<ProcessGroup> group,
                                                 const optim::SGDOptions& options)
    : ZeroRedundancyOptimizer(std::move(parameters), std::move(group), sgd_factory(options)) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<Tensor> parameters, std::shared_ptr<ProcessGroup> group,
                                                 const optim::AdamOptions& options)
    : ZeroRedundancyOptimizer(std::move(parameters), std::move(group), adam_factory(options)) {}

void ZeroRedundancyOptimizer::check_same_parameters_on_every_rank() const {
  const int world = group_->size();
  if (world == 1) return;
  // (count, elements, a hash of the shapes) of every rank: a different list
  // would partition differently and the broadcasts would not match.
  int64_t elements = 0;
  uint64_t shapes = 0;
  for (const Tensor& p : groups_[0].params) {
    elements += p.numel();
    for (int64_t size : p.sizes()) shapes = shapes * 1000003 + static_cast<uint64_t>(size) + 1;
    shapes = shapes * 1000003 + static_cast<uint64_t>(p.dtype());
  }
  const std::vector<int64_t> mine = {static_cast<int64_t>(groups_[0].params.size()), elements,
                                     static_cast<int64_t>(shapes)};
  Tensor everyone = Tensor::zeros({3 * world}, DType::i64, group_->device());
  group_->all_gather_into(everyone, Tensor::from_vector(mine, {3}).to(group_->device()))->wait();
  const std::vector<int64_t> all = everyone.to(Device::cpu()).to_vector<int64_t>();
  for (int r = 0; r < world; ++r) {
    LOOM_CHECK(std::equal(mine.begin(), mine.end(), all.begin() + 3 * r), "ZeroRedundancyOptimizer: rank ", r, " has ",
               all[3 * r], " parameters of ", all[3 * r + 1], " elements, rank ", group_->rank(), " has ", mine[0],
               " of ", mine[1], " (or their shapes differ); every rank must pass the same parameters in the same order");
  }
}

void ZeroRedundancyOptimizer::step_if_finite(const Tensor& found_inf) {
  consolidated_to_.reset();
  consolidated_.clear();
  local_->set_lr(0, lr(0));
  local_->step_if_finite(found_inf);
  NoGradGuard no_grad;
  for (int rank = 0; rank < group_->size(); ++rank)
    broadcast_coalesced(*group_, shard_tensors_[static_cast<size_t>(rank)], rank);
}

nn::NamedTensors ZeroRedundancyOptimizer::local_state_in_full_names() const {
  const std::vector<size_t>& mine = shard(group_->rank());
  nn::NamedTensors state;
  for (auto& [name, t] : local_->state()) {
    const std::optional<SlotName> slot = parse_slot_name(name);
    LOOM_CHECK(slot && slot->group == 0 && slot->index < mine.size(), "ZeroRedundancyOptimizer: the local optimizer's "
               "state '", name, "' is not named '0.<index>.<kind>' for one of its ", mine.size(), " parameters");
    state.emplace_back(slot_name(0, mine[slot->index], slot->kind), t);
  }
  return state;
}

void ZeroRedundancyOptimizer::consolidate_state_dict(int to) {
  const int world = group_->size();
  LOOM_CHECK(to >= 0 && to < world, "consolidate_state_dict: rank ", to, " is not in the group of ", world);
  if (consolidated_to_ == to) return;
  NoGradGuard no_grad;
  const bool target = group_->rank() == to;
  nn::NamedTensors gathered;
  for (int rank = 0; rank < world; ++rank) {
    nn::NamedTensors part;
    if (rank == to) {
      if (target) part = local_state_in_full_names();
    } else {
      // A broadcast, as PyTorch's, for want of point-to-point sends: every rank takes part.
      part = broadcast_named_tensors(*group_, rank == group_->rank() ? local_state_in_full_names() : nn::NamedTensors{},
                                     rank, group_->device());
    }
    if (!target) continue;
    for (auto& [name, t] : part) gathered.emplace_back(name, t.to(Device::cpu()));
  }
  if (target) {
    sort_like_unsharded(gathered);
    consolidated_ = std::move(gathered);
  }
  consolidated_to_ = to;
}

nn::NamedTensors ZeroRedundancyOptimizer::state() const {
  LOOM_CHECK(consolidated_to_ == group_->rank(), "ZeroRedundancyOptimizer: rank ", group_->rank(),
             " holds only its shard of the optimizer state, and it was not consolidated on this rank since the last "
             "step; call consolidate_state_dict(", group_->rank(), ") on every rank first");
  return consolidated_;
}

void ZeroRedundancyOptimizer::load_state(const nn::NamedTensors& state) {
  consolidated_to_.reset();
  consolidated_.clear();
  const std::vector<size_t>& mine = shard(group_->rank());
  std::map<size_t, size_t> local_index;  // full list index -> position in the shard
  for (size_t i = 0; i < mine.size(); ++i) local_index[mine[i]] = i;
  nn::NamedTensors local;
  for (auto& [name, t] : state) {
    const std::optional<SlotName> slot = parse_slot_name(name);
    if (!slot || slot->group != 0) continue;  // not a parameter's state (the unsharded optimizer ignores it too)
    auto it = local_index.find(slot->index);
    if (it != local_index.end()) local.emplace_back(slot_name(0, it->second, slot->kind), t);
  }
  local_->load_state(local);
}

}  // namespace loom::dist

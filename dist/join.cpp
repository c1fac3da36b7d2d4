// Join: the per-iteration announce (one all-reduce of every rank's state),
// the joined rank's shadowing loop, and the joinables' attachment.
#include <loom/dist/join.h>

#include <algorithm>
#include <exception>

#include <loom/core/error.h>
#include <loom/core/log.h>

namespace loom::dist {

namespace {

// After this many shadowed iterations a joined rank warns once, as PyTorch does:
// inputs that uneven cost the running ranks an all-reduce each for nothing.
constexpr int64_t kSkewWarningIterations = 1000;

std::string rank_list(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size() && i < 8; ++i) text += str(i ? ", " : "", ranks[i]);
  if (ranks.size() > 8) text += str(" and ", ranks.size() - 8, " more");
  return text;
}

}  // namespace

void JoinHook::main_hook(const JoinIteration&) {}
void JoinHook::post_hook(int) {}
bool JoinHook::holds_contribution() const { return false; }

Joinable::~Joinable() {
  if (join_) join_->forget(*this);
}

std::optional<JoinIteration> Joinable::notify_join_context(bool synchronize) {
  if (!join_ || !first_) return std::nullopt;
  return join_->announce(synchronize ? Join::RankState::running_with_sync : Join::RankState::running_without_sync);
}

const JoinOptions* Joinable::join_options() const { return join_ ? &join_->options() : nullptr; }

Join::Join(std::vector<std::reference_wrapper<Joinable>> joinables, JoinOptions options) : options_(options) {
  LOOM_CHECK(!joinables.empty(), "Join: at least one joinable is needed (the DistributedDataParallel module)");
  for (Joinable& joinable : joinables) {
    const std::shared_ptr<ProcessGroup>& group = joinable.join_process_group();
    LOOM_CHECK(group != nullptr, "Join: a joinable has no process group");
    LOOM_CHECK(group_ == nullptr || group == group_,
               "Join: the joinables use different process groups; one Join announces over one group");
    group_ = group;
    LOOM_CHECK(joinable.join_ == nullptr, "Join: a joinable is already inside another Join; join() or end that one first");
    LOOM_CHECK(std::find(joinables_.begin(), joinables_.end(), &joinable) == joinables_.end(),
               "Join: the same joinable is listed twice");
    joinables_.push_back(&joinable);
  }
  for (Joinable* joinable : joinables_) hooks_.push_back(joinable->join_hook(options_));
  if (!options_.enable()) return;
  for (size_t i = 0; i < joinables_.size(); ++i) {
    joinables_[i]->join_ = this;
    joinables_[i]->first_ = i == 0;
  }
}

Join::~Join() {
  // Ended without join() and without an exception on its way: the other
  // ranks' next collectives find no partner on this rank and time out.
  if (options_.enable() && !joined_ && !failed_ && std::uncaught_exceptions() == uncaught_exceptions_)
    log_warn("Join: rank ", group_->rank(), " ended a Join without calling join(); ranks still running will wait ",
             "for it until their collectives time out");
  detach();
}

void Join::detach() noexcept {
  if (!options_.enable()) return;  // never attached (a joinable may be gone: it could not tell this Join)
  for (Joinable* joinable : joinables_) {
    if (joinable->join_ != this) continue;
    joinable->join_ = nullptr;
    joinable->first_ = false;
  }
}

void Join::forget(Joinable& joinable) noexcept {
  auto it = std::find(joinables_.begin(), joinables_.end(), &joinable);
  if (it == joinables_.end()) return;
  const auto index = it - joinables_.begin();
  joinable.join_ = nullptr;
  joinables_.erase(it);
  hooks_.erase(hooks_.begin() + index);
}

bool Join::all_ranks_active() const {
  return !last_iteration_ || last_iteration_->active_ranks == group_->size();
}

JoinIteration Join::announce(RankState state) {
  const int world = group_->size();
  const int rank = group_->rank();
  // Slot r holds rank r's state; the others add zeros, so the sum is every
  // rank's state (an all-gather as one small all-reduce, as PyTorch's count).
  std::vector<float> states(static_cast<size_t>(world), 0.0f);
  states[static_cast<size_t>(rank)] = static_cast<float>(state);
  if (world > 1) {
    Tensor slots = Tensor::from_vector(states, {world}).to(group_->device());
    group_->all_reduce(slots, ReduceOp::sum)->wait();
    states = slots.to(Device::cpu()).to_vector<float>();
  }
  JoinIteration iteration;
  iteration.index = last_iteration_ ? last_iteration_->index + 1 : 0;
  std::vector<int> with_sync, without_sync, holding, joined;
  for (int r = 0; r < world; ++r) {
    switch (static_cast<RankState>(static_cast<int>(states[static_cast<size_t>(r)] + 0.5f))) {
      case RankState::running_with_sync: with_sync.push_back(r); break;
      case RankState::running_without_sync: without_sync.push_back(r); break;
      case RankState::joined_holding_gradients: holding.push_back(r); joined.push_back(r); break;
      case RankState::joined: joined.push_back(r); break;
    }
  }
  iteration.active_ranks = static_cast<int>(with_sync.size() + without_sync.size());
  iteration.synchronize = !with_sync.empty();
  iteration.contributing_ranks = iteration.synchronize ? static_cast<int>(with_sync.size() + holding.size()) : 0;
  for (int r = 0; r < world && iteration.first_active_rank < 0; ++r) {
    const float value = states[static_cast<size_t>(r)];
    if (value > 1.5f) iteration.first_active_rank = r;
  }
  last_iteration_ = iteration;
  if (iteration.active_ranks > 0) authoritative_rank_ = iteration.first_active_rank;
  // Every rank saw the same states: these throw on every rank, or on none,
  // and end the Join everywhere.
  failed_ = (!with_sync.empty() && !without_sync.empty()) ||
            (options_.throw_on_early_termination() && !joined.empty() && iteration.active_ranks > 0);
  LOOM_CHECK(with_sync.empty() || without_sync.empty(), "Join: at iteration ", iteration.index,
             " the running ranks disagree whether backward all-reduces: rank(s) ", rank_list(without_sync),
             " run it under no_sync() and rank(s) ", rank_list(with_sync),
             " do not. Every rank must accumulate (no_sync) over the same iterations");
  LOOM_CHECK(!options_.throw_on_early_termination() || joined.empty() || iteration.active_ranks == 0,
             "Join: rank(s) ", rank_list(joined), " exhausted their inputs at iteration ", iteration.index,
             "; throw_on_early_termination stops every rank there");
  return iteration;
}

void Join::join() {
  if (joined_ || !options_.enable()) return;
  LOOM_CHECK(!joinables_.empty(), "Join::join: every joinable of this Join was destroyed before join()");
  joined_ = true;
  for (;;) {
    bool holding = false;
    for (const auto& hook : hooks_) holding = holding || hook->holds_contribution();
    const JoinIteration iteration = announce(holding ? RankState::joined_holding_gradients : RankState::joined);
    if (iteration.active_ranks == 0) break;
    for (const auto& hook : hooks_) hook->main_hook(iteration);
    if (++shadowed_iterations_ == kSkewWarningIterations)
      log_warn("Join: rank ", group_->rank(), " has shadowed ", kSkewWarningIterations,
               " iterations of the ranks still running: inputs this uneven cost them time");
  }
  detach();
  const int authoritative = std::max(authoritative_rank_, 0);  // rank 0 when no rank ran an iteration
  for (const auto& hook : hooks_) hook->post_hook(authoritative);
}

namespace {

class ShadowStepHook final : public JoinHook {
 public:
  explicit ShadowStepHook(const std::function<void()>& step) : step_(step) {}
  void main_hook(const JoinIteration& iteration) override {
    if (iteration.synchronize) step_();
  }

 private:
  const std::function<void()>& step_;
};

}  // namespace

ShadowStep::ShadowStep(std::shared_ptr<ProcessGroup> group, std::function<void()> step)
    : group_(std::move(group)), step_(std::move(step)) {
  LOOM_CHECK(group_ != nullptr, "ShadowStep: the process group is null");
  LOOM_CHECK(step_ != nullptr, "ShadowStep: the step function is empty");
}

std::unique_ptr<JoinHook> ShadowStep::join_hook(const JoinOptions&) { return std::make_unique<ShadowStepHook>(step_); }

}  // namespace loom::dist

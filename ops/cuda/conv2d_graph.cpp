// Fused convolution graphs (ops/cuda/conv2d_graph.h) through cuDNN's graph
// API, written with cudnn-frontend's graph builder (host C++). Compiled with
// LOOM_HAVE_CUDNN_FRONTEND and the frontend's headers only where the build
// found them (ops/CMakeLists.txt); without them every graph is refused.
#include <loom/ops/cuda/conv2d_graph.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <loom/core/cuda/counters.h>
#include <loom/core/cuda/handles.h>
#include <loom/core/cuda/runtime.h>
#include <loom/core/cuda/stream.h>
#include <loom/core/error.h>
#include <loom/core/log.h>
#include <loom/core/memory_format.h>

#if LOOM_HAVE_CUDNN_FRONTEND
#include <cudnn_frontend.h>
#endif

namespace loom::ops::cuda {
namespace lc = ::loom::cuda;

bool conv_graphs_built_in() {
#if LOOM_HAVE_CUDNN_FRONTEND
  return true;
#else
  return false;
#endif
}

bool conv_graphs_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("LOOM_CUDNN_GRAPH");
    return value != nullptr && std::strcmp(value, "1") == 0;
  }();
  return enabled;
}

namespace {

// The contract of conv2d_bn_prologue_stats (the header), checked before
// anything else; a violation is the caller's bug, not a refusal.
void check_prologue_stats_arguments(const Tensor& x, const Tensor& scale, const Tensor& bias, const Tensor& w,
                                    const Conv2dParams& params, const Tensor& y, const Tensor& sum,
                                    const Tensor& sq_sum) {
  const char* op = "conv2d_bn_prologue_stats";
  LOOM_CHECK(x.defined() && x.device().is_cuda() && x.dim() == 4, op, ": x must be a 4-d CUDA tensor, got ",
             x.defined() ? x.str() : "an undefined tensor");
  LOOM_CHECK(x.dtype() == DType::f16 || x.dtype() == DType::bf16, op, ": x must be f16 or bf16, got ",
             dtype_name(x.dtype()));
  const auto same_place = [&](const Tensor& t, DType dtype, const char* what) {
    LOOM_CHECK(t.defined() && t.device() == x.device() && t.dtype() == dtype, op, ": ", what, " must be ",
               dtype_name(dtype), " on ", x.device().str(), ", got ", t.defined() ? t.str() : "an undefined tensor");
  };
  same_place(w, x.dtype(), "w");
  same_place(scale, x.dtype(), "scale");
  same_place(bias, x.dtype(), "bias");
  same_place(y, x.dtype(), "y");
  same_place(sum, DType::f32, "sum");
  same_place(sq_sum, DType::f32, "sq_sum");
  const int64_t channels = x.size(1), out_channels = w.size(0);
  LOOM_CHECK(w.dim() == 4 && w.size(1) * params.groups == channels, op, ": w ", w.str(), " does not fit x ", x.str(),
             " with ", params.groups, " groups");
  for (const Tensor* t : {&x, &w, &y}) {
    LOOM_CHECK(is_channels_last(*t), op, ": x, w and y must be channels-last (NHWC strides), got ", t->str());
  }
  for (const Tensor* t : {&scale, &bias}) {
    LOOM_CHECK(t->dim() == 1 && t->size(0) == channels && t->is_contiguous(), op,
               ": scale and bias must be contiguous (", channels, "), got ", t->str());
  }
  for (const Tensor* t : {&sum, &sq_sum}) {
    LOOM_CHECK(t->dim() == 1 && t->size(0) == out_channels && t->is_contiguous(), op,
               ": sum and sq_sum must be contiguous (", out_channels, "), got ", t->str());
  }
  const Size2 out_hw = conv2d_output_size({x.size(2), x.size(3)}, {w.size(2), w.size(3)}, params);
  const Shape out_sizes{x.size(0), out_channels, out_hw[0], out_hw[1]};
  LOOM_CHECK(y.sizes() == out_sizes, op, ": y must be ", shape_str(out_sizes), ", got ", y.str());
}

}  // namespace

#if LOOM_HAVE_CUDNN_FRONTEND

namespace {
namespace fe = cudnn_frontend;

// The user tensors' ids in a graph's variant pack.
enum Uid : int64_t { kX = 1, kScale, kBias, kW, kY, kSum, kSqSum };

// A cached outcome: a built graph and its workspace, or cuDNN's refusal.
struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;  // null when refused
  int64_t workspace_bytes = 0;
  std::string refusal;  // the step that failed and what cuDNN said
};

// Strides of a channels-last tensor of `sizes` (N, C, H, W): canonical, so
// that size-1 dims with unusual strides do not matter.
std::vector<int64_t> channels_last_strides(const Shape& s) {
  return {s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]};
}

fe::DataType_t graph_type(DType dtype) { return dtype == DType::f16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16; }

// The step that failed and cuDNN's message, or "" when `status` is good.
std::string failure(const char* step, fe::error_t status) {
  if (status.is_good()) return "";
  return std::string(step) + ": " + status.get_message();
}

// Builds the prologue + conv + statistics graph for these shapes on `handle`'s
// device; a Plan without a graph when cuDNN refuses it at any step.
Plan build_prologue_stats(cudnnHandle_t handle, DType dtype, const Shape& x_sizes, const Shape& w_sizes,
                          const Shape& y_sizes, const Conv2dParams& params) {
  auto graph = std::make_shared<fe::graph::Graph>();
  // Storage in x's dtype, everything between the ops and every accumulation in f32.
  graph->set_io_data_type(graph_type(dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const int64_t channels = x_sizes[1], out_channels = w_sizes[0];
  const std::vector<int64_t> per_channel_dims{1, channels, 1, 1}, per_channel_strides{channels, 1, channels, channels};

  auto x = graph->tensor(fe::graph::Tensor_attributes().set_name("x").set_uid(kX).set_dim(x_sizes).set_stride(
      channels_last_strides(x_sizes)));
  auto scale = graph->tensor(
      fe::graph::Tensor_attributes().set_name("scale").set_uid(kScale).set_dim(per_channel_dims).set_stride(
          per_channel_strides));
  auto bias = graph->tensor(
      fe::graph::Tensor_attributes().set_name("bias").set_uid(kBias).set_dim(per_channel_dims).set_stride(
          per_channel_strides));
  auto w = graph->tensor(fe::graph::Tensor_attributes().set_name("w").set_uid(kW).set_dim(w_sizes).set_stride(
      channels_last_strides(w_sizes)));

  // Prologue: a = max(x * scale + bias, 0), per input channel.
  auto scaled = graph->pointwise(x, scale, fe::graph::Pointwise_attributes().set_name("scale").set_mode(
                                               fe::PointwiseMode_t::MUL));
  auto shifted = graph->pointwise(scaled, bias, fe::graph::Pointwise_attributes().set_name("bias").set_mode(
                                                    fe::PointwiseMode_t::ADD));
  auto active = graph->pointwise(shifted, fe::graph::Pointwise_attributes().set_name("relu").set_mode(
                                              fe::PointwiseMode_t::RELU_FWD));
  auto y = graph->conv_fprop(active, w,
                             fe::graph::Conv_fprop_attributes()
                                 .set_name("conv")
                                 .set_padding({params.padding[0], params.padding[1]})
                                 .set_stride({params.stride[0], params.stride[1]})
                                 .set_dilation({params.dilation[0], params.dilation[1]}));
  y->set_output(true).set_uid(kY).set_data_type(graph_type(dtype)).set_dim(y_sizes).set_stride(
      channels_last_strides(y_sizes));
  // Epilogue: per-channel sum and sum of squares of y, (1, K, 1, 1) f32.
  auto [sum, sq_sum] = graph->genstats(y, fe::graph::Genstats_attributes().set_name("stats"));
  for (const auto& [stat, uid] : {std::pair{sum, kSum}, std::pair{sq_sum, kSqSum}}) {
    stat->set_output(true).set_uid(uid).set_data_type(fe::DataType_t::FLOAT).set_dim({1, out_channels, 1, 1}).set_stride(
        {out_channels, 1, out_channels, out_channels});
  }

  Plan plan;
  plan.refusal = failure("validate", graph->validate());
  if (plan.refusal.empty()) plan.refusal = failure("build_operation_graph", graph->build_operation_graph(handle));
  if (plan.refusal.empty()) {
    plan.refusal = failure("create_execution_plans",
                           graph->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}));
  }
  if (plan.refusal.empty()) plan.refusal = failure("check_support", graph->check_support(handle));
  if (plan.refusal.empty()) {
    plan.refusal = failure("build_plans", graph->build_plans(handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE));
  }
  if (plan.refusal.empty()) plan.refusal = failure("get_workspace_size", graph->get_workspace_size(plan.workspace_bytes));
  if (plan.refusal.empty()) {
    plan.graph = std::move(graph);
  } else {
    // Once per shape (refusals are cached): LOOM_LOG_LEVEL=debug shows why.
    log_debug("cuDNN graph conv2d_bn_prologue_stats refused for x ", shape_str(x_sizes), " w ", shape_str(w_sizes),
              " ", dtype_name(dtype), "; the unfused ops run instead. ", plan.refusal);
  }
  return plan;
}

// Plans by key, refusals included, for the process's life. A plan is built
// once under the lock (building takes milliseconds; a step's graphs are built
// in its first iteration).
std::mutex g_plans_mutex;
std::map<ConvGraphKey, std::shared_ptr<const Plan>> g_plans;

template <class Build>
std::shared_ptr<const Plan> cached_plan(const ConvGraphKey& key, Build&& build) {
  std::lock_guard lock(g_plans_mutex);
  auto found = g_plans.find(key);
  if (found == g_plans.end()) found = g_plans.emplace(key, std::make_shared<const Plan>(build())).first;
  return found->second;
}

}  // namespace

bool conv2d_bn_prologue_stats(const Tensor& x, const Tensor& scale, const Tensor& bias, const Tensor& w,
                              const Conv2dParams& params, const Tensor& y, const Tensor& sum, const Tensor& sq_sum) {
  check_prologue_stats_arguments(x, scale, bias, w, params, y, sum, sq_sum);
  if (params.groups != 1) {
    lc::detail::count_graph_fallback();
    return false;
  }
  const int device = x.device().index;
  const lc::DeviceGuard device_guard(device);
  cudnnHandle_t handle = lc::cudnn_handle(lc::current_stream(device));
  const ConvGraphKey key =
      conv_graph_key(ConvGraphKind::forward_prologue_stats, device, x.dtype(), x.sizes(), w.sizes(), params);
  const std::shared_ptr<const Plan> plan = cached_plan(
      key, [&] { return build_prologue_stats(handle, x.dtype(), x.sizes(), w.sizes(), y.sizes(), params); });
  if (!plan->graph) {
    lc::detail::count_graph_fallback();
    return false;
  }
  std::unordered_map<int64_t, void*> pack{{kX, x.raw_data()},     {kScale, scale.raw_data()}, {kBias, bias.raw_data()},
                                          {kW, w.raw_data()},     {kY, y.raw_data()},         {kSum, sum.raw_data()},
                                          {kSqSum, sq_sum.raw_data()}};
  const lc::DeviceBuffer workspace(static_cast<size_t>(plan->workspace_bytes), device);
  fe::error_t status = plan->graph->execute(handle, pack, workspace.data());
  LOOM_CHECK(status.is_good(), "conv2d_bn_prologue_stats: cuDNN failed to run the graph it built for x ", x.str(),
             " and w ", w.str(), ": ", status.get_message());
  lc::detail::count_library_call();
  return true;
}

#else  // no cudnn-frontend: every graph is refused

bool conv2d_bn_prologue_stats(const Tensor& x, const Tensor& scale, const Tensor& bias, const Tensor& w,
                              const Conv2dParams& params, const Tensor& y, const Tensor& sum, const Tensor& sq_sum) {
  check_prologue_stats_arguments(x, scale, bias, w, params, y, sum, sq_sum);
  lc::detail::count_graph_fallback();
  return false;
}

#endif

}  // namespace loom::ops::cuda

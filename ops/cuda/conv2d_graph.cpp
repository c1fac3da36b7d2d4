// Fused convolution graphs (ops/cuda/conv2d_graph.h) through cuDNN's graph
// API, written with cudnn-frontend's graph builder (host C++). Compiled with
// LOOM_HAVE_CUDNN_FRONTEND and the frontend's headers only where the build
// found them (ops/CMakeLists.txt); without them every graph is refused.
#include <loom/ops/cuda/conv2d_graph.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
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
  static const bool enabled = conv_graphs_switch(std::getenv("LOOM_CUDNN_GRAPH"));
  return enabled;
}

namespace {

enum class Layout { channels_last, contiguous };

// Checks that `t` is defined, on `device`, of `dtype` and `sizes`, in `layout`.
void require(const char* op, const char* what, const Tensor& t, Device device, DType dtype, const Shape& sizes,
             Layout layout) {
  LOOM_CHECK(t.defined() && t.device() == device && t.dtype() == dtype && t.sizes() == sizes, op, ": ", what,
             " must be ", dtype_name(dtype), shape_str(sizes), " on ", device.str(), ", got ",
             t.defined() ? t.str() : "an undefined tensor");
  const bool laid_out = layout == Layout::channels_last ? is_channels_last(t) : t.is_contiguous();
  LOOM_CHECK(laid_out, op, ": ", what, " must be ", layout == Layout::channels_last ? "channels-last (NHWC strides)" : "contiguous",
             ", got ", t.str(), " with strides ", shape_str(t.strides()));
}

// The checks both graphs open with: x (the convolution's input, or its
// gradient's place) a 4-d f16 / bf16 CUDA tensor, w fitting it. Returns the
// convolution's output sizes.
Shape check_convolution(const char* op, const Tensor& x, const Tensor& w, const Conv2dParams& params) {
  LOOM_CHECK(x.defined() && x.device().is_cuda() && x.dim() == 4, op, ": x must be a 4-d CUDA tensor, got ",
             x.defined() ? x.str() : "an undefined tensor");
  LOOM_CHECK(x.dtype() == DType::f16 || x.dtype() == DType::bf16, op, ": x must be f16 or bf16, got ",
             dtype_name(x.dtype()));
  LOOM_CHECK(w.defined() && w.dim() == 4 && w.size(1) * params.groups == x.size(1), op, ": w ",
             w.defined() ? w.str() : "(undefined)", " does not fit x ", x.str(), " with ", params.groups, " groups");
  require(op, "x", x, x.device(), x.dtype(), x.sizes(), Layout::channels_last);
  require(op, "w", w, x.device(), x.dtype(), w.sizes(), Layout::channels_last);
  const Size2 out_hw = conv2d_output_size({x.size(2), x.size(3)}, {w.size(2), w.size(3)}, params);
  return {x.size(0), w.size(0), out_hw[0], out_hw[1]};
}

// The contract of conv2d_bn_prologue_stats (the header), checked before
// anything else; a violation is the caller's bug, not a refusal.
void check_prologue_stats_arguments(const Tensor& x, const Tensor& scale, const Tensor& bias, const Tensor& w,
                                    const Conv2dParams& params, const Tensor& y, const Tensor& sum,
                                    const Tensor& sq_sum) {
  const char* op = "conv2d_bn_prologue_stats";
  const Shape out_sizes = check_convolution(op, x, w, params);
  const Shape channels{x.size(1)}, out_channels{w.size(0)};
  require(op, "scale", scale, x.device(), x.dtype(), channels, Layout::contiguous);
  require(op, "bias", bias, x.device(), x.dtype(), channels, Layout::contiguous);
  require(op, "y", y, x.device(), x.dtype(), out_sizes, Layout::channels_last);
  require(op, "sum", sum, x.device(), DType::f32, out_channels, Layout::contiguous);
  require(op, "sq_sum", sq_sum, x.device(), DType::f32, out_channels, Layout::contiguous);
}

// The contract of conv2d_wgrad_bn_prologue.
void check_wgrad_prologue_arguments(const Tensor& dy, const Tensor& x, const Tensor& scale, const Tensor& bias,
                                    const Conv2dParams& params, const Tensor& dw) {
  const char* op = "conv2d_wgrad_bn_prologue";
  LOOM_CHECK(dw.defined() && dw.dim() == 4, op, ": dw must be a 4-d tensor, got ",
             dw.defined() ? dw.str() : "an undefined tensor");
  const Shape out_sizes = check_convolution(op, x, dw, params);
  require(op, "dy", dy, x.device(), x.dtype(), out_sizes, Layout::channels_last);
  const Shape channels{x.size(1)};
  require(op, "scale", scale, x.device(), x.dtype(), channels, Layout::contiguous);
  require(op, "bias", bias, x.device(), x.dtype(), channels, Layout::contiguous);
}

// The contract of conv2d_dgrad_relu_bn_backward.
void check_dgrad_relu_bn_arguments(const Tensor& dy, const Tensor& w, const Tensor& x, const BatchNormSaved& saved,
                                   const Conv2dParams& params, const BatchNormBackwardTerms& out) {
  const char* op = "conv2d_dgrad_relu_bn_backward";
  const Shape out_sizes = check_convolution(op, x, w, params);
  require(op, "dy", dy, x.device(), x.dtype(), out_sizes, Layout::channels_last);
  require(op, "dz", out.dz, x.device(), x.dtype(), x.sizes(), Layout::channels_last);
  const Shape channels{x.size(1)};
  const std::pair<const Tensor*, const char*> per_channel[] = {
      {&saved.mean, "mean"},     {&saved.invstd, "invstd"},           {&saved.gamma, "gamma"},
      {&saved.beta, "beta"},     {&out.dgamma, "dgamma"},             {&out.dbeta, "dbeta"},
      {&out.eq_scale_dy, "eq_scale_dy"}, {&out.eq_scale_x, "eq_scale_x"}, {&out.eq_bias, "eq_bias"}};
  for (const auto& [t, what] : per_channel) require(op, what, *t, x.device(), DType::f32, channels, Layout::contiguous);
}

}  // namespace

#if LOOM_HAVE_CUDNN_FRONTEND

namespace {
namespace fe = cudnn_frontend;
using TensorNode = std::shared_ptr<fe::graph::Tensor_attributes>;

// The user tensors' ids in a graph's variant pack.
enum Uid : int64_t {
  kX = 1, kScale, kBias, kW, kY, kSum, kSqSum,                                // forward
  kDy, kMean, kInvstd, kGamma, kBeta, kDz, kDgamma, kDbeta, kEqScaleDy, kEqScaleX, kEqBias,  // backward
  kDw                                                                                          // weight gradient
};

// A cached outcome: a built graph and its workspace, or cuDNN's refusal.
struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;  // null when refused
  int64_t workspace_bytes = 0;
  std::string refusal;  // the step that failed and what cuDNN said
};

// Strides of a channels-last tensor of `sizes` (N, C, H, W): canonical, so
// that size-1 dims with unusual strides do not matter.
std::vector<int64_t> channels_last_strides(const Shape& s) { return {s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]}; }

fe::DataType_t graph_type(DType dtype) { return dtype == DType::f16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16; }

// A graph whose storage is `dtype` and whose intermediates and accumulations are f32.
std::shared_ptr<fe::graph::Graph> new_graph(DType dtype) {
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(graph_type(dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return graph;
}

// A user tensor of `sizes`, channels-last, of the graph's io type.
TensorNode image(fe::graph::Graph& graph, const char* name, Uid uid, const Shape& sizes) {
  return graph.tensor(
      fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(sizes).set_stride(channels_last_strides(sizes)));
}

// A (1, C, 1, 1) per-channel tensor; f32 unless `type` says otherwise.
fe::graph::Tensor_attributes per_channel(const char* name, Uid uid, int64_t channels,
                                         fe::DataType_t type = fe::DataType_t::FLOAT) {
  return fe::graph::Tensor_attributes()
      .set_name(name)
      .set_uid(uid)
      .set_dim({1, channels, 1, 1})
      .set_stride({channels, 1, channels, channels})
      .set_data_type(type);
}

// Marks a graph output node as the user tensor `uid` of `like`'s shape and type.
void as_output(const TensorNode& node, const fe::graph::Tensor_attributes& like) {
  node->set_output(true).set_uid(like.get_uid()).set_dim(like.get_dim()).set_stride(like.get_stride()).set_data_type(
      like.get_data_type());
}

fe::graph::Pointwise_attributes pointwise(const char* name, fe::PointwiseMode_t mode) {
  return fe::graph::Pointwise_attributes().set_name(name).set_mode(mode);
}

// The step that failed and cuDNN's message, or "" when `status` is good.
std::string failure(const char* step, fe::error_t status) {
  if (status.is_good()) return "";
  return std::string(step) + ": " + status.get_message();
}

// Validates, lowers, picks and builds `graph` on `handle`'s device: a Plan
// without a graph when cuDNN refuses it at any step.
Plan finish(std::shared_ptr<fe::graph::Graph> graph, cudnnHandle_t handle, const char* op, DType dtype,
            const Shape& x_sizes, const Shape& w_sizes) {
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
    log_debug("cuDNN graph ", op, " refused for x ", shape_str(x_sizes), " w ", shape_str(w_sizes), " ",
              dtype_name(dtype), "; the unfused ops run instead. ", plan.refusal);
  }
  return plan;
}

// The attributes of a convolution pass (Conv_fprop_attributes,
// Conv_dgrad_attributes) named `name`, with p's geometry.
template <class Attributes>
Attributes conv_geometry(const char* name, const Conv2dParams& p) {
  return Attributes()
      .set_name(name)
      .set_padding({p.padding[0], p.padding[1]})
      .set_stride({p.stride[0], p.stride[1]})
      .set_dilation({p.dilation[0], p.dilation[1]});
}

// The prologue: max(x * scale[c] + bias[c], 0) for the user tensors x (kX),
// scale (kScale) and bias (kBias), the last two per channel of the io type.
TensorNode prologue(fe::graph::Graph& graph, DType dtype, const Shape& x_sizes) {
  const int64_t channels = x_sizes[1];
  auto x = image(graph, "x", kX, x_sizes);
  auto scale = graph.tensor(per_channel("scale", kScale, channels, graph_type(dtype)));
  auto bias = graph.tensor(per_channel("bias", kBias, channels, graph_type(dtype)));
  auto scaled = graph.pointwise(x, scale, pointwise("scale", fe::PointwiseMode_t::MUL));
  auto shifted = graph.pointwise(scaled, bias, pointwise("bias", fe::PointwiseMode_t::ADD));
  return graph.pointwise(shifted, pointwise("relu", fe::PointwiseMode_t::RELU_FWD));
}

// Prologue + conv + genstats. `y_sizes`: the output's.
Plan build_prologue_stats(cudnnHandle_t handle, DType dtype, const Shape& x_sizes, const Shape& w_sizes,
                          const Shape& y_sizes, const Conv2dParams& params) {
  auto graph = new_graph(dtype);
  const int64_t out_channels = w_sizes[0];
  auto active = prologue(*graph, dtype, x_sizes);
  auto w = image(*graph, "w", kW, w_sizes);
  auto y = graph->conv_fprop(active, w, conv_geometry<fe::graph::Conv_fprop_attributes>("conv", params));
  y->set_output(true).set_uid(kY).set_data_type(graph_type(dtype)).set_dim(y_sizes).set_stride(
      channels_last_strides(y_sizes));
  auto [sum, sq_sum] = graph->genstats(y, fe::graph::Genstats_attributes().set_name("stats"));
  as_output(sum, per_channel("sum", kSum, out_channels));
  as_output(sq_sum, per_channel("sq_sum", kSqSum, out_channels));
  return finish(std::move(graph), handle, "conv2d_bn_prologue_stats", dtype, x_sizes, w_sizes);
}

// Prologue + wgrad: dw for the output gradient dy (`dy_sizes`).
Plan build_wgrad_prologue(cudnnHandle_t handle, DType dtype, const Shape& x_sizes, const Shape& w_sizes,
                          const Shape& dy_sizes, const Conv2dParams& params) {
  auto graph = new_graph(dtype);
  auto dy = image(*graph, "dy", kDy, dy_sizes);
  auto dw = graph->conv_wgrad(dy, prologue(*graph, dtype, x_sizes),
                              conv_geometry<fe::graph::Conv_wgrad_attributes>("wgrad", params));
  dw->set_output(true).set_uid(kDw).set_data_type(graph_type(dtype)).set_dim(w_sizes).set_stride(
      channels_last_strides(w_sizes));
  return finish(std::move(graph), handle, "conv2d_wgrad_bn_prologue", dtype, x_sizes, w_sizes);
}

// dgrad + ReLU mask from the recomputed batch-norm output + BN backward weights.
Plan build_dgrad_relu_bn(cudnnHandle_t handle, DType dtype, const Shape& x_sizes, const Shape& w_sizes,
                         const Shape& dy_sizes, const Conv2dParams& params) {
  auto graph = new_graph(dtype);
  const int64_t channels = x_sizes[1];
  auto dy = image(*graph, "dy", kDy, dy_sizes);
  auto w = image(*graph, "w", kW, w_sizes);
  auto x = image(*graph, "x", kX, x_sizes);
  auto mean = graph->tensor(per_channel("mean", kMean, channels));
  auto invstd = graph->tensor(per_channel("invstd", kInvstd, channels));
  auto gamma = graph->tensor(per_channel("gamma", kGamma, channels));
  auto beta = graph->tensor(per_channel("beta", kBeta, channels));
  auto da = graph->conv_dgrad(dy, w, conv_geometry<fe::graph::Conv_dgrad_attributes>("dgrad", params));
  da->set_dim(x_sizes).set_stride(channels_last_strides(x_sizes));
  // z = (x - mean) * invstd * gamma + beta, the batch norm's output: the ReLU's mask.
  auto centred = graph->pointwise(x, mean, pointwise("centre", fe::PointwiseMode_t::SUB));
  auto normalised = graph->pointwise(centred, invstd, pointwise("normalise", fe::PointwiseMode_t::MUL));
  auto scaled = graph->pointwise(normalised, gamma, pointwise("gamma", fe::PointwiseMode_t::MUL));
  auto z = graph->pointwise(scaled, beta, pointwise("beta", fe::PointwiseMode_t::ADD));
  auto dz = graph->pointwise(da, z, pointwise("relu_backward", fe::PointwiseMode_t::RELU_BWD));
  dz->set_output(true).set_uid(kDz).set_data_type(graph_type(dtype)).set_dim(x_sizes).set_stride(
      channels_last_strides(x_sizes));
  auto [dgamma, dbeta, eq_scale_dy, eq_scale_x, eq_bias] =
      graph->dbn_weight(dz, x, mean, invstd, gamma, fe::graph::DBN_weight_attributes().set_name("bn_backward"));
  as_output(dgamma, per_channel("dgamma", kDgamma, channels));
  as_output(dbeta, per_channel("dbeta", kDbeta, channels));
  as_output(eq_scale_dy, per_channel("eq_scale_dy", kEqScaleDy, channels));
  as_output(eq_scale_x, per_channel("eq_scale_x", kEqScaleX, channels));
  as_output(eq_bias, per_channel("eq_bias", kEqBias, channels));
  return finish(std::move(graph), handle, "conv2d_dgrad_relu_bn_backward", dtype, x_sizes, w_sizes);
}

// Plans by key, refusals included, for the process's life. A plan is built
// once, under the lock: building may take a second or more (cuDNN's
// runtime-fusion engines compile their kernel then), once per shape, in a
// training run's first step.
std::mutex g_plans_mutex;
std::map<ConvGraphKey, std::shared_ptr<const Plan>> g_plans;

template <class Build>
std::shared_ptr<const Plan> cached_plan(const ConvGraphKey& key, Build&& build) {
  std::lock_guard lock(g_plans_mutex);
  auto found = g_plans.find(key);
  if (found == g_plans.end()) found = g_plans.emplace(key, std::make_shared<const Plan>(build())).first;
  return found->second;
}

// Builds a graph's plan: handle, io dtype, x's, w's and the third image's
// sizes (y or dy), the geometry.
using BuildPlan = Plan (*)(cudnnHandle_t, DType, const Shape&, const Shape&, const Shape&, const Conv2dParams&);

// Runs the plan of (kind, x, w, params) (built by `build` on first use, from
// those and `other_sizes`) with the user tensors `pack` on the current
// stream of x's device, or counts a fallback: whether it ran.
bool run_graph(const char* op, ConvGraphKind kind, const Tensor& x, const Tensor& w, const Shape& other_sizes,
               const Conv2dParams& params, std::unordered_map<int64_t, void*> pack, BuildPlan build) {
  if (params.groups != 1) {
    lc::detail::count_graph_fallback();
    return false;
  }
  const int device = x.device().index;
  const lc::DeviceGuard device_guard(device);
  cudnnHandle_t handle = lc::cudnn_handle(lc::current_stream(device));
  const std::shared_ptr<const Plan> plan =
      cached_plan(conv_graph_key(kind, device, x.dtype(), x.sizes(), w.sizes(), params),
                  [&] { return build(handle, x.dtype(), x.sizes(), w.sizes(), other_sizes, params); });
  if (!plan->graph) {
    lc::detail::count_graph_fallback();
    return false;
  }
  const lc::DeviceBuffer workspace(static_cast<size_t>(plan->workspace_bytes), device);
  fe::error_t status = plan->graph->execute(handle, pack, workspace.data());
  LOOM_CHECK(status.is_good(), op, ": cuDNN failed to run the graph it built for x ", x.str(), " and w ", w.str(), ": ",
             status.get_message());
  lc::detail::count_graph_run();
  return true;
}

}  // namespace

bool conv2d_bn_prologue_stats(const Tensor& x, const Tensor& scale, const Tensor& bias, const Tensor& w,
                              const Conv2dParams& params, const Tensor& y, const Tensor& sum, const Tensor& sq_sum) {
  check_prologue_stats_arguments(x, scale, bias, w, params, y, sum, sq_sum);
  std::unordered_map<int64_t, void*> pack{{kX, x.raw_data()},   {kScale, scale.raw_data()}, {kBias, bias.raw_data()},
                                          {kW, w.raw_data()},   {kY, y.raw_data()},         {kSum, sum.raw_data()},
                                          {kSqSum, sq_sum.raw_data()}};
  return run_graph("conv2d_bn_prologue_stats", ConvGraphKind::forward_prologue_stats, x, w, y.sizes(), params,
                   std::move(pack), build_prologue_stats);
}

bool conv2d_dgrad_relu_bn_backward(const Tensor& dy, const Tensor& w, const Tensor& x, const BatchNormSaved& saved,
                                   const Conv2dParams& params, const BatchNormBackwardTerms& out) {
  check_dgrad_relu_bn_arguments(dy, w, x, saved, params, out);
  std::unordered_map<int64_t, void*> pack{{kDy, dy.raw_data()},
                                          {kW, w.raw_data()},
                                          {kX, x.raw_data()},
                                          {kMean, saved.mean.raw_data()},
                                          {kInvstd, saved.invstd.raw_data()},
                                          {kGamma, saved.gamma.raw_data()},
                                          {kBeta, saved.beta.raw_data()},
                                          {kDz, out.dz.raw_data()},
                                          {kDgamma, out.dgamma.raw_data()},
                                          {kDbeta, out.dbeta.raw_data()},
                                          {kEqScaleDy, out.eq_scale_dy.raw_data()},
                                          {kEqScaleX, out.eq_scale_x.raw_data()},
                                          {kEqBias, out.eq_bias.raw_data()}};
  return run_graph("conv2d_dgrad_relu_bn_backward", ConvGraphKind::backward_data_relu_bn, x, w, dy.sizes(), params,
                   std::move(pack), build_dgrad_relu_bn);
}

bool conv2d_wgrad_bn_prologue(const Tensor& dy, const Tensor& x, const Tensor& scale, const Tensor& bias,
                              const Conv2dParams& params, const Tensor& dw) {
  check_wgrad_prologue_arguments(dy, x, scale, bias, params, dw);
  std::unordered_map<int64_t, void*> pack{{kDy, dy.raw_data()},       {kX, x.raw_data()}, {kScale, scale.raw_data()},
                                          {kBias, bias.raw_data()}, {kDw, dw.raw_data()}};
  return run_graph("conv2d_wgrad_bn_prologue", ConvGraphKind::backward_weight_prologue, x, dw, dy.sizes(), params,
                   std::move(pack), build_wgrad_prologue);
}

#else  // no cudnn-frontend: every graph is refused

bool conv2d_bn_prologue_stats(const Tensor& x, const Tensor& scale, const Tensor& bias, const Tensor& w,
                              const Conv2dParams& params, const Tensor& y, const Tensor& sum, const Tensor& sq_sum) {
  check_prologue_stats_arguments(x, scale, bias, w, params, y, sum, sq_sum);
  lc::detail::count_graph_fallback();
  return false;
}

bool conv2d_dgrad_relu_bn_backward(const Tensor& dy, const Tensor& w, const Tensor& x, const BatchNormSaved& saved,
                                   const Conv2dParams& params, const BatchNormBackwardTerms& out) {
  check_dgrad_relu_bn_arguments(dy, w, x, saved, params, out);
  lc::detail::count_graph_fallback();
  return false;
}

bool conv2d_wgrad_bn_prologue(const Tensor& dy, const Tensor& x, const Tensor& scale, const Tensor& bias,
                              const Conv2dParams& params, const Tensor& dw) {
  check_wgrad_prologue_arguments(dy, x, scale, bias, params, dw);
  lc::detail::count_graph_fallback();
  return false;
}

#endif

}  // namespace loom::ops::cuda

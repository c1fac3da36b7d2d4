// CUDA conv2d (ops/conv2d.h) through cuDNN's convolution API: forward,
// backward-data and backward-filter; the bias is added by a small kernel and
// its gradient is batch norm's per-channel sum (ops/cuda/batch_norm.cu). NCHW and channels-last (NHWC) inputs; the
// output and gradients keep the input's memory order (the weight is used in
// that order too). The algorithm of each pass is chosen once per (shapes,
// dtype, format, math mode) -- by timing the candidates (cudnnFind) or by
// cuDNN's heuristic (cudnnGet), see cuda::conv_algorithm_search() -- and
// cached; workspaces come from the caching allocator. Accumulation is fp32 for
// f16 / bf16 (f64 for f64); f32 uses TF32 tensor cores only when
// cuda::allow_tf32() is set.
#include <cudnn.h>

#include <array>
#include <climits>
#include <map>
#include <mutex>
#include <tuple>

#include <loom/core/cuda/cudnn_descriptors.h>
#include <loom/core/cuda/handles.h>
#include <loom/ops/batch_norm.h>
#include <loom/ops/conv2d.h>
#include <loom/ops/cuda/common.cuh>

namespace loom::ops::cuda {
using namespace cuda_detail;
namespace lc = ::loom::cuda;

namespace {

enum class Pass { forward, backward_data, backward_filter };

cudnnDataType_t data_type(DType t) {
  switch (t) {
    case DType::f32: return CUDNN_DATA_FLOAT;
    case DType::f64: return CUDNN_DATA_DOUBLE;
    case DType::f16: return CUDNN_DATA_HALF;
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    default: LOOM_FAIL("conv2d: CUDA convolutions take f32, f64, f16 or bf16 tensors, got ", dtype_name(t));
  }
}

int as_int(int64_t v, const char* what) {
  LOOM_CHECK(v >= 0 && v <= INT_MAX, "conv2d: ", what, " ", v, " exceeds what cuDNN accepts (2^31 - 1)");
  return static_cast<int>(v);
}

// A 4-d tensor descriptor of `sizes` laid out as `format` (canonical strides,
// so size-1 dims with unusual strides do not matter).
void describe_tensor(const lc::CudnnTensorDescriptor& d, DType dtype, const Shape& sizes, MemoryFormat format) {
  const int n = as_int(sizes[0], "batch"), c = as_int(sizes[1], "channels"), h = as_int(sizes[2], "height"),
            w = as_int(sizes[3], "width");
  const int dims[4] = {n, c, h, w};
  // The legacy API takes int strides and no tensor of 2^31 elements or more.
  as_int(sizes[0] * sizes[1] * sizes[2] * sizes[3], "number of elements");
  int s[4];
  if (format == MemoryFormat::nhwc) {
    s[0] = h * w * c, s[1] = 1, s[2] = w * c, s[3] = c;
  } else {
    s[0] = c * h * w, s[1] = h * w, s[2] = w, s[3] = 1;
  }
  LOOM_CHECK_CUDNN(cudnnSetTensorNdDescriptor(d.get(), data_type(dtype), 4, dims, s));
}

// Everything a pass needs to run: descriptors and the cache key.
struct Problem {
  lc::CudnnTensorDescriptor x, y;
  lc::CudnnFilterDescriptor w;
  lc::CudnnConvolutionDescriptor conv;
  DType dtype;
  bool tf32;
  std::array<int64_t, 17> key{};

  Problem(DType dtype_in, MemoryFormat format, const Shape& input, const Shape& weight, const Shape& output,
          const Conv2dParams& p)
      : dtype(dtype_in), tf32(dtype_in == DType::f32 && lc::allow_tf32()) {
    describe_tensor(x, dtype, input, format);
    describe_tensor(y, dtype, output, format);
    LOOM_CHECK_CUDNN(cudnnSetFilter4dDescriptor(
        w.get(), data_type(dtype), format == MemoryFormat::nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
        as_int(weight[0], "output channels"), as_int(weight[1], "input channels"), as_int(weight[2], "kernel height"),
        as_int(weight[3], "kernel width")));
    LOOM_CHECK_CUDNN(cudnnSetConvolution2dDescriptor(
        conv.get(), as_int(p.padding[0], "padding"), as_int(p.padding[1], "padding"), as_int(p.stride[0], "stride"),
        as_int(p.stride[1], "stride"), as_int(p.dilation[0], "dilation"), as_int(p.dilation[1], "dilation"),
        CUDNN_CROSS_CORRELATION, dtype == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT));
    // Grouped and depthwise convolutions: the filter is (O, C / groups, kH, kW).
    LOOM_CHECK_CUDNN(cudnnSetConvolutionGroupCount(conv.get(), as_int(p.groups, "groups")));
    set_math(default_math());
    key = {static_cast<int64_t>(dtype), format == MemoryFormat::nhwc, tf32, input[0], input[1], input[2], input[3],
           weight[0], weight[2], weight[3], p.padding[0], p.padding[1], p.stride[0], p.stride[1], p.dilation[0],
           p.dilation[1], p.groups};
  }

  // f16 / bf16: tensor cores; f32: plain FMA unless TF32 is allowed; f64: default.
  cudnnMathType_t default_math() const {
    if (dtype == DType::f16 || dtype == DType::bf16) return CUDNN_TENSOR_OP_MATH;
    if (dtype == DType::f32) return tf32 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
    return CUDNN_DEFAULT_MATH;
  }
  // Whether an algorithm found with math type `math` may be used.
  bool allowed(cudnnMathType_t math) const {
    return !(dtype == DType::f32 && !tf32 &&
             (math == CUDNN_TENSOR_OP_MATH || math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION));
  }
  void set_math(cudnnMathType_t math) const { LOOM_CHECK_CUDNN(cudnnSetConvolutionMathType(conv.get(), math)); }
  // The math mode to run `choice` with: f32 without TF32 stays on FMA math
  // whatever mode cuDNN reported (its default mode may use TF32).
  void set_math_for_run(cudnnMathType_t found) const {
    set_math(dtype == DType::f32 && !tf32 ? CUDNN_FMA_MATH : found);
  }
};

// The algorithm chosen for one pass of one problem.
struct Choice {
  int algorithm = 0;
  size_t workspace = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

// Keyed by (pass, device, timed search or heuristic, problem).
using CacheKey = std::tuple<Pass, int, bool, std::array<int64_t, 17>>;
std::mutex g_cache_mutex;
std::map<CacheKey, Choice> g_cache;

// Largest workspace handed to the timing search.
constexpr size_t kSearchWorkspaceCap = size_t{1} << 30;

// Whether a workspace of `bytes` can be had on `device` now (the block goes
// back to the caching allocator, which hands it out again for the run).
bool workspace_available(size_t bytes, int device) {
  if (bytes == 0) return true;
  try {
    lc::DeviceBuffer probe(bytes, device);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// Picks the first usable result (they come fastest first). The timed search
// only returns algorithms whose workspace it could provide; cuDNN's heuristic
// ranks them regardless of memory, so with `check_workspace` one whose
// workspace cannot be allocated is passed over for the next (as PyTorch does).
template <class Perf>
Choice first_usable(const Problem& problem, const Perf* results, int count, const char* pass, int device,
                    bool check_workspace) {
  for (int i = 0; i < count; ++i) {
    if (results[i].status == CUDNN_STATUS_SUCCESS && problem.allowed(results[i].mathType) &&
        (!check_workspace || workspace_available(results[i].memory, device))) {
      return {static_cast<int>(results[i].algo), results[i].memory, results[i].mathType};
    }
  }
  LOOM_FAIL("conv2d: cuDNN found no usable ", pass, " algorithm for this problem (dtype ", dtype_name(problem.dtype),
            check_workspace ? "; or none whose workspace fits in the GPU's free memory" : "", ")");
}

// Scratch for the timing search: as large as the hungriest candidate needs
// (capped), or nothing when that much memory is not available.
lc::DeviceBuffer search_workspace(size_t largest, int device) {
  const size_t bytes = std::min(largest, kSearchWorkspaceCap);
  if (bytes == 0) return {};
  try {
    return lc::DeviceBuffer(bytes, device);
  } catch (const Error&) {
    return {};
  }
}

// Buffers of one pass: x, w, y for forward; w, dy, dx for backward data; x,
// dy, dw for backward filter (the written one last).
struct Buffers {
  const void* first;
  const void* second;
  void* out;
};

// The descriptors of one pass in cuDNN's argument order, the written one
// last (as Buffers): x, w, y forward; w, dy, dx backward data; x, dy, dw
// backward filter.
auto forward_descriptors(const Problem& p) { return std::tuple{p.x.get(), p.w.get(), p.y.get()}; }
auto backward_data_descriptors(const Problem& p) { return std::tuple{p.w.get(), p.y.get(), p.x.get()}; }
auto backward_filter_descriptors(const Problem& p) { return std::tuple{p.x.get(), p.y.get(), p.w.get()}; }

// cuDNN's calls for one pass, which take the same arguments in each pass: its
// workspace size per algorithm, the timed search (find), the heuristic (get)
// and the pass itself (execute), over Count algorithms with results of type Perf.
template <Pass P, class Perf, int Count, auto descriptors, auto workspace_size, auto find, auto get, auto execute>
struct PassCalls {
  using Result = Perf;
  static constexpr Pass kPass = P;
  static constexpr int kCount = Count;
  static cudnnStatus_t workspace_bytes(cudnnHandle_t h, const Problem& p, int algorithm, size_t* bytes) {
    const auto [first, second, out] = descriptors(p);
    return workspace_size(h, first, second, p.conv.get(), out, static_cast<decltype(Perf::algo)>(algorithm), bytes);
  }
  static void timed_search(cudnnHandle_t h, const Problem& p, const Buffers& b, int* returned, Perf* results,
                           lc::DeviceBuffer& workspace) {
    const auto [first, second, out] = descriptors(p);
    LOOM_CHECK_CUDNN(find(h, first, b.first, second, b.second, p.conv.get(), out, b.out, Count, returned, results,
                          workspace.data(), workspace.size()));
  }
  static void heuristic(cudnnHandle_t h, const Problem& p, int* returned, Perf* results) {
    const auto [first, second, out] = descriptors(p);
    LOOM_CHECK_CUDNN(get(h, first, second, p.conv.get(), out, Count, returned, results));
  }
  // b.out = the pass of b.first and b.second (alpha 1, beta 0) by `algorithm`.
  static void run(cudnnHandle_t h, const Problem& p, const Buffers& b, int algorithm, const void* one,
                  const void* zero, lc::DeviceBuffer& workspace) {
    const auto [first, second, out] = descriptors(p);
    lc::detail::count_library_call();
    LOOM_CHECK_CUDNN(execute(h, one, first, b.first, second, b.second, p.conv.get(),
                             static_cast<decltype(Perf::algo)>(algorithm), workspace.data(), workspace.size(), zero,
                             out, b.out));
  }
};

using ForwardCalls =
    PassCalls<Pass::forward, cudnnConvolutionFwdAlgoPerf_t, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, forward_descriptors,
              cudnnGetConvolutionForwardWorkspaceSize, cudnnFindConvolutionForwardAlgorithmEx,
              cudnnGetConvolutionForwardAlgorithm_v7, cudnnConvolutionForward>;
using BackwardDataCalls =
    PassCalls<Pass::backward_data, cudnnConvolutionBwdDataAlgoPerf_t, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
              backward_data_descriptors, cudnnGetConvolutionBackwardDataWorkspaceSize,
              cudnnFindConvolutionBackwardDataAlgorithmEx, cudnnGetConvolutionBackwardDataAlgorithm_v7,
              cudnnConvolutionBackwardData>;
using BackwardFilterCalls =
    PassCalls<Pass::backward_filter, cudnnConvolutionBwdFilterAlgoPerf_t, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
              backward_filter_descriptors, cudnnGetConvolutionBackwardFilterWorkspaceSize,
              cudnnFindConvolutionBackwardFilterAlgorithmEx, cudnnGetConvolutionBackwardFilterAlgorithm_v7,
              cudnnConvolutionBackwardFilter>;

// One pass's choice: with `benchmark`, cuDNN's timed search with a workspace
// as large as the hungriest candidate needs; else its heuristic.
template <class Calls>
Choice search(const char* pass, const Problem& problem, cudnnHandle_t handle, const Buffers& b, int device,
              bool benchmark) {
  typename Calls::Result results[Calls::kCount];
  int returned = 0;
  if (benchmark) {
    size_t largest = 0;
    for (int a = 0; a < Calls::kCount; ++a) {
      size_t bytes = 0;
      if (Calls::workspace_bytes(handle, problem, a, &bytes) == CUDNN_STATUS_SUCCESS) largest = std::max(largest, bytes);
    }
    lc::DeviceBuffer workspace = search_workspace(largest, device);
    Calls::timed_search(handle, problem, b, &returned, results, workspace);
  } else {
    Calls::heuristic(handle, problem, &returned, results);
  }
  return first_usable(problem, results, returned, pass, device, !benchmark);
}

Choice choose(Pass pass, const Problem& problem, cudnnHandle_t handle, const Buffers& b, int device) {
  const bool benchmark = lc::conv_algorithm_search() == lc::ConvAlgorithmSearch::benchmark;
  const CacheKey key{pass, device, benchmark, problem.key};
  {
    std::lock_guard<std::mutex> lock(g_cache_mutex);
    auto it = g_cache.find(key);
    if (it != g_cache.end()) return it->second;
  }
  Choice choice;
  if (pass == Pass::forward) {
    choice = search<ForwardCalls>("forward", problem, handle, b, device, benchmark);
  } else if (pass == Pass::backward_data) {
    choice = search<BackwardDataCalls>("backward-data", problem, handle, b, device, benchmark);
  } else {
    choice = search<BackwardFilterCalls>("backward-filter", problem, handle, b, device, benchmark);
  }
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  g_cache.emplace(key, choice);
  return choice;
}

// alpha = 1 and beta = 0 in the scaling type cuDNN expects for `dtype`.
struct Scaling {
  float one_f = 1.0f, zero_f = 0.0f;
  double one_d = 1.0, zero_d = 0.0;
  bool f64;
  explicit Scaling(DType dtype) : f64(dtype == DType::f64) {}
  const void* one() const { return f64 ? static_cast<const void*>(&one_d) : &one_f; }
  const void* zero() const { return f64 ? static_cast<const void*>(&zero_d) : &zero_f; }
};

// Runs one pass of `problem` on the current stream of `device`: its chosen
// algorithm (cached) with the workspace that algorithm needs.
template <class Calls>
void run_pass(const Problem& problem, DType dtype, int device, const Buffers& b) {
  cudnnHandle_t handle = lc::cudnn_handle(lc::current_stream(device));
  const Choice choice = choose(Calls::kPass, problem, handle, b, device);
  problem.set_math_for_run(choice.math);
  lc::DeviceBuffer workspace(choice.workspace, device);
  const Scaling s(dtype);
  Calls::run(handle, problem, b, choice.algorithm, s.one(), s.zero(), workspace);
}

// y[n, c, h, w] += bias[c], for either memory order.
template <class T>
static __global__ void add_bias_kernel(T* y, const T* bias, int64_t n, int64_t channels, int64_t plane,
                                       bool channels_last) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t c = channels_last ? i % channels : (i / plane) % channels;
    y[i] = from_acc<T>(to_acc(y[i]) + to_acc(bias[c]));
  }
}

// dw = the weight gradient by cuDNN's backward-filter pass; x, dy and dw in the memory order `format`.
void backward_filter(const Tensor& dy, const Tensor& x, const Conv2dParams& params, MemoryFormat format, Tensor& dw) {
  const Shape& weight_sizes = dw.sizes();
  const Problem problem(dy.dtype(), format, x.sizes(), weight_sizes, dy.sizes(), params);
  run_pass<BackwardFilterCalls>(problem, dy.dtype(), dy.device().index, {x.raw_data(), dy.raw_data(), dw.raw_data()});
}

}  // namespace

Tensor conv2d_forward(const Tensor& input_in, const Tensor& weight_in, const Tensor& bias_in,
                      const Conv2dParams& params) {
  const auto device_guard = on_device_of("conv2d", input_in);
  const MemoryFormat format = memory_format_of(input_in);
  const Tensor x = in_memory_format(input_in, format), w = in_memory_format(weight_in, format);
  const Size2 out_hw = conv2d_output_size({x.size(2), x.size(3)}, {w.size(2), w.size(3)}, params);
  const Shape out_sizes{x.size(0), w.size(0), out_hw[0], out_hw[1]};
  Tensor y = empty_with_format(out_sizes, x.dtype(), x.device(), format);
  if (y.numel() == 0) return y;
  if (x.size(1) == 0) {
    y.zero_();  // no input channels: the output is the bias alone, as on the CPU
  } else {
    const Problem problem(x.dtype(), format, x.sizes(), w.sizes(), out_sizes, params);
    run_pass<ForwardCalls>(problem, x.dtype(), x.device().index, {x.raw_data(), w.raw_data(), y.raw_data()});
  }
  if (bias_in.defined()) {
    const Tensor b = contiguous_input(bias_in);
    visit_float(y.dtype(), "conv2d", [&]<class T>() {
      add_bias_kernel<T><<<blocks_for(y.numel()), kThreads, 0, stream_of(y)>>>(
          y.data<T>(), b.data<T>(), y.numel(), y.size(1), y.size(2) * y.size(3), format == MemoryFormat::nhwc);
      LOOM_CHECK_LAUNCH();
    });
  }
  return y;
}

Tensor conv2d_backward_input(const Tensor& grad_output, const Tensor& weight_in, const Shape& input_sizes,
                             const Conv2dParams& params, const Tensor&) {
  const auto device_guard = on_device_of("conv2d backward", grad_output);
  const MemoryFormat format = memory_format_of(grad_output);
  const Tensor dy = in_memory_format(grad_output, format), w = in_memory_format(weight_in, format);
  Tensor dx = empty_with_format(input_sizes, dy.dtype(), dy.device(), format);
  if (dx.numel() == 0) return dx;
  if (dy.numel() == 0) return dx.zero_();
  const Problem problem(dy.dtype(), format, input_sizes, w.sizes(), dy.sizes(), params);
  run_pass<BackwardDataCalls>(problem, dy.dtype(), dy.device().index, {w.raw_data(), dy.raw_data(), dx.raw_data()});
  return dx;
}

Tensor conv2d_backward_weight(const Tensor& grad_output, const Tensor& input_in, const Shape& weight_sizes,
                              const Conv2dParams& params, const Tensor& out) {
  const auto device_guard = on_device_of("conv2d backward", grad_output);
  const MemoryFormat format = memory_format_of(input_in);
  const Tensor x = in_memory_format(input_in, format), dy = in_memory_format(grad_output, format);
  // cuDNN writes the weight gradient in the input's memory order: straight
  // into `out` when it fits and lies in that order (a contiguous gradient
  // buffer under NCHW input; a channels-last one, Module::to(MemoryFormat),
  // under channels-last input), else copied into it.
  const bool fits_out = out.defined() && out.sizes() == weight_sizes && out.dtype() == grad_output.dtype() &&
                        out.device() == grad_output.device() && in_a_memory_format(out);
  const bool into_out = fits_out && is_in_memory_format(out, format);
  Tensor dw = into_out ? out : empty_with_format(weight_sizes, dy.dtype(), dy.device(), format);
  if (dw.numel() == 0) return dw;
  if (x.size(0) == 0 || dy.numel() == 0) {
    dw.zero_();
  } else {
    backward_filter(dy, x, params, format, dw);
  }
  if (fits_out && !into_out) {
    Tensor written = out;
    return written.copy_(dw);
  }
  return dw;
}

std::pair<Tensor, Tensor> conv2d_backward_input_weight(const Tensor& grad_output, const Tensor& input,
                                                       const Tensor& weight, const Conv2dParams& params,
                                                       const Tensor& out, const Tensor&) {
  const auto device_guard = on_device_of("conv2d backward", grad_output);
  // cuDNN has no pass that computes both; the output gradient is put into the
  // input's memory order once for the two.
  const Tensor dy = in_memory_format(grad_output, memory_format_of(input));
  return {conv2d_backward_input(dy, weight, input.sizes(), params),
          conv2d_backward_weight(dy, input, weight.sizes(), params, out)};
}


Tensor conv2d_backward_bias(const Tensor& grad_output) {
  const auto device_guard = on_device_of("conv2d backward", grad_output);
  // Row 0 of batch norm's per-channel (sum, sum of squares), accumulated in f64.
  const Tensor sums = batch_norm_stats(grad_output);
  NoGradGuard no_grad;
  return sums.slice(0, 0, 1).reshape({grad_output.size(1)}).to(grad_output.dtype()).contiguous();
}

}  // namespace loom::ops::cuda

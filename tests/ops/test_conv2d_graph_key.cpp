// The plan-cache key of the fused cuDNN graphs (ops/cuda/conv2d_graph.h):
// plain C++, so checked in every build. Two calls share a plan exactly when
// everything a plan is built for matches.
#include <doctest/doctest.h>

#include <loom/ops/cuda/conv2d_graph.h>

using namespace loom;
using ops::cuda::conv_graph_key;
using ops::cuda::ConvGraphKind;

TEST_CASE("fused conv graph key: equal for the same problem, different when anything a plan depends on differs") {
  const Shape x{32, 64, 56, 56}, w{128, 64, 3, 3};
  const Conv2dParams p{.stride = {1, 1}, .padding = {1, 1}};
  const auto key = [](int device, DType dtype, const Shape& x_sizes, const Shape& w_sizes, const Conv2dParams& q) {
    return conv_graph_key(ConvGraphKind::forward_prologue_stats, device, dtype, x_sizes, w_sizes, q);
  };
  const auto base = key(0, DType::f16, x, w, p);
  CHECK(key(0, DType::f16, x, w, p) == base);
  // w's input channels are x's (groups = 1): they are no separate part of it.
  CHECK(key(0, DType::f16, x, {128, 64, 3, 3}, p) == base);

  Conv2dParams stride = p, padding = p, padding_w = p, dilation = p;
  stride.stride = {2, 2};
  padding.padding = {0, 0};
  padding_w.padding = {1, 0};
  dilation.dilation = {2, 2};
  const ops::cuda::ConvGraphKey different[] = {
      key(1, DType::f16, x, w, p),  // another device: plans are built on a handle of one device
      key(0, DType::bf16, x, w, p),
      key(0, DType::f16, {16, 64, 56, 56}, w, p),
      key(0, DType::f16, {32, 32, 56, 56}, {128, 32, 3, 3}, p),
      key(0, DType::f16, {32, 64, 28, 56}, w, p),
      key(0, DType::f16, {32, 64, 56, 28}, w, p),
      key(0, DType::f16, x, {64, 64, 3, 3}, p),
      key(0, DType::f16, x, {128, 64, 1, 3}, p),
      key(0, DType::f16, x, {128, 64, 3, 1}, p),
      key(0, DType::f16, x, w, stride),
      key(0, DType::f16, x, w, padding),
      key(0, DType::f16, x, w, padding_w),
      key(0, DType::f16, x, w, dilation),
  };
  for (size_t i = 0; i < std::size(different); ++i) {
    INFO("variant ", i);
    CHECK(different[i] != base);
    for (size_t j = 0; j < i; ++j) CHECK(different[i] != different[j]);
  }
}

TEST_CASE("LOOM_CUDNN_GRAPH: unset, empty or 0 is off, 1 on; anything else is an error naming the variable") {
  using ops::cuda::conv_graphs_switch;
  CHECK_FALSE(conv_graphs_switch(nullptr));
  CHECK_FALSE(conv_graphs_switch(""));
  CHECK_FALSE(conv_graphs_switch("0"));
  CHECK(conv_graphs_switch("1"));
  for (const char* bad : {"yes", "true", "2", " 1"}) {
    INFO(bad);
    CHECK_THROWS_WITH_AS(conv_graphs_switch(bad), doctest::Contains("LOOM_CUDNN_GRAPH must be 0 ("), Error);
    CHECK_THROWS_WITH_AS(conv_graphs_switch(bad), doctest::Contains("or 1 ("), Error);
  }
}

// The average-pooling window, written once for both backends (PyTorch's
// avg_pool2d rule, ceil_mode off): output o along an axis of `size` starts at
// o * stride - padding and spans `kernel`, clipped to the padded input for the
// divisor when padding counts, and to the input for the elements summed.
#pragma once

#include <cstdint>

#include <loom/core/host_device.h>

namespace loom::ops {

// One axis of an average-pooling window: inputs [begin, end), and the number
// of positions it covers counting padding.
struct AvgPoolSpan {
  int64_t begin, end, padded_count;
};

LOOM_HOST_DEVICE inline AvgPoolSpan avg_pool_span(int64_t o, int64_t size, int64_t kernel, int64_t stride,
                                                  int64_t padding) {
  int64_t begin = o * stride - padding;
  int64_t end = begin + kernel < size + padding ? begin + kernel : size + padding;
  const int64_t padded_count = end - begin;
  begin = begin > 0 ? begin : 0;
  end = end < size ? end : size;
  return {begin, end, padded_count};
}

// adaptive_avg_pool2d's window of output o of `outputs` along an axis of
// `size`: [floor(o * size / outputs), ceil((o + 1) * size / outputs)), no padding.
LOOM_HOST_DEVICE inline AvgPoolSpan adaptive_pool_span(int64_t o, int64_t size, int64_t outputs) {
  const int64_t begin = o * size / outputs, end = ((o + 1) * size + outputs - 1) / outputs;
  return {begin, end, end - begin};
}

// The divisor of a window: every position (count_include_pad) or the input's only.
LOOM_HOST_DEVICE inline int64_t avg_pool_divisor(const AvgPoolSpan& rows, const AvgPoolSpan& cols,
                                                 bool count_include_pad) {
  return count_include_pad ? rows.padded_count * cols.padded_count : (rows.end - rows.begin) * (cols.end - cols.begin);
}

// Outputs whose window along an axis holds input position i: [first, last).
LOOM_HOST_DEVICE inline void avg_pool_outputs_of(int64_t i, int64_t kernel, int64_t stride, int64_t padding,
                                                 int64_t outputs, int64_t& first, int64_t& last) {
  first = i + padding < kernel ? 0 : (i + padding - kernel) / stride + 1;
  last = (i + padding) / stride + 1;
  last = last < outputs ? last : outputs;
}

}  // namespace loom::ops

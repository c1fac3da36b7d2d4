// The Winograd tile-major path's tiles on the CPU: a chunk's planes cut into
// tiles (their first transform applied on the way for F(4x4, 3x3) and
// F(4x4, 5x5)) and transformed, and the tiles added back into planes.
#include <loom/ops/cpu/winograd_internal.h>

#include <algorithm>

#include <loom/ops/cpu/simd.h>

namespace loom::ops::cpu::winograd::detail {
namespace {

// The tiles of one row of tiles and one plane row: dst[s][tw] = row[tw * m + s]
// for s < width and tw < tiles (zeros in row where the tiles reach past the
// plane). For m = 4, the common case, 4 x 4 blocks of the row are transposed
// in registers, reading row up to tiles * m + 4 values when width > 4 (the
// padded copies below are that long).
void split_row(const float* row, int64_t tiles, int m, int width, float* const* dst) {
  int64_t tw = 0;
#if defined(__x86_64__)
  if (m == 4 && width <= 8) {
    for (; tw + 4 <= tiles; tw += 4) {
      const float* block = row + 4 * tw;
      __m128 c0 = _mm_loadu_ps(block), c1 = _mm_loadu_ps(block + 4), c2 = _mm_loadu_ps(block + 8);
      __m128 c3 = _mm_loadu_ps(block + 12);
      __m128 d0 = c1, d1 = c2, d2 = c3, d3 = width > 4 ? _mm_loadu_ps(block + 16) : _mm_setzero_ps();
      _MM_TRANSPOSE4_PS(c0, c1, c2, c3);
      _MM_TRANSPOSE4_PS(d0, d1, d2, d3);
      const __m128 columns[8] = {c0, c1, c2, c3, d0, d1, d2, d3};
      for (int s = 0; s < width; ++s) _mm_storeu_ps(dst[s] + tw, columns[s]);
    }
  }
#endif
  for (; tw < tiles; ++tw) {
    for (int s = 0; s < width; ++s) dst[s][tw] = row[tw * m + s];
  }
}

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
// split_row for m = 4 with transform W of F applied along each tile's row
// on the way: dst[v][tw] = sum over s < In of W[v][s] row[tw * 4 + s], for
// v < Out. In = α (8 for F(4x4, 5x5), 6 for F(4x4, 3x3)) is an input tile
// (W = Bᵀ), In = 4 an output-gradient tile (W = A): the first of the two
// transforms is done in registers, and the tiles are not written and read
// back in between: 4 tiles per instruction after the 4 x 4 transposes. The
// last tiles of a row (fewer than 4) go through the tail, kept out of line:
// inlined, its registers were saved and restored on every call.
template <class F, Which W, int Out, int In>
[[gnu::noinline]] void split_row_transformed_tail(const float* row, int64_t tw, int64_t tiles, float* const* dst) {
  for (; tw < tiles; ++tw) {
    fixed_product<F, W, Out, In>(row + tw * 4, [&](int v, float sum) { dst[v][tw] = sum; });
  }
}
template <class F, Which W, int Out, int In>
void split_row_transformed(const float* row, int64_t tiles, float* const* dst) {
  int64_t tw = 0;
  for (; tw + 4 <= tiles; tw += 4) {
    const float* block = row + 4 * tw;
    __m128 x[8];
    x[0] = _mm_loadu_ps(block), x[1] = _mm_loadu_ps(block + 4), x[2] = _mm_loadu_ps(block + 8);
    x[3] = _mm_loadu_ps(block + 12);
    if constexpr (In > 4) {
      x[4] = x[1], x[5] = x[2], x[6] = x[3], x[7] = _mm_loadu_ps(block + 16);
      _MM_TRANSPOSE4_PS(x[4], x[5], x[6], x[7]);
    }
    _MM_TRANSPOSE4_PS(x[0], x[1], x[2], x[3]);
    fixed_product<F, W, Out, In>(x, [&](int v, __m128 sum) { _mm_storeu_ps(dst[v] + tw, sum); });
  }
  if (tw < tiles) split_row_transformed_tail<F, W, Out, In>(row, tw, tiles, dst);
}
#pragma GCC pop_options
#endif

}  // namespace

// The adjoint of split_row: row[tw * m + s] += src[s][tw].
void merge_row(const float* const* src, int64_t tiles, int m, int width, float* row) {
  int64_t tw = 0;
#if defined(__x86_64__)
  if (m == 4 && width <= 8) {
    for (; tw + 4 <= tiles; tw += 4) {
      float* block = row + 4 * tw;
      __m128 c0 = _mm_loadu_ps(src[0] + tw), c1 = _mm_loadu_ps(src[1] + tw), c2 = _mm_loadu_ps(src[2] + tw);
      __m128 c3 = _mm_loadu_ps(src[3] + tw);
      _MM_TRANSPOSE4_PS(c0, c1, c2, c3);
      const __m128 first[4] = {c0, c1, c2, c3};
      for (int k = 0; k < 4; ++k) _mm_storeu_ps(block + 4 * k, _mm_add_ps(_mm_loadu_ps(block + 4 * k), first[k]));
      if (width <= 4) continue;
      __m128 d[4];
      for (int s = 4; s < 8; ++s) d[s - 4] = s < width ? _mm_loadu_ps(src[s] + tw) : _mm_setzero_ps();
      _MM_TRANSPOSE4_PS(d[0], d[1], d[2], d[3]);
      for (int k = 0; k < 4; ++k) {
        _mm_storeu_ps(block + 4 * (k + 1), _mm_add_ps(_mm_loadu_ps(block + 4 * (k + 1)), d[k]));
      }
    }
  }
#endif
  for (; tw < tiles; ++tw) {
    for (int s = 0; s < width; ++s) row[tw * m + s] += src[s][tw];
  }
}

float* padded_buffer(const Padded& layout) {
  thread_local std::vector<float> buffer;
  const int64_t size = layout.rows * layout.cols;
  if (static_cast<int64_t>(buffer.size()) < size) buffer.resize(static_cast<size_t>(size));
  return buffer.data();
}
// The columns [x0, x1) and rows [y0, y1) of a height x width plane inside the copy.
struct Overlap {
  int64_t y0, y1, x0, x1;
};
Overlap overlap(const Padded& layout, int64_t height, int64_t width) {
  const int64_t y0 = std::clamp<int64_t>(-layout.top, 0, height), x0 = std::clamp<int64_t>(-layout.left, 0, width);
  return {y0, std::clamp<int64_t>(layout.rows - layout.top, y0, height), x0,
          std::clamp<int64_t>(layout.cols - layout.left, x0, width)};
}
// The plane's part of the copy back into it (zero where the copy does not reach).
void unpad_plane(const float* padded, const Padded& layout, int64_t height, int64_t width, float* plane) {
  const Overlap o = overlap(layout, height, width);
  std::fill(plane, plane + height * width, 0.0f);
  for (int64_t y = o.y0; y < o.y1; ++y) {
    const float* src = padded + (y + layout.top) * layout.cols + layout.left;
    float* dst = plane + y * width;
    for (int64_t x = o.x0; x < o.x1; ++x) dst[x] = src[x];
  }
}

// The padded copy of an input plane that covers every input tile.
Padded input_layout(const Problem& p, const Transforms& t) {
  const Tiling tl = tiling(p, t.m);
  return {(tl.rows - 1) * t.m + t.alpha, tl.cols * t.m + t.alpha, p.pad_h, p.pad_w};
}
// ... and of an output plane: whole tiles.
Padded output_layout(const Problem& p, const Transforms& t) {
  const Tiling tl = tiling(p, t.m);
  return {tl.rows * t.m, tl.cols * t.m, 0, 0};
}

// out[x'][y'][c][t] = sum over (x, y) of W[x'][x] W[y'][y] in[x][y][c][t]:
// transform W of t along both tile dimensions of a chunk buffer, `channels`
// rows of ld per tile element, in_span x in_span elements in, out_span x
// out_span out; `half` holds out_span x in_span of them in between (out may
// be in).
void transform_2d(const Transforms& t, Which w, int64_t in_span, int64_t out_span, int64_t channels, const Chunk& k,
                  const float* in, float* half, float* out) {
  const int64_t plane = channels * k.ld;
  transform_segments(t, w, in, in_span * plane, half, in_span * plane, in_span * channels, k.ld, k.tiles);  // x -> x'
  for (int64_t x = 0; x < out_span; ++x) {
    transform_segments(t, w, half + x * in_span * plane, plane, out + x * out_span * plane, plane, channels, k.ld,
                       k.tiles);  // y -> y'
  }
}

Planes input_planes(const Problem& p, const Transforms& t) {
  return {p.channels, p.height, p.width, input_layout(p, t), t.alpha};
}
Planes output_planes(const Problem& p, const Transforms& t) {
  return {p.out_channels, p.out_h, p.out_w, output_layout(p, t), t.m};
}

namespace {

// The tiles of the chunk's planes (the first at `planes`; zero in the padding
// and past the plane): P[r][s][c][t] of the input, dY[a][b][o][t] of the
// output gradient. Every plane lands at the same place in the padded copy, so
// its border is cleared once. split(row, tiles, dst) writes one row of each
// tile of a row of tiles: Cols elements, dst[0 .. Cols). Span (the tile's
// rows) and Cols fixed at compile time when > 0; both are shape.span when 0.
template <int Span, int Cols, class Split>
void tiles_of_span(const float* planes, const Planes& shape, const Problem& p, const Transforms& t, const Chunk& k,
                   float* tiles, Split&& split) {
  const Tiling tl = tiling(p, t.m);
  const int64_t span = Span > 0 ? Span : shape.span, cols = Cols > 0 ? Cols : span, channels = shape.channels;
  const Padded& layout = shape.layout;
  float* copy = padded_buffer(layout);
  std::fill(copy, copy + layout.rows * layout.cols, 0.0f);
  const Overlap o = overlap(layout, shape.height, shape.width);
  float* dst[kMaxAlpha];
  for (int64_t i = 0; i < k.images; ++i) {
    for (int64_t c = 0; c < channels; ++c) {
      const float* plane = planes + (i * channels + c) * shape.height * shape.width;
      for (int64_t y = o.y0; y < o.y1; ++y) {
        std::copy(plane + y * shape.width + o.x0, plane + y * shape.width + o.x1,
                  copy + (y + layout.top) * layout.cols + layout.left + o.x0);
      }
      for (int64_t th = 0; th < tl.rows; ++th) {
        for (int64_t row = 0; row < span; ++row) {
          for (int64_t col = 0; col < cols; ++col) {
            dst[col] = tiles + ((row * cols + col) * channels + c) * k.ld + i * tl.per_image + th * tl.cols;
          }
          split(copy + (th * t.m + row) * layout.cols, tl.cols, dst);
        }
      }
    }
  }
}
#if defined(__x86_64__)
// tiles_of with transform W of F (Out x In, In = shape.span) applied along
// each tile's rows on the way (split_row_transformed): Out elements per tile row.
template <class F, Which W, int Out, int In>
void gather_transformed(const float* planes, const Planes& shape, const Problem& p, const Transforms& t,
                        const Chunk& k, float* tiles) {
  tiles_of_span<In, Out>(planes, shape, p, t, k, tiles, [](const float* row, int64_t count, float* const* dst) {
    split_row_transformed<F, W, Out, In>(row, count, dst);
  });
}
#endif
void tiles_of(const float* planes, const Planes& shape, const Problem& p, const Transforms& t, const Chunk& k,
              float* tiles) {
  tiles_of_span<0, 0>(planes, shape, p, t, k, tiles, [&](const float* row, int64_t count, float* const* dst) {
    split_row(row, count, t.m, shape.span, dst);
  });
}

// Whether the tiles of F(4x4, 3x3) and F(4x4, 5x5) are gathered with their
// first transform (split_row_transformed): the transforms' compiled kernels
// are there.
bool transforms_in_gather(const Transforms& t) {
#if defined(__x86_64__)
  return t.m == 4 && (t.r == 3 || t.r == 5) && cpu_has_avx2();
#else
  return false;
#endif
}

}  // namespace

// V[ξ][ν][c][t] of the chunk, in the input_tiles slot (input_half is scratch).
float* transformed_input(const float* input, const Problem& p, const Transforms& t, const Chunk& k) {
  const int64_t alpha = t.alpha, ct = p.channels * k.ld;
  float* v = scratch(WinogradSlot::input_tiles, alpha * alpha * ct);
  float* half = scratch(WinogradSlot::input_half, alpha * alpha * ct);
  const float* planes = input + k.n0 * p.channels * p.height * p.width;
#if defined(__x86_64__)
  if (transforms_in_gather(t)) {
    if (t.r == 3) {
      gather_transformed<Fixed<4, 3>, Which::bt, 6, 6>(planes, input_planes(p, t), p, t, k, half);  // P[r][s] -> [r][ν]
    } else {
      gather_transformed<Fixed<4, 5>, Which::bt, 8, 8>(planes, input_planes(p, t), p, t, k, half);
    }
    const int64_t plane = p.channels * k.ld;
    transform_segments(t, Which::bt, half, alpha * plane, v, alpha * plane, alpha * p.channels, k.ld, k.tiles);  // r -> ξ
    return v;
  }
#endif
  tiles_of(planes, input_planes(p, t), p, t, k, v);
  transform_2d(t, Which::bt, alpha, alpha, p.channels, k, v, half, v);  // P[r][s] -> V[ξ][ν]
  return v;
}

// dM[ξ][ν][o][t]: the adjoint of the output transform applied to the chunk's
// output gradient tiles, in the product slot (output_half and output_tiles are
// scratch).
float* transformed_grad_output(const float* grad_output, const Problem& p, const Transforms& t, const Chunk& k) {
  const int64_t alpha = t.alpha, m = t.m, o_count = p.out_channels, ot = o_count * k.ld;
  const float* planes = grad_output + k.n0 * o_count * p.out_h * p.out_w;
  float* dm = scratch(WinogradSlot::product, alpha * alpha * ot);
#if defined(__x86_64__)
  if (transforms_in_gather(t)) {
    float* half = scratch(WinogradSlot::output_half, m * alpha * ot);  // [a][ν][o][t]
    if (t.r == 3) {
      gather_transformed<Fixed<4, 3>, Which::a, 6, 4>(planes, output_planes(p, t), p, t, k, half);  // dY[a][b] -> [a][ν]
    } else {
      gather_transformed<Fixed<4, 5>, Which::a, 8, 4>(planes, output_planes(p, t), p, t, k, half);
    }
    transform_segments(t, Which::a, half, alpha * ot, dm, alpha * ot, alpha * o_count, k.ld, k.tiles);  // a -> ξ
    return dm;
  }
#endif
  float* tiles_dy = scratch(WinogradSlot::output_tiles, m * m * ot);  // [a][b][o][t]
  tiles_of(planes, output_planes(p, t), p, t, k, tiles_dy);
  transform_2d(t, Which::a, m, alpha, o_count, k, tiles_dy, scratch(WinogradSlot::output_half, alpha * m * ot),
               dm);  // dY[a][b] -> dM[ξ][ν]
  return dm;
}

}  // namespace loom::ops::cpu::winograd::detail

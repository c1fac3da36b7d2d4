// cat: tensors joined along one dimension (PyTorch's torch.cat), for
// DenseNet-style channel concatenation and Inception branches.
//
// Shapes: every input has the same rank and the same sizes except along
// `dim`; the output's size along `dim` is the sum of theirs.
//   backward: input k's gradient is the slice of g along `dim` at its offset.
// No kernel of its own: both backends copy through Tensor::copy_ (strided
// copies on the CPU and on CUDA), so cat runs wherever its inputs live.
#pragma once

#include <cstdint>

#include <loom/core/autograd.h>

namespace loom {

// Inputs of one dtype and device; `dim` may be negative (counted from the end).
Tensor cat(const TensorList& tensors, int64_t dim);

}  // namespace loom

// Run-time CPU feature checks for the hand-vectorised f32 kernels: the
// default build targets any x86-64, and a kernel compiled for AVX2 (with
// __attribute__((target("avx2")))) runs only where the CPU has it.
#pragma once

namespace loom::ops::cpu {

inline bool cpu_has_avx2() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
#else
  return false;
#endif
}

}  // namespace loom::ops::cpu

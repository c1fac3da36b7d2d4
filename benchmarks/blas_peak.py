#!/usr/bin/env python3
"""This machine's f32 matrix-multiply peak through NumPy's BLAS (OpenBLAS with
Debian's libopenblas0-pthread): the best of a few n x n x n products, at the
thread count given, as one JSON line. The throughput benchmarks' --profile
GFLOP/s per layer are read against this and benchmarks/gemm_peak.

    OPENBLAS_NUM_THREADS=1 python3 benchmarks/blas_peak.py --size 1024
"""
import argparse, json, os, time

import numpy as np


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((a.size, a.size), dtype=np.float32)
    y = rng.standard_normal((a.size, a.size), dtype=np.float32)
    z = x @ y  # warm-up
    best = float("inf")
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        z = x @ y
        best = min(best, time.perf_counter() - t0)
    # Validate against a float64 product on a few rows before reporting.
    ref = x[:8].astype(np.float64) @ y.astype(np.float64)
    err = float(np.max(np.abs(z[:8] - ref)) / np.max(np.abs(ref)))
    if not err < 1e-4:
        raise SystemExit(f"blas_peak: the f32 product differs from f64 by {err}")
    config = np.__config__
    print(json.dumps({"bench": "f32 gemm peak (numpy BLAS)", "n": a.size,
                      "threads": os.environ.get("OPENBLAS_NUM_THREADS", "default"),
                      "gflops": round(2 * a.size ** 3 / best / 1e9, 1), "numpy": np.__version__}))


if __name__ == "__main__":
    main()

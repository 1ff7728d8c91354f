#!/usr/bin/env python3
"""NumPy's numbers on the shapes of benches/tensor_kernels.rs, as a markdown table.

GEMM rows report GFLOP/s (2*m*n*k per product, float64); streaming rows report
GB/s of bytes read plus written (copy and scale move 2 arrays, add 3, dot 2,
sum 1), counted the same way as the criterion bench.

The BLAS thread count comes from OPENBLAS_NUM_THREADS / OMP_NUM_THREADS as set
in the environment, or from --threads N, which sets both (and
MKL_NUM_THREADS) before NumPy is imported:

    python3 benches/compare_kernels.py --threads 1
    python3 benches/compare_kernels.py --threads 2
    python3 benches/compare_kernels.py --threads 1 --no-hugepages
"""

import argparse
import os
import statistics
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, help="BLAS threads (sets OPENBLAS/OMP/MKL_NUM_THREADS)")
    p.add_argument("--min-time", type=float, default=1.0, help="seconds to time each case (default 1.0)")
    p.add_argument(
        "--no-hugepages",
        action="store_true",
        help="stop NumPy from madvising huge pages for its arrays, as Rust's Vec does not "
        "(under THP=madvise this is what makes out-of-cache reductions comparable)",
    )
    return p.parse_args()


ARGS = parse_args()
if ARGS.threads is not None:
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(ARGS.threads)

import numpy as np  # noqa: E402  (must follow the environment setup)


def time_per_call(fn, min_time):
    """Median per-call time over batches of ~50 ms run for about min_time in total
    (the median, like criterion's central estimate, rather than the best batch)."""
    fn()
    t0 = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t0, 1e-7)
    per_batch = max(1, int(0.05 / once))
    samples = []
    start = time.perf_counter()
    while time.perf_counter() - start < min_time or len(samples) < 5:
        t = time.perf_counter()
        for _ in range(per_batch):
            fn()
        samples.append((time.perf_counter() - t) / per_batch)
    return statistics.median(samples)


def set_hugepages(enabled):
    """NumPy madvises MADV_HUGEPAGE on large arrays; returns False if it can't be changed."""
    try:
        from numpy._core.multiarray import _set_madvise_hugepage
    except ImportError:
        try:
            from numpy.core.multiarray import _set_madvise_hugepage
        except ImportError:
            return False
    _set_madvise_hugepage(enabled)
    return True


def main():
    if ARGS.no_hugepages and not set_hugepages(False):
        print("warning: this NumPy cannot turn off huge pages", file=sys.stderr)
    rng = np.random.default_rng(0)
    threads = os.environ.get("OPENBLAS_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS") or "default (all cores)"
    pages = "off" if ARGS.no_hugepages else "NumPy default"
    print(f"NumPy {np.__version__}, BLAS threads: {threads}, huge pages: {pages}, Python {sys.version.split()[0]}")
    print()
    print("| case | shape | NumPy | unit |")
    print("|---|---|---:|---|")

    for n in (1 << 20, 8 << 20):
        label = f"{n >> 20}M"
        a = rng.uniform(-1, 1, n)
        b = rng.uniform(-1, 1, n)
        out = np.empty(n)
        cases = [
            ("copy", 2, lambda: np.copyto(out, a)),
            ("add", 3, lambda: np.add(a, b, out=out)),
            ("scale", 2, lambda: np.multiply(a, 1.5, out=out)),
            ("dot", 2, lambda: np.dot(a, b)),
            ("sum", 1, lambda: np.sum(a)),
        ]
        for name, arrays, fn in cases:
            t = time_per_call(fn, ARGS.min_time)
            print(f"| {name} | {label} | {arrays * n * 8 / t / 1e9:.1f} | GB/s |")

    def x(r, c):
        return rng.uniform(-1, 1, (r, c))

    gemms = []
    for s in (64, 256, 512, 1024):
        gemms.append(("gemm", s, s, s, x(s, s), x(s, s)))
    X, W1, G = x(2000, 784), x(784, 20), x(2000, 20)
    gemms.append(("gemm X·W1", 2000, 20, 784, X, W1))
    gemms.append(("gemm_tn Xᵀ·G", 784, 20, 2000, X.T, G))  # transposed view: BLAS trans flag
    gemms.append(("gemm_nt G·W1ᵀ", 2000, 784, 20, G, W1.T))
    for name, m, n, k, A, B in gemms:
        C = np.empty((m, n))
        t = time_per_call(lambda: np.matmul(A, B, out=C), ARGS.min_time)
        print(f"| {name} | {m}x{n}x{k} | {2 * m * n * k / t / 1e9:.1f} | GFLOP/s |")


if __name__ == "__main__":
    main()

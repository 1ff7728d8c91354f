#!/usr/bin/env python3
"""Relational reverse mode on a matrix product written as join + SUM (issue 23).

X (N x D) and W (D x H) are tables of (row, col, value) triples (made from
one series each, so they come in full batches, as a file's rows do); the forward
query is the loss ``sum(Y * Y)`` of ``Y = X W`` computed as
``x JOIN w ON x.d = w.d GROUP BY x.n, w.h``. Timed in one dfgrad process,
in this order, ``--repeat`` times each (ABBA between the three so a slow
phase of a shared machine hits all of them):

  * forward:  ``SELECT loss FROM mm_loss``;
  * grad W:   ``SELECT d, h, grad((SELECT loss FROM mm_loss), val) FROM w``
              (one gradient per weight row: 2 X^T Y);
  * grad X:   the same with respect to every row of ``x`` (2 Y W^T).

Each time is the ``Elapsed`` line dfgrad prints (planning + execution,
results collected into one summed row, so printing does not count). The
whole script runs twice, with the contraction operator (issue 47) and
without it (``SET datafusion_grad.contraction = false``: DataFusion's hash
join + aggregate), and the same three computations are timed in NumPy
(``X @ W`` and the loss, ``2 X^T Y``, ``2 Y W^T``, median of as many runs).
The script checks both gradients against NumPy's closed forms and fails
(exit status 1) beyond ``--tolerance``, then prints the medians and the
ratios to the forward query and to NumPy. The peer's published figure for
the same shapes: backward about 12x the forward.

Usage:

    python3 benches/compare_relational.py                 # N = 50,000, D = 16, H = 8
    python3 benches/compare_relational.py --rows 5000 --repeat 3
    DFGRAD=target/release/dfgrad python3 benches/compare_relational.py
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--inner", type=int, default=16)
    ap.add_argument("--outer", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--tolerance", type=float, default=1e-6)
    args = ap.parse_args()
    dfgrad = os.environ.get("DFGRAD", "target/release/dfgrad")
    n, d, h = args.rows, args.inner, args.outer
    setup = f"""
CREATE TABLE x AS SELECT n, d, sin(n * 0.37 + d) AS v
  FROM (SELECT value / {d} AS n, value % {d} AS d FROM generate_series(0, {n * d - 1}));
CREATE TABLE w AS SELECT d, h, cos(d * 1.3 + h) AS val
  FROM (SELECT value / {h} AS d, value % {h} AS h FROM generate_series(0, {d * h - 1}));
CREATE VIEW mm_loss AS SELECT sum(y * y) AS loss
  FROM (SELECT x.n, w.h, sum(x.v * w.val) AS y FROM x JOIN w ON x.d = w.d GROUP BY x.n, w.h);
"""
    queries = {
        "forward": "SELECT loss AS r FROM mm_loss;",
        "grad W": "SELECT sum(g * (d + 1) * (h + 1)) AS r FROM "
        "(SELECT d, h, grad((SELECT loss FROM mm_loss), val) AS g FROM w);",
        "grad X": "SELECT sum(g * ((n % 7) + 1) * (d + 1)) AS r FROM "
        "(SELECT n, d, grad((SELECT loss FROM mm_loss), v) AS g FROM x);",
    }
    order = []
    for k in range(args.repeat):
        names = list(queries)
        order += names if k % 2 == 0 else names[::-1]
    runs = {}
    for mode in ("on", "off"):
        flag = f"SET datafusion_grad.contraction = {'true' if mode == 'on' else 'false'};\n"
        script = flag + setup + "\n".join(queries[name] for name in order)
        out = subprocess.run(
            [dfgrad, "--maxrows", "inf", "-c", script], capture_output=True, text=True, check=False
        )
        if out.returncode != 0:
            sys.exit(f"dfgrad failed: {out.stderr}")
        elapsed = [float(t) for t in re.findall(r"Elapsed ([0-9.]+) seconds", out.stdout + out.stderr)][4:]
        values = [float(v) for v in re.findall(r"^\| ([-0-9.e+]+)\s*\|$", out.stdout, re.M)]
        times = {name: [] for name in queries}
        results = {}
        for name, t, v in zip(order, elapsed, values):
            times[name].append(t)
            results[name] = v
        runs[mode] = (times, results)
    # NumPy's closed forms, reduced the same way.
    xs = np.sin(np.arange(n)[:, None] * 0.37 + np.arange(d)[None, :])
    ws = np.cos(np.arange(d)[:, None] * 1.3 + np.arange(h)[None, :])
    y = xs @ ws
    dw = 2 * xs.T @ y
    dx = 2 * y @ ws.T
    expected = {
        "forward": float(np.sum(y * y)),
        "grad W": float(np.sum(dw * (np.arange(d)[:, None] + 1) * (np.arange(h)[None, :] + 1))),
        "grad X": float(np.sum(dx * ((np.arange(n)[:, None] % 7) + 1) * (np.arange(d)[None, :] + 1))),
    }
    numpy_times = {name: [] for name in queries}
    for _ in range(args.repeat):
        t = time.perf_counter()
        y = xs @ ws
        float(np.sum(y * y))
        numpy_times["forward"].append(time.perf_counter() - t)
        t = time.perf_counter()
        y = xs @ ws
        2 * xs.T @ y
        numpy_times["grad W"].append(time.perf_counter() - t)
        t = time.perf_counter()
        y = xs @ ws
        2 * y @ ws.T
        numpy_times["grad X"].append(time.perf_counter() - t)
    worst = max(
        abs(results[k] - expected[k]) / (1 + abs(expected[k]))
        for _, results in runs.values()
        for k in queries
    )
    print(f"N={n} D={d} H={h}, {args.repeat} runs each, dfgrad {dfgrad}")
    print("| query | contraction (s) | join + aggregate (s) | NumPy (s) | contraction / NumPy | contraction / forward |")
    print("|---|---|---|---|---|---|")
    forward = statistics.median(runs["on"][0]["forward"])
    for name in queries:
        on = statistics.median(runs["on"][0][name])
        off = statistics.median(runs["off"][0][name])
        npy = statistics.median(numpy_times[name])
        print(f"| {name} | {on:.4f} | {off:.4f} | {npy:.4f} | {on / npy:.1f}x | {on / forward:.2f} |")
    print(f"largest relative difference from NumPy: {worst:.2e}")
    if worst > args.tolerance:
        sys.exit(1)


if __name__ == "__main__":
    main()

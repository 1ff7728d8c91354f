#!/usr/bin/env python3
"""A two-layer graph convolution trained with its parameters as rows
(issue 47): ``--steps`` gradient steps over a graph of ``--edges`` edges,
timed, with the peak memory of the dfgrad process, checked against NumPy.

The model: node features H0 (N x F), edges (src, dst, a) with every node
receiving ``--degree`` edges of weight 1/degree; A·X sums ``a · X[src]``
into ``dst``. Prediction ``P = A·tanh(A·H0·W1)·W2`` (F -> G -> 1), loss the
mean squared error against a target per node. Relationally:

  e(src, dst, a), h0(n, f, v), t(n, y), w(layer, i, j, val);
  every product (``A·X`` and ``X·W``) a join + ``sum`` ``GROUP BY`` (a
  contraction), the step
  ``CREATE OR REPLACE TABLE w AS WITH … SELECT layer, i, j, val - lr *
  grad((SELECT loss FROM loss), val) AS val FROM w`` (relational reverse
  mode through both layers and both graph products).

NumPy does the same step vectorized (gathers, ``np.add.at`` scatters, the
gradients written out). The script fails (exit status 1) if the loss after
the steps differs from NumPy's by more than ``--tolerance`` relative, and
prints the time of each step (dfgrad's ``Elapsed``, planning included), the
loss, and the dfgrad process's peak resident memory (``/usr/bin/time``).

Usage:

    python3 benches/relational_gcn.py                    # 100,000 nodes, 1,000,000 edges, 5 steps
    python3 benches/relational_gcn.py --nodes 10000 --degree 5 --steps 3
    DFGRAD=target/release/dfgrad python3 benches/relational_gcn.py
"""

import argparse
import os
import re
import subprocess
import sys

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=100_000)
    ap.add_argument("--degree", type=int, default=10)
    ap.add_argument("--features", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--tolerance", type=float, default=1e-9)
    args = ap.parse_args()
    dfgrad = os.environ.get("DFGRAD", "target/release/dfgrad")
    n, k, f, g, lr = args.nodes, args.degree, args.features, args.hidden, args.lr
    # Edge j of node s goes to (s + stride_j) mod N: every node receives k.
    strides = [1 + (j * 7919) % (n - 1) for j in range(k)] if n > 1 else [0] * k
    stride_sql = "CASE value % {k} {cases} END".format(
        k=k, cases=" ".join(f"WHEN {j} THEN {s}" for j, s in enumerate(strides))
    )
    setup = f"""
CREATE TABLE e AS SELECT value / {k} AS src, (value / {k} + {stride_sql}) % {n} AS dst,
  {1.0 / k!r} AS a FROM generate_series(0, {n * k - 1});
CREATE TABLE h0 AS SELECT value / {f} AS n, value % {f} AS f,
  sin((value / {f}) * 0.37 + (value % {f}) * 1.3) AS v FROM generate_series(0, {n * f - 1});
CREATE TABLE t AS SELECT value AS n, cos(value * 0.1) AS y FROM generate_series(0, {n - 1});
CREATE TABLE w AS
  SELECT 1 AS layer, value / {g} AS i, value % {g} AS j,
    0.3 * cos(1.7 + (value / {g}) * 0.3 + (value % {g}) * 1.1) AS val
  FROM generate_series(0, {f * g - 1})
  UNION ALL
  SELECT 2 AS layer, value AS i, 0 AS j, 0.3 * cos(3.4 + value * 0.7) AS val
  FROM generate_series(0, {g - 1});
"""
    # As CTEs: a view would keep reading the table it was created over
    # after CREATE OR REPLACE TABLE replaces it.
    loss = """WITH ah0 AS (SELECT e.dst AS n, h0.f AS i, sum(e.a * h0.v) AS v
             FROM e JOIN h0 ON h0.n = e.src GROUP BY e.dst, h0.f),
h1 AS (SELECT ah0.n, w.j, sum(ah0.v * w.val) AS s FROM ah0
       JOIN w ON w.layer = 1 AND w.i = ah0.i GROUP BY ah0.n, w.j),
a1 AS (SELECT n, j AS i, tanh(s) AS v FROM h1),
ah1 AS (SELECT e.dst AS n, a1.i, sum(e.a * a1.v) AS v
        FROM e JOIN a1 ON a1.n = e.src GROUP BY e.dst, a1.i),
p AS (SELECT ah1.n, sum(ah1.v * w.val) AS p FROM ah1
      JOIN w ON w.layer = 2 AND w.i = ah1.i GROUP BY ah1.n),
gcn_loss AS (SELECT avg((p.p - t.y) * (p.p - t.y)) AS loss FROM p JOIN t ON t.n = p.n)
"""
    step = (
        f"CREATE OR REPLACE TABLE w AS {loss} SELECT layer, i, j, "
        f"val - {lr} * grad((SELECT loss FROM gcn_loss), val) AS val FROM w;\n"
    )
    script = setup + step * args.steps + f"{loss} SELECT loss AS r FROM gcn_loss;\n"
    command = [dfgrad, "--maxrows", "inf", "-c", script]
    timed = os.path.exists("/usr/bin/time")
    if timed:
        command = ["/usr/bin/time", "-v"] + command
    out = subprocess.run(command, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"dfgrad failed: {out.stderr[-2000:]}")
    elapsed = [float(x) for x in re.findall(r"Elapsed ([0-9.]+) seconds", out.stdout + out.stderr)]
    steps = elapsed[4 : 4 + args.steps]
    values = [float(v) for v in re.findall(r"^\| ([-0-9.e+]+)\s*\|$", out.stdout, re.M)]
    got = values[-1]
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", out.stderr)

    # NumPy: the same steps.
    src = np.repeat(np.arange(n), k)
    dst = (src + np.tile(np.array(strides), n)) % n
    a = 1.0 / k
    nodes = np.arange(n)
    h0 = np.sin(nodes[:, None] * 0.37 + np.arange(f)[None, :] * 1.3)
    y = np.cos(nodes * 0.1)
    w1 = 0.3 * np.cos(1.7 + np.arange(f)[:, None] * 0.3 + np.arange(g)[None, :] * 1.1)
    w2 = 0.3 * np.cos(3.4 + np.arange(g) * 0.7)

    def spread(x):
        out = np.zeros((n,) + x.shape[1:])
        np.add.at(out, dst, a * x[src])
        return out

    def gather_back(x):
        out = np.zeros((n,) + x.shape[1:])
        np.add.at(out, src, a * x[dst])
        return out

    ah0 = spread(h0)

    def forward(w1, w2):
        a1 = np.tanh(ah0 @ w1)
        ah1 = spread(a1)
        p = ah1 @ w2
        return a1, ah1, p, float(np.mean((p - y) ** 2))

    for _ in range(args.steps):
        a1, ah1, p, _ = forward(w1, w2)
        dp = 2 * (p - y) / n
        dw2 = ah1.T @ dp
        da1 = gather_back(np.outer(dp, w2))
        ds1 = da1 * (1 - a1 * a1)
        dw1 = ah0.T @ ds1
        w1, w2 = w1 - lr * dw1, w2 - lr * dw2
    expected = forward(w1, w2)[3]
    difference = abs(got - expected) / max(abs(expected), 1e-300)

    print(f"GCN: {n} nodes, {n * k} edges, F={f} G={g}, {args.steps} steps, dfgrad {dfgrad}")
    print("step times (s): " + ", ".join(f"{s:.3f}" for s in steps))
    print(f"loss after the steps: {got!r} (NumPy {expected!r}, relative difference {difference:.2e})")
    if peak:
        print(f"peak resident memory of the dfgrad process: {int(peak.group(1)) / 1024:.0f} MiB")
    if difference > args.tolerance:
        sys.exit(f"the loss differs from NumPy's by {difference:.2e}")


if __name__ == "__main__":
    main()

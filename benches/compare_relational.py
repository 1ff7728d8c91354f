#!/usr/bin/env python3
"""Relational reverse mode on models written as join + SUM (issues 23, 47).

The matrix product (``--model product``, the default):

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

Matrix factorization (``--model factorization``): ratings r(i, j, val)
(``--rows`` of them, each (user, item) pair once) predicted by
``sum(u.val * v.val)`` over ``r JOIN u ON u.i = r.i JOIN v ON v.j = r.j AND
v.k = u.k GROUP BY r.i, r.j`` for user factors u(i, k, val) and item
factors v(j, k, val) (``--users`` x ``--factors``, ``--items`` x
``--factors``), the loss the sum of squared errors; timed: the forward loss,
and its gradients with respect to every row of u and of v. NumPy does the
same vectorized: gather the factor rows, a row-wise dot, and the gradients
scattered by ``np.add.reduceat`` over the ratings sorted by user (by item),
sorted before the clock starts.

Usage:

    python3 benches/compare_relational.py                 # N = 50,000, D = 16, H = 8
    python3 benches/compare_relational.py --rows 5000 --repeat 3
    python3 benches/compare_relational.py --model factorization   # 500,000 ratings, 16 factors
    python3 benches/compare_relational.py --partitions 1  # one partition (a one-core machine)
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


def product(args):
    """The matrix product: setup SQL, queries, NumPy's answers and timer."""
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
    xs = np.sin(np.arange(n)[:, None] * 0.37 + np.arange(d)[None, :])
    ws = np.cos(np.arange(d)[:, None] * 1.3 + np.arange(h)[None, :])

    def forward():
        y = xs @ ws
        return float(np.sum(y * y))

    def grad_w():
        return 2 * xs.T @ (xs @ ws)

    def grad_x():
        return 2 * (xs @ ws) @ ws.T

    expected = {
        "forward": forward(),
        "grad W": float(np.sum(grad_w() * (np.arange(d)[:, None] + 1) * (np.arange(h)[None, :] + 1))),
        "grad X": float(np.sum(grad_x() * ((np.arange(n)[:, None] % 7) + 1) * (np.arange(d)[None, :] + 1))),
    }
    numpy = {"forward": forward, "grad W": grad_w, "grad X": grad_x}
    return f"N={n} D={d} H={h}", setup, queries, expected, numpy


def factorization(args):
    """Matrix factorization: setup SQL, queries, NumPy's answers and timer."""
    r, users, items, k = args.rows, args.users, args.items, args.factors
    per_user = -(-r // users)
    if per_user > items:
        sys.exit("more ratings than (user, item) pairs")
    # rating t: user t % users, item (t // users * step + user * 11) % items;
    # with step coprime to items, a user's items are distinct.
    step = next(s for s in range(37, items + 37) if np.gcd(s, items) == 1)
    setup = f"""
CREATE TABLE r AS SELECT i, j, sin(i * 0.5 + j * 0.25) AS val FROM (
  SELECT value % {users} AS i, ((value / {users}) * {step} + (value % {users}) * 11) % {items} AS j
  FROM generate_series(0, {r - 1}));
CREATE TABLE u AS SELECT i, k, 0.1 * sin(i * 0.37 + k) AS val
  FROM (SELECT value / {k} AS i, value % {k} AS k FROM generate_series(0, {users * k - 1}));
CREATE TABLE v AS SELECT j, k, 0.1 * cos(j * 1.3 + k) AS val
  FROM (SELECT value / {k} AS j, value % {k} AS k FROM generate_series(0, {items * k - 1}));
CREATE VIEW mf_pred AS SELECT r.i, r.j, sum(u.val * v.val) AS p
  FROM r JOIN u ON u.i = r.i JOIN v ON v.j = r.j AND v.k = u.k GROUP BY r.i, r.j;
CREATE VIEW mf_loss AS SELECT sum((q.p - r.val) * (q.p - r.val)) AS loss
  FROM mf_pred q JOIN r ON r.i = q.i AND r.j = q.j;
"""
    queries = {
        "forward": "SELECT loss AS r FROM mf_loss;",
        "grad U": "SELECT sum(g * ((i % 7) + 1) * (k + 1)) AS r FROM "
        "(SELECT i, k, grad((SELECT loss FROM mf_loss), val) AS g FROM u);",
        "grad V": "SELECT sum(g * ((j % 5) + 1) * (k + 1)) AS r FROM "
        "(SELECT j, k, grad((SELECT loss FROM mf_loss), val) AS g FROM v);",
    }
    t = np.arange(r)
    ri = t % users
    rj = ((t // users) * step + ri * 11) % items
    if len(set(zip(ri.tolist(), rj.tolist()))) != r:
        sys.exit("ratings repeat a (user, item) pair")
    rv = np.sin(ri * 0.5 + rj * 0.25)
    us = 0.1 * np.sin(np.arange(users)[:, None] * 0.37 + np.arange(k)[None, :])
    vs = 0.1 * np.cos(np.arange(items)[:, None] * 1.3 + np.arange(k)[None, :])
    # sorted by user and by item before the clock starts, for reduceat
    by_user, by_item = np.argsort(ri, kind="stable"), np.argsort(rj, kind="stable")

    def scattered(order, rows, values, count):
        ids = rows[order]
        starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        out = np.zeros((count, k))
        out[ids[starts]] = np.add.reduceat(values[order], starts, axis=0)
        return out

    def errors():
        return np.einsum("ij,ij->i", us[ri], vs[rj]) - rv

    def forward():
        e = errors()
        return float(e @ e)

    def grad_u():
        return scattered(by_user, ri, 2 * errors()[:, None] * vs[rj], users)

    def grad_v():
        return scattered(by_item, rj, 2 * errors()[:, None] * us[ri], items)

    expected = {
        "forward": forward(),
        "grad U": float(np.sum(grad_u() * ((np.arange(users)[:, None] % 7) + 1) * (np.arange(k)[None, :] + 1))),
        "grad V": float(np.sum(grad_v() * ((np.arange(items)[:, None] % 5) + 1) * (np.arange(k)[None, :] + 1))),
    }
    numpy = {"forward": forward, "grad U": grad_u, "grad V": grad_v}
    return f"R={r} users={users} items={items} K={k}", setup, queries, expected, numpy


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("product", "factorization"), default="product")
    ap.add_argument("--rows", type=int, help="N (product; 50,000) or ratings (factorization; 500,000)")
    ap.add_argument("--inner", type=int, default=16)
    ap.add_argument("--outer", type=int, default=8)
    ap.add_argument("--users", type=int, default=6_000)
    ap.add_argument("--items", type=int, default=4_000)
    ap.add_argument("--factors", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--tolerance", type=float, default=1e-6)
    ap.add_argument("--partitions", type=int, help="SET datafusion.execution.target_partitions first")
    args = ap.parse_args()
    dfgrad = os.environ.get("DFGRAD", "target/release/dfgrad")
    if args.model == "product":
        args.rows = args.rows or 50_000
        shape, setup, queries, expected, numpy = product(args)
    else:
        args.rows = args.rows or 500_000
        shape, setup, queries, expected, numpy = factorization(args)
    if args.partitions:
        setup = f"SET datafusion.execution.target_partitions = {args.partitions};\n" + setup
    setup_statements = setup.count(";")
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
        elapsed = [float(t) for t in re.findall(r"Elapsed ([0-9.]+) seconds", out.stdout + out.stderr)]
        elapsed = elapsed[1 + setup_statements:]
        values = [float(v) for v in re.findall(r"^\| ([-0-9.e+]+)\s*\|$", out.stdout, re.M)]
        times = {name: [] for name in queries}
        results = {}
        for name, t, v in zip(order, elapsed, values):
            times[name].append(t)
            results[name] = v
        runs[mode] = (times, results)
    numpy_times = {name: [] for name in queries}
    for _ in range(args.repeat):
        for name, f in numpy.items():
            t = time.perf_counter()
            f()
            numpy_times[name].append(time.perf_counter() - t)
    worst = max(
        abs(results[k] - expected[k]) / (1 + abs(expected[k]))
        for _, results in runs.values()
        for k in queries
    )
    print(f"{args.model} {shape}, {args.repeat} runs each, dfgrad {dfgrad}")
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

#!/usr/bin/env python3
"""Derivatives through WITH RECURSIVE (issue 24): the cost of forward mode
against the loop alone, side by side in one dfgrad process.

Cases (each a recursive query; the timed statement returns one row):

  * `logistic T`: Euler steps of x' = a x (1 - x), T steps; `loop` selects
    x_T, `1 var` also grad(x, a), `2 vars` also grad(x, x0) (two tangent
    sets).
  * `hypergradient N`: 20 gradient-descent steps of linear regression over an
    N-row table (aggregates over the data in every step); `loop` selects the
    final loss, `1 var` its derivative with respect to the learning rate.

The time of a statement is the `Elapsed` line dfgrad prints for it
(planning + execution). Variants alternate within one process (ABBA order)
and the table reports the median of `--repeat` runs and the ratio to the
loop alone; the issue's target is <= 2x the loop per variable.

    python3 benches/compare_recursion.py [--dfgrad PATH] [--repeat 5]
"""

import argparse
import os
import re
import statistics
import subprocess
import sys

LOGISTIC = """WITH RECURSIVE s(step, x, a, x0) AS (
  SELECT 0 AS step, x0 AS x, a, x0 FROM (SELECT 0.3 AS x0, 2.7 AS a) i
  UNION ALL SELECT step + 1, x + 0.05 * a * x * (1 - x) / (1 + 0.01 * x), a, x0 FROM s WHERE step < {t})
SELECT {select} FROM s WHERE step = {t};"""

LOGISTIC_SELECTS = {
    "loop": "x",
    "1 var": "x, grad(x, a)",
    "2 vars": "x, grad(x, a), grad(x, x0)",
}

HYPER = """WITH RECURSIVE p(step, w, b, lr) AS (
  SELECT 0 AS step, CAST(0.0 AS DOUBLE) AS w, CAST(0.0 AS DOUBLE) AS b, CAST(0.2 AS DOUBLE) AS lr
  UNION ALL
  SELECT p.step + 1,
         p.w - p.lr * avg(2 * (p.w * d.x + p.b - d.y) * d.x),
         p.b - p.lr * avg(2 * (p.w * d.x + p.b - d.y)), p.lr
  FROM p CROSS JOIN d WHERE p.step < 20 GROUP BY p.step, p.w, p.b, p.lr)
SELECT {select} FROM p CROSS JOIN d WHERE p.step = 20 GROUP BY p.lr;"""

HYPER_SELECTS = {
    "loop": "avg(power(p.w * d.x + p.b - d.y, 2))",
    "1 var": "avg(power(p.w * d.x + p.b - d.y, 2)), grad(avg(power(p.w * d.x + p.b - d.y, 2)), p.lr)",
}


def default_dfgrad():
    target = os.environ.get(
        "CARGO_TARGET_DIR", os.path.expanduser("~/.cache/datafusion-grad/target")
    )
    return os.environ.get("DFGRAD", os.path.join(target, "release", "dfgrad"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dfgrad", default=default_dfgrad())
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--steps", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--rows", type=int, nargs="+", default=[100_000])
    args = ap.parse_args()

    cases = []  # (case, variant, sql)
    for t in args.steps:
        for variant, select in LOGISTIC_SELECTS.items():
            cases.append((f"logistic T={t}", variant, LOGISTIC.format(t=t, select=select)))
    setup = []
    for n in args.rows:
        setup.append(
            f"CREATE OR REPLACE TABLE d AS SELECT x, 1.7 * x - 0.4 + 0.1 * sin(i * 7.1) AS y "
            f"FROM (SELECT value AS i, CAST(value % 1000 AS DOUBLE) / 500.0 - 1.0 AS x "
            f"FROM generate_series(1, {n}));"
        )
        for variant, select in HYPER_SELECTS.items():
            cases.append((f"hypergradient N={n}", variant, HYPER.format(select=select)))
    if len(args.rows) > 1:
        sys.exit("one --rows value per run (the table d is replaced)")

    # ABBA order: each round runs the variants forwards, then backwards.
    order = []
    for r in range(args.repeat):
        order.extend(cases if r % 2 == 0 else list(reversed(cases)))
    script = "\n".join(setup + [sql for _, _, sql in [cases[0]]] + [sql for _, _, sql in order])
    p = subprocess.run([args.dfgrad, "-f", "/dev/stdin"], input=script, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(p.stderr)
    elapsed = [float(m) for m in re.findall(r"Elapsed ([0-9.]+) seconds", p.stdout + p.stderr)]
    elapsed = elapsed[len(setup) + 1 :]  # the setup and one warm-up run
    if len(elapsed) != len(order):
        sys.exit(f"expected {len(order)} timings, got {len(elapsed)}:\n{p.stdout[-2000:]}")
    times = {}
    for (case, variant, _), t in zip(order, elapsed):
        times.setdefault((case, variant), []).append(t)
    print(f"dfgrad: {args.dfgrad}; median of {args.repeat} runs, seconds")
    print(f"{'case':<24} {'variant':<8} {'time s':>9} {'vs loop':>8}")
    for case in dict.fromkeys(c for c, _, _ in cases):
        base = statistics.median(times[(case, "loop")])
        for variant in dict.fromkeys(v for c, v, _ in cases if c == case):
            t = statistics.median(times[(case, variant)])
            print(f"{case:<24} {variant:<8} {t:9.4f} {t / base:7.2f}x")


if __name__ == "__main__":
    main()

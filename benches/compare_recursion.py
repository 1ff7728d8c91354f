#!/usr/bin/env python3
"""Derivatives through WITH RECURSIVE (issue 24): the cost of forward and
reverse mode against the loop alone, side by side in one dfgrad process.

Cases (each a recursive query; the timed statement returns one row):

  * `logistic T`: Euler steps of x' = a x (1 - x), T steps; `loop` selects
    x_T, `1 var` also grad(x, a), `2 vars` also grad(x, x0) (two tangent
    sets), `reverse` the two derivatives in reverse mode.
  * `residual T`: a 64-element tensor state through T steps v + 0.1 tanh(v);
    `loop` selects tensor_total(v*v) at step T, `reverse` also its gradient
    with respect to the initial state (64 variables: reverse mode, chosen
    automatically).
  * `hypergradient N`: 20 gradient-descent steps of linear regression over an
    N-row table (aggregates over the data in every step); `loop` selects the
    final loss, `1 var` its derivative with respect to the learning rate.
  * `meta N T`: T gradient-descent steps of a tanh unit with 8 weights over
    an N-row table (issue 48, case 1); `loop` selects the validation loss
    (1,000 rows) after it, `forward` and `reverse` also its gradient with
    respect to the initial weights in each mode (forward: 8 tangents
    through every step; reverse: the backward recursive query). The
    issue's target is <= 4x the loop in reverse mode.
  * `mlp T` (with `--mlp-steps`): T steps of the 784-20-10 ReLU network of
    `examples/mlp.sql` (6,000 samples in 3 batches of 2,000; issue 48, case
    3); `loop` selects the held-out batch's loss after it, `reverse` also
    its gradient with respect to the initial 784x20 first layer (15,680
    variables; its elements summed, so that one number comes back).
  * `valuation N T`: the same loop over an N-row table with a weight per
    row, w <- w - 0.5 sum(wt grad) / sum(wt) (issue 48, case 4); `loop`
    selects the validation loss, `reverse` the derivative of that loss with
    respect to every row's weight (relational reverse mode through the
    loop), summed with the count of rows so that one row comes back.
  * `relational N T`: the relational loop of docs/relational.md (100
    parameter rows, the CTE's own rows; each step the gradient of a loss
    subquery over the N-row table joined with them all), T steps; `loop`
    selects the final loss, `forward` its derivative with respect to the
    learning rate carried by every row (forward mode: the loss's tangent),
    `reverse` the derivative with respect to every data row's y (relational
    reverse mode through the loop, summed with the count of rows).

The time of a statement is the `Elapsed` line dfgrad prints for it
(planning + execution). Variants alternate within one process (ABBA order)
and the table reports the median of `--repeat` runs and the ratio to the
loop alone; the issue's targets are <= 2x the loop per variable in forward
mode and <= 4x for the 64-element state in reverse mode.

`--memory` instead runs the residual loop with a larger state (10,000
elements) in a process of its own per variant, in one and two partitions,
and reports the peak resident memory of the loop alone and of its gradient,
every state kept (`checkpoint_every = 1`) against the default (about every
sqrt(T)-th state kept, the rest recomputed); then the same for `meta`
(case 1) over `--rows` rows at each of `--meta-steps`.

    python3 benches/compare_recursion.py [--dfgrad PATH] [--repeat 5]
    python3 benches/compare_recursion.py --memory --steps 1000 10000
    python3 benches/compare_recursion.py --memory --steps 100 --rows 1000 --meta-steps 100 1000 10000
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

RESIDUAL = """WITH RECURSIVE s(step, v, v0) AS (
  SELECT 0, v0 AS v, v0 FROM (SELECT scale(random_tensor(7, {n}), 0.5) AS v0) i
  UNION ALL SELECT step + 1, tensor_add(v, scale(tensor_tanh(v), 0.1)), v0 FROM s WHERE step < {t})
SELECT {select} FROM s WHERE step = {t};"""

RESIDUAL_SELECTS = {
    "loop": "tensor_total(tensor_mul(v, v))",
    "reverse": "tensor_total(tensor_mul(v, v)), grad(tensor_total(tensor_mul(v, v)), v0)",
}

REVERSE = "SET datafusion_grad.recursion_mode = 'reverse';\n{sql}\nSET datafusion_grad.recursion_mode = 'auto';"
FORWARD = REVERSE.replace("'reverse'", "'forward'")

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

META = """WITH RECURSIVE train(step, w, w0) AS (
  SELECT 0, w0 AS w, w0 FROM (SELECT scale(random_tensor(3, 8), 0.3) AS w0) i
  UNION ALL
  SELECT step + 1, tensor_sub(w, scale(tensor_avg(grad(power(tanh(dot(w, x)) - y, 2), w)), 0.5)), w0
  FROM train CROSS JOIN tr WHERE step < {t} GROUP BY step, w, w0)
SELECT {select} FROM train CROSS JOIN va WHERE step = {t} GROUP BY w0;"""

META_LOSS = "avg(power(tanh(dot(w, va.x)) - va.y, 2))"

# An 8-feature table of n rows (features from sines of the row number).
META_TABLE = """CREATE OR REPLACE TABLE {name} AS SELECT
  tensor([sin(i * 0.11), cos(i * 0.23), sin(i * 0.37), cos(i * 0.41), sin(i * 0.53), cos(i * 0.67), sin(i * 0.71), cos(i * 0.83)], 8) AS x,
  tanh(0.4 * sin(i * 0.11) - 0.3 * cos(i * 0.67) + 0.2 * sin(i * 0.71)) AS y
  FROM (SELECT value AS i FROM generate_series({first}, {last}));"""


def default_dfgrad():
    target = os.environ.get(
        "CARGO_TARGET_DIR", os.path.expanduser("~/.cache/datafusion-grad/target")
    )
    return os.environ.get("DFGRAD", os.path.join(target, "release", "dfgrad"))


# examples/mlp.sql's data: 8,000 MNIST-shaped samples in 4 batches.
MLP_TABLE = """CREATE OR REPLACE TABLE mnist_like AS
WITH prototypes AS (
  SELECT tensor(array_agg(sin(0.05 * j * (k + 1)) ORDER BY k, j), 10, 784) AS p
  FROM (SELECT value AS k FROM generate_series(0, 9)), (SELECT value AS j FROM generate_series(0, 783))),
labels AS (
  SELECT i / 2000 AS batch, tensor(array_agg(CAST(i % 10 AS DOUBLE) ORDER BY i), 2000) AS y
  FROM (SELECT value AS i FROM generate_series(0, 7999)) GROUP BY i / 2000)
SELECT batch, tensor_add(matmul(one_hot(y, 10), p), scale(random_tensor(batch, 2000, 784), 4.0)) AS x, y
FROM labels CROSS JOIN prototypes;"""

MLP_LOSS = "cross_entropy(tensor_add(matmul(relu(tensor_add(matmul(x, w1), b1)), w2), b2), y)"

MLP = """WITH RECURSIVE train(step, w1, b1, w2, b2, w1_0) AS (
  SELECT 0, w1_0 AS w1, zeros_like(random_tensor(3, 20)), scale(random_tensor(2, 20, 10), 0.5),
         zeros_like(random_tensor(4, 10)), w1_0
  FROM (SELECT scale(random_tensor(1, 784, 20), 0.1) AS w1_0) i
  UNION ALL
  SELECT step + 1,
         tensor_sub(w1, scale(tensor_avg(g['w1']), 0.5)), tensor_sub(b1, scale(tensor_avg(g['b1']), 0.5)),
         tensor_sub(w2, scale(tensor_avg(g['w2']), 0.5)), tensor_sub(b2, scale(tensor_avg(g['b2']), 0.5)), w1_0
  FROM (SELECT step, w1, b1, w2, b2, w1_0, grad({loss}, w1, b1, w2, b2) AS g
        FROM train CROSS JOIN mnist_like WHERE step < {t} AND batch < 3)
  GROUP BY step, w1, b1, w2, b2, w1_0)
SELECT {select} FROM train CROSS JOIN mnist_like WHERE step = {t} AND batch = 3;"""

MLP_SELECTS = {
    "loop": MLP_LOSS,
    "reverse": f"{MLP_LOSS}, tensor_total(grad({MLP_LOSS}, w1_0))",
}

VALUATION = """WITH RECURSIVE train(step, w) AS (
  SELECT 0, scale(random_tensor(3, 8), 0.3)
  UNION ALL
  SELECT step + 1, tensor_sub(w, scale(tensor_sum(scale(grad(power(tanh(dot(w, x)) - y, 2), w), wt)), 0.5 / sum(wt)))
  FROM train CROSS JOIN trw WHERE step < {t} GROUP BY step, w),
loss AS (SELECT avg(power(tanh(dot(w, va.x)) - va.y, 2)) AS loss FROM train CROSS JOIN va WHERE step = {t})
{select};"""

VALUATION_SELECTS = {
    "loop": "SELECT loss FROM loss",
    "reverse": "SELECT count(*), sum(g) FROM (SELECT grad((SELECT loss FROM loss), trw.wt) AS g FROM trw) s",
}


RELATIONAL = """WITH RECURSIVE train(step, g, w, lr) AS (
  SELECT 0, g, CAST(0.0 AS DOUBLE), CAST(0.00005 AS DOUBLE) FROM (SELECT DISTINCT g FROM dg) t
  UNION ALL
  SELECT step + 1, g, w - lr * grad((SELECT sum(power(dg.x * p.w - dg.y, 2))
                                     FROM dg JOIN train p ON p.g = dg.g), w), lr
  FROM train WHERE step < {t}),
loss AS (SELECT sum(power(w - 2, 2)) AS loss FROM train WHERE step = {t})
{select};"""

RELATIONAL_SELECTS = {
    "loop": "SELECT loss FROM loss",
    "forward": "SELECT sum(power(w - 2, 2)), grad(sum(power(w - 2, 2)), lr) FROM train WHERE step = {t} GROUP BY lr",
    "reverse": "SELECT sum(v), count(*) FROM (SELECT grad((SELECT loss FROM loss), dg.y) AS v FROM dg) r",
}

RELATIONAL_TABLE = """CREATE OR REPLACE TABLE dg AS SELECT CAST(value AS INT) AS i,
  CAST(value % 100 + 1 AS INT) AS g, (value % 17) / 17.0 AS x,
  (value % 13) / 13.0 + (value % 7) / 7.0 AS y FROM generate_series(1, {n});"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dfgrad", default=default_dfgrad())
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--steps", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--rows", type=int, nargs="+", default=[100_000])
    ap.add_argument("--meta-steps", type=int, nargs="+", default=[20])
    ap.add_argument("--mlp-steps", type=int, nargs="*", default=[])
    ap.add_argument("--memory", action="store_true")
    args = ap.parse_args()
    if args.memory:
        return memory(args)

    cases = []  # (case, variant, sql); the last statement of sql is timed
    for t in args.steps:
        for variant, select in LOGISTIC_SELECTS.items():
            cases.append((f"logistic T={t}", variant, LOGISTIC.format(t=t, select=select)))
        sql = LOGISTIC.format(t=t, select=LOGISTIC_SELECTS["2 vars"])
        cases.append((f"logistic T={t}", "reverse", REVERSE.format(sql=sql)))
    for t in args.steps:
        for variant, select in RESIDUAL_SELECTS.items():
            cases.append((f"residual T={t}", variant, RESIDUAL.format(n=64, t=t, select=select)))
    setup = []
    for n in args.rows:
        setup.append(
            f"CREATE OR REPLACE TABLE d AS SELECT x, 1.7 * x - 0.4 + 0.1 * sin(i * 7.1) AS y "
            f"FROM (SELECT value AS i, CAST(value % 1000 AS DOUBLE) / 500.0 - 1.0 AS x "
            f"FROM generate_series(1, {n}));"
        )
        for variant, select in HYPER_SELECTS.items():
            cases.append((f"hypergradient N={n}", variant, HYPER.format(select=select)))
        setup.append(META_TABLE.format(name="tr", first=1, last=n))
        setup.append(META_TABLE.format(name="va", first=n + 1, last=n + 1000))
        for t in args.meta_steps:
            case = f"meta N={n} T={t}"
            gradient = f"{META_LOSS}, grad({META_LOSS}, w0)"
            cases.append((case, "loop", META.format(t=t, select=META_LOSS)))
            cases.append((case, "forward", FORWARD.format(sql=META.format(t=t, select=gradient))))
            cases.append((case, "reverse", REVERSE.format(sql=META.format(t=t, select=gradient))))
        setup.append(
            f"CREATE OR REPLACE TABLE trw AS SELECT row_number() OVER () AS i, x, y, "
            f"1.0 + 0.5 * sin(row_number() OVER () * 0.3) AS wt FROM tr;"
        )
        for t in args.meta_steps:
            for variant, select in VALUATION_SELECTS.items():
                sql = VALUATION.format(t=t, select=select)
                cases.append((f"valuation N={n} T={t}", variant, sql))
        setup.append(RELATIONAL_TABLE.format(n=n))
        for t in args.meta_steps:
            for variant, select in RELATIONAL_SELECTS.items():
                sql = RELATIONAL.format(t=t, select=select.format(t=t))
                cases.append((f"relational N={n} T={t}", variant, sql))
    if args.mlp_steps:
        setup.append(MLP_TABLE)
    for t in args.mlp_steps:
        for variant, select in MLP_SELECTS.items():
            sql = MLP.format(t=t, loss=MLP_LOSS, select=select)
            cases.append((f"mlp T={t}", variant, REVERSE.format(sql=sql) if variant == "reverse" else sql))
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
    statements = lambda sql: sql.count(";")
    elapsed = elapsed[sum(statements(s) for s in setup) + statements(cases[0][2]) :]  # the setup and one warm-up run
    if len(elapsed) != sum(statements(sql) for _, _, sql in order):
        sys.exit(f"unexpected number of timings ({len(elapsed)}):\n{p.stdout[-2000:]}")
    times = {}
    at = 0
    for case, variant, sql in order:
        n = statements(sql)
        # The timed statement: the query (the one before a trailing SET).
        timed = n - 1 if sql.rstrip().endswith("'auto';") else n
        times.setdefault((case, variant), []).append(elapsed[at + timed - 1])
        at += n
    print(f"dfgrad: {args.dfgrad}; median of {args.repeat} runs, seconds")
    print(f"{'case':<24} {'variant':<8} {'time s':>9} {'vs loop':>8}")
    for case in dict.fromkeys(c for c, _, _ in cases):
        base = statistics.median(times[(case, "loop")])
        for variant in dict.fromkeys(v for c, v, _ in cases if c == case):
            t = statistics.median(times[(case, variant)])
            print(f"{case:<24} {variant:<8} {t:9.4f} {t / base:7.2f}x")


def memory(args):
    """Peak resident memory of the residual loop alone and of its gradient,
    per T, partitions and checkpointing, each in a dfgrad process of its
    own. The peak should grow with the state and about sqrt(T) kept
    states, not with T (issue 45: the loop's output dealt round-robin over
    two partitions held every row)."""
    print(f"dfgrad: {args.dfgrad}; 10,000-element state (78 KiB), one process per run")
    print(f"{'T':>6} {'partitions':>10} {'kept':<14} {'time s':>8} {'peak RSS MiB':>13}")
    select = "tensor_total(grad(tensor_total(tensor_mul(v, v)), v0))"
    for t in args.steps:
        for partitions in [1, 2]:
            variants = [("loop alone", None, RESIDUAL_SELECTS["loop"])] + [
                (label, every, select) for label, every in [("every state", 1), ("~sqrt(T)", 0)]
            ]
            for label, every, sel in variants:
                script = f"SET datafusion.execution.target_partitions = {partitions};\n"
                if every is not None:
                    script += f"SET datafusion_grad.checkpoint_every = {every};\n"
                script += RESIDUAL.format(n=10000, t=t, select=sel)
                elapsed, mib = measured(args.dfgrad, script)
                print(f"{t:>6} {partitions:>10} {label:<14} {elapsed:8.3f} {mib:13.1f}",
                      flush=True)
    # Case 1 (a loop whose steps aggregate over data): the backward
    # recursion reads the loop's rows from checkpoints.
    n = args.rows[0]
    setup = META_TABLE.format(name="tr", first=1, last=n) + "\n"
    setup += META_TABLE.format(name="va", first=n + 1, last=n + 1000) + "\n"
    print(f"meta (case 1), N = {n}, one process per run")
    print(f"{'T':>6} {'kept':<14} {'time s':>8} {'peak RSS MiB':>13}")
    gradient = f"{META_LOSS}, grad({META_LOSS}, w0)"
    for t in args.meta_steps:
        variants = [("loop alone", None, META.format(t=t, select=META_LOSS))] + [
            (label, every, REVERSE.format(sql=META.format(t=t, select=gradient)))
            for label, every in [("every state", 1), ("~sqrt(T)", 0)]
        ]
        for label, every, sql in variants:
            script = setup
            if every is not None:
                script += f"SET datafusion_grad.checkpoint_every = {every};\n"
            # the query's time: the statement before the trailing SET
            script += sql.replace("\nSET datafusion_grad.recursion_mode = 'auto';", "")
            elapsed, mib = measured(args.dfgrad, script)
            print(f"{t:>6} {label:<14} {elapsed:8.3f} {mib:13.1f}", flush=True)


def measured(dfgrad, script):
    """The last statement's time (s) and the peak resident memory (MiB) of
    a dfgrad process of its own running `script`."""
    p = subprocess.run(
        ["python3", "-c", MEASURE, dfgrad], input=script, capture_output=True, text=True
    )
    if p.returncode != 0:
        sys.exit(p.stderr)
    rss_kib, elapsed = p.stdout.split()
    return float(elapsed), int(rss_kib) / 1024


# Runs dfgrad on stdin's script and prints its peak RSS (KiB) and the
# query's Elapsed time.
MEASURE = """
import re, resource, subprocess, sys
p = subprocess.run([sys.argv[1], "-f", "/dev/stdin"], input=sys.stdin.read(), capture_output=True, text=True)
if p.returncode != 0:
    sys.exit(p.stderr)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, re.findall(r"Elapsed ([0-9.]+)", p.stdout + p.stderr)[-1])
"""


if __name__ == "__main__":
    main()

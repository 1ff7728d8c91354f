#!/usr/bin/env python3
"""One training step of a relu MLP written relationally, against the same
model on tensor columns (issue 23), in one dfgrad process.

The model: logits = relu(x W1 + b1) W2 + b2, softmax cross-entropy (with the
max shift) averaged over a batch of N samples of D features, H hidden units,
C classes. Two forms of the same numbers:

  * relational: x(n, i, v) and y(n, c) tables, the parameters as rows
    w(layer, i, j, val) (input i = 0 is the bias), the loss CTEs of joins
    and GROUP BY sums; the step is
    ``CREATE OR REPLACE TABLE w AS WITH … SELECT …, val - lr * grad((SELECT
    loss FROM mlp_loss), val) AS val FROM w`` (relational reverse mode);
  * tensors: one row holding x (N x D), y, W1, b1, W2, b2 as tensor columns;
    the step is ``grad(cross_entropy(…), w1, b1, w2, b2)`` and tensor_sub.

Each step is timed by dfgrad's ``Elapsed`` line (planning included), run
``--repeat`` times from the same start (the parameters are reset between
runs); the script checks that the loss after one step agrees between the
two forms to 1e-9 relative (exit status 1 otherwise) and prints the
medians, the relational forward loss query and the ratios.

With ``--loop T``, the training loop in one query instead (planned once
for all its steps): ``CREATE OR REPLACE TABLE w AS WITH RECURSIVE
train(step, layer, i, j, val)`` whose recursive term is ``val - lr *
grad((loss over the previous step's rows), val)``, keeping the last step's
rows, against the same loop over the tensor columns; the losses after
them (untimed) are checked to agree to 1e-9. Both run for 1 and for T
steps, and a step's cost is the difference over T - 1 (the planning
cancels out).

Usage:

    python3 benches/compare_relational_mlp.py                 # N=500 D=784 H=20 C=10
    python3 benches/compare_relational_mlp.py --rows 2000 --repeat 3
    python3 benches/compare_relational_mlp.py --loop 20       # steps in one query
    python3 benches/compare_relational_mlp.py --loop 20 --partitions 1   # in one partition
    DFGRAD=target/release/dfgrad python3 benches/compare_relational_mlp.py
"""

import argparse
import os
import re
import statistics
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=500)
    ap.add_argument("--features", type=int, default=784)
    ap.add_argument("--hidden", type=int, default=20)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--loop", type=int, help="time T steps in one recursive query instead")
    ap.add_argument("--partitions", type=int, help="SET datafusion.execution.target_partitions first")
    args = ap.parse_args()
    dfgrad = os.environ.get("DFGRAD", "target/release/dfgrad")
    n, d, h, c, lr = args.rows, args.features, args.hidden, args.classes, args.lr
    setup = "" if not args.partitions else f"SET datafusion.execution.target_partitions = {args.partitions};"
    setup += f"""
CREATE TABLE x AS SELECT n, i, sin(n * 0.37 + i * 0.11) AS v
  FROM (SELECT value AS n FROM generate_series(0, {n - 1}))
  CROSS JOIN (SELECT value AS i FROM generate_series(1, {d}));
CREATE TABLE y AS SELECT value AS n, value % {c} AS c FROM generate_series(0, {n - 1});
CREATE TABLE w0 AS
  SELECT 1 AS layer, i, j, 0.1 * cos(1.7 + i * 0.3 + j * 1.1) AS val
  FROM (SELECT value AS i FROM generate_series(0, {d}))
  CROSS JOIN (SELECT value AS j FROM generate_series(0, {h - 1}))
  UNION ALL
  SELECT 2 AS layer, i, j, 0.1 * cos(3.4 + i * 0.3 + j * 1.1) AS val
  FROM (SELECT value AS i FROM generate_series(0, {h}))
  CROSS JOIN (SELECT value AS j FROM generate_series(0, {c - 1}));
CREATE TABLE w AS SELECT * FROM w0;
"""
    # The loss as CTEs (a view would keep reading the table it was created
    # over after CREATE OR REPLACE TABLE replaces it).
    loss = """WITH ones AS (SELECT n, 0 AS i, 1.0 AS v FROM y),
a0 AS (SELECT n, i, v FROM x UNION ALL SELECT * FROM ones),
h1 AS (SELECT a0.n, w.j, sum(a0.v * w.val) AS s FROM a0
       JOIN w ON w.layer = 1 AND w.i = a0.i GROUP BY a0.n, w.j),
a1 AS (SELECT n, j + 1 AS i, CASE WHEN s > 0 THEN s ELSE 0.0 END AS v FROM h1
       UNION ALL SELECT * FROM ones),
z AS (SELECT a1.n, w.j AS c, sum(a1.v * w.val) AS z FROM a1
      JOIN w ON w.layer = 2 AND w.i = a1.i GROUP BY a1.n, w.j),
m AS (SELECT n, max(z) AS m FROM z GROUP BY n),
lse AS (SELECT z.n, m.m + ln(sum(exp(z.z - m.m))) AS lse
        FROM z JOIN m ON z.n = m.n GROUP BY z.n, m.m),
mlp_loss AS (SELECT avg(lse.lse - z.z) AS loss FROM lse
  JOIN z ON z.n = lse.n JOIN y ON y.n = z.n AND y.c = z.c)
"""
    setup += f"""
CREATE TABLE td AS SELECT
  (SELECT tensor(array_agg(v ORDER BY n, i), {n}, {d}) FROM x) AS x,
  (SELECT tensor(array_agg(CAST(c AS DOUBLE) ORDER BY n), {n}) FROM y) AS y;
CREATE TABLE tp0 AS SELECT
  (SELECT tensor(array_agg(val ORDER BY i, j), {d}, {h}) FROM w0 WHERE layer = 1 AND i > 0) AS w1,
  (SELECT tensor(array_agg(val ORDER BY j), {h}) FROM w0 WHERE layer = 1 AND i = 0) AS b1,
  (SELECT tensor(array_agg(val ORDER BY i, j), {h}, {c}) FROM w0 WHERE layer = 2 AND i > 0) AS w2,
  (SELECT tensor(array_agg(val ORDER BY j), {c}) FROM w0 WHERE layer = 2 AND i = 0) AS b2;
CREATE TABLE tp AS SELECT * FROM tp0;
"""
    logits = "tensor_add(matmul(relu(tensor_add(matmul(x, w1), b1)), w2), b2)"
    if args.loop:
        return loop(args, dfgrad, setup, loss, logits)
    queries = {
        "relational forward": f"{loss} SELECT loss AS r FROM mlp_loss;",
        "relational step": f"CREATE OR REPLACE TABLE w AS {loss} SELECT layer, i, j, "
        f"val - {lr} * grad((SELECT loss FROM mlp_loss), val) AS val FROM w;",
        "tensor step": "CREATE OR REPLACE TABLE tp AS SELECT "
        f"tensor_sub(w1, scale(g['w1'], {lr})) AS w1, tensor_sub(b1, scale(g['b1'], {lr})) AS b1, "
        f"tensor_sub(w2, scale(g['w2'], {lr})) AS w2, tensor_sub(b2, scale(g['b2'], {lr})) AS b2 "
        f"FROM (SELECT w1, b1, w2, b2, grad(cross_entropy({logits}, y), w1, b1, w2, b2) AS g "
        "FROM tp CROSS JOIN td);",
    }
    losses = (
        f"{loss} SELECT loss AS r FROM mlp_loss;\n"
        f"SELECT cross_entropy({logits}, y) AS r FROM tp CROSS JOIN td;\n"
    )
    reset = "CREATE OR REPLACE TABLE w AS SELECT * FROM w0;\nCREATE OR REPLACE TABLE tp AS SELECT * FROM tp0;\n"
    script = setup
    order = []
    for k in range(args.repeat):
        names = list(queries) if k % 2 == 0 else list(queries)[::-1]
        script += reset
        for name in names:
            script += queries[name] + "\n"
            order.append(name)
        script += losses
    elapsed, values = run(dfgrad, script)
    # Elapsed lines: the setup's statements, then per repeat 2 resets,
    # 3 timed statements and 2 loss queries.
    elapsed = elapsed[setup.count(";"):]
    times = {name: [] for name in queries}
    per_repeat = 2 + len(queries) + 2
    for k in range(args.repeat):
        block = elapsed[k * per_repeat : (k + 1) * per_repeat]
        names = list(queries) if k % 2 == 0 else list(queries)[::-1]
        for name, t in zip(names, block[2 : 2 + len(queries)]):
            times[name].append(t)
    # The loss values: per repeat the forward (before the step, or after it
    # when the order is reversed), then the two losses after the step.
    after = [(values[k * 3 + 1], values[k * 3 + 2]) for k in range(args.repeat)]
    worst = max(abs(a - b) / max(abs(a), abs(b), 1e-300) for a, b in after)
    print(f"N={n} D={d} H={h} C={c}, {args.repeat} runs each, dfgrad {dfgrad}")
    print("| query | median s | / tensor step |")
    print("|---|---|---|")
    base = statistics.median(times["tensor step"])
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"| {name} | {m:.3f} | {m / base:.1f} |")
    print(f"loss after one step: relational {after[0][0]:.12g}, tensor {after[0][1]:.12g} "
          f"(largest relative difference {worst:.2e})")
    if worst > 1e-9:
        sys.exit("the two forms disagree")


def run(dfgrad, script):
    """Runs `script` in one dfgrad process: the `Elapsed` seconds of each
    statement and the one-column values it printed, in order (exits on an
    error)."""
    out = subprocess.run(
        [dfgrad, "--maxrows", "inf", "-c", script], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        sys.exit(f"dfgrad failed: {out.stderr}")
    elapsed = [float(t) for t in re.findall(r"Elapsed ([0-9.]+) seconds", out.stdout + out.stderr)]
    values = [float(v) for v in re.findall(r"^\| ([-0-9.e+]+)\s*\|$", out.stdout, re.M)]
    return elapsed, values


def loop(args, dfgrad, setup, loss, logits):
    """`--loop T`: the training loop in one query, relational and tensor."""
    lr, steps = args.lr, args.loop
    if steps < 2:
        sys.exit("--loop needs at least 2 steps")
    # The loss CTEs over the recursive one (their leading WITH dropped).
    ctes = loss.strip()[len("WITH "):]

    def relational(t):
        return f"""CREATE OR REPLACE TABLE w AS WITH RECURSIVE train(step, layer, i, j, val) AS (
  SELECT 0, layer, i, j, val FROM w0
  UNION ALL
  SELECT step + 1, layer, i, j, val - {lr} * grad((
    WITH w AS (SELECT layer, i, j, val FROM train), {ctes}
    SELECT loss FROM mlp_loss), val)
  FROM train WHERE step < {t})
SELECT layer, i, j, val FROM train WHERE step = {t};
{loss} SELECT loss AS r FROM mlp_loss;"""

    def tensor(t):
        g = f"grad(cross_entropy({logits}, y), w1, b1, w2, b2)"
        return f"""CREATE OR REPLACE TABLE tp AS WITH RECURSIVE tr(step, w1, b1, w2, b2) AS (
  SELECT 0, w1, b1, w2, b2 FROM tp0
  UNION ALL
  SELECT step + 1, tensor_sub(w1, scale(g['w1'], {lr})), tensor_sub(b1, scale(g['b1'], {lr})),
    tensor_sub(w2, scale(g['w2'], {lr})), tensor_sub(b2, scale(g['b2'], {lr}))
  FROM (SELECT step, w1, b1, w2, b2, {g} AS g FROM tr CROSS JOIN td WHERE step < {t}))
SELECT w1, b1, w2, b2 FROM tr WHERE step = {t};
SELECT cross_entropy({logits}, y) AS r FROM tp CROSS JOIN td;"""

    queries = {
        "relational 1": relational(1),
        f"relational {steps}": relational(steps),
        "tensor 1": tensor(1),
        f"tensor {steps}": tensor(steps),
    }
    script, order = setup, []
    for k in range(args.repeat):
        names = list(queries) if k % 2 == 0 else list(queries)[::-1]
        script += "\n".join(queries[name] for name in names) + "\n"
        order += names
    elapsed, values = run(dfgrad, script)
    # the setup's statements, then per query the loop and the loss after
    elapsed = elapsed[setup.count(";")::2]
    times = {name: [] for name in queries}
    losses = {name: [] for name in queries}
    for name, t, v in zip(order, elapsed, values):
        times[name].append(t)
        losses[name].append(v)
    worst = 0.0
    for t in ("1", str(steps)):
        for a in losses[f"relational {t}"]:
            for b in losses[f"tensor {t}"]:
                worst = max(worst, abs(a - b) / max(abs(a), abs(b), 1e-300))
    med = {name: statistics.median(ts) for name, ts in times.items()}
    per_step = {
        form: (med[f"{form} {steps}"] - med[f"{form} 1"]) / (steps - 1) for form in ("relational", "tensor")
    }
    n, d, h, c = args.rows, args.features, args.hidden, args.classes
    print(f"N={n} D={d} H={h} C={c}, loops of 1 and {steps} steps, {args.repeat} runs each, dfgrad {dfgrad}")
    print("| query | median s |")
    print("|---|---|")
    for name, m in med.items():
        print(f"| {name} step(s) | {m:.3f} |")
    print(f"per step: relational {per_step['relational']:.4f} s, tensor {per_step['tensor']:.4f} s, "
          f"ratio {per_step['relational'] / per_step['tensor']:.1f}")
    print(f"loss after {steps} steps: relational {losses[f'relational {steps}'][0]:.12g}, "
          f"tensor {losses[f'tensor {steps}'][0]:.12g} (largest relative difference {worst:.2e})")
    if worst > 1e-9:
        sys.exit("the two forms disagree")


if __name__ == "__main__":
    main()

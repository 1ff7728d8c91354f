#!/usr/bin/env python3
"""The 784-20-10 MLP of examples/mlp.sql, side by side with NumPy (issue 6).

One gradient-descent step on a batch of 2,000 samples of 784 features: the
forward pass `relu(x @ w1 + b1) @ w2 + b2`, softmax cross-entropy, and the
gradients with respect to w1 (784x20), b1 (20), w2 (20x10) and b2 (10), then
the update. Timed in

  * ours:  dfgrad, the recursive query of examples/mlp.sql restricted to one
           batch: `grad(cross_entropy(logits, y), w1, b1, w2, b2)`; the data table is created first (not timed) and the
           time of the training statement is the `Elapsed` line dfgrad prints.
           The per-step time is `(t(steps + 3) - t(3)) / steps`, which removes
           planning and the fixed cost of the query; the table also gives the
           time of exactly 3 steps (planning included), the configuration of
           the published Umbra figure;
  * NumPy: the same step written by hand in float64 (backprop through the
           two matrix products, relu and softmax), data in memory.

and against the published Umbra figure for the same network (784-20-10,
batch 2000, 3 iterations: 2.58 s; Schüle et al., "Recursive SQL and GPU-support
for in-database machine learning", DAPD 2022).

Both start from the same parameters (random_tensor values read back from
dfgrad) on the same data, so the script also checks that the losses after the
timed steps agree to 1e-9 (exit status 1 otherwise).

Usage:
    python3 benches/compare_mlp.py [--dfgrad PATH] [--steps 50] [--repeat 3] [--device cpu|gpu|auto]
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402

UMBRA_3_ITERATIONS_S = 2.58

DATA = """
CREATE TABLE mnist_like AS
WITH prototypes AS (
  SELECT tensor(array_agg(sin(0.05 * j * (k + 1)) ORDER BY k, j), 10, 784) AS p
  FROM (SELECT value AS k FROM generate_series(0, 9)),
       (SELECT value AS j FROM generate_series(0, 783))
),
labels AS (
  SELECT tensor(array_agg(CAST(i % 10 AS DOUBLE) ORDER BY i), 2000) AS y
  FROM (SELECT value AS i FROM generate_series(0, 1999))
)
SELECT tensor_add(matmul(one_hot(y, 10), p), scale(random_tensor(0, 2000, 784), 4.0)) AS x, y
FROM labels CROSS JOIN prototypes;
"""

TRAIN = """
WITH RECURSIVE train(step, w1, b1, w2, b2) AS (
  SELECT 0, scale(random_tensor(1, 784, 20), 0.1), zeros_like(random_tensor(3, 20)),
            scale(random_tensor(2, 20, 10), 0.5), zeros_like(random_tensor(4, 10))
  UNION ALL
  SELECT step + 1,
         tensor_sub(w1, scale(tensor_avg(g['w1']), 0.5)),
         tensor_sub(b1, scale(tensor_avg(g['b1']), 0.5)),
         tensor_sub(w2, scale(tensor_avg(g['w2']), 0.5)),
         tensor_sub(b2, scale(tensor_avg(g['b2']), 0.5))
  FROM (SELECT step, w1, b1, w2, b2,
               grad(cross_entropy(tensor_add(matmul(relu(tensor_add(matmul(x, w1), b1)), w2), b2), y),
                    w1, b1, w2, b2) AS g
        FROM train CROSS JOIN mnist_like
        WHERE step < {steps})
  GROUP BY step, w1, b1, w2, b2
)
SELECT step, cross_entropy(tensor_add(matmul(relu(tensor_add(matmul(x, w1), b1)), w2), b2), y) AS loss
FROM train CROSS JOIN mnist_like WHERE step = {steps};
"""

EXPORT = "SELECT x, y, scale(random_tensor(1, 784, 20), 0.1) AS w1, scale(random_tensor(2, 20, 10), 0.5) AS w2 FROM mnist_like;"


def dfgrad_path(given):
    if given:
        return given
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(root, "target"))
    for profile in ("release", "debug"):
        p = os.path.join(target, profile, "dfgrad")
        if os.path.exists(p):
            return p
    sys.exit("no dfgrad binary: cargo build --release, or pass --dfgrad")


def run_ours(dfgrad, steps_list, repeat, device):
    """Elapsed seconds of the training statement for each step count, and losses."""
    args = [dfgrad, "-c", f"SET datafusion_grad.tensor_device = '{device}'", "-c", DATA]
    for _ in range(repeat):
        for steps in steps_list:
            args += ["-c", TRAIN.format(steps=steps)]
    done = subprocess.run(args, capture_output=True, text=True, check=True)
    out = done.stdout + "\n" + done.stderr  # timings are printed on stderr
    elapsed = [float(m) for m in re.findall(r"Elapsed ([0-9.]+) seconds", out)][2:]
    losses = [float(m) for m in re.findall(r"^\|\s*\d+\s*\|\s*([-0-9.eE]+)\s*\|$", out, re.M)]
    times = {s: [] for s in steps_list}
    for i, t in enumerate(elapsed):
        times[steps_list[i % len(steps_list)]].append(t)
    return {s: statistics.median(v) for s, v in times.items()}, losses[: len(steps_list)]


def export_data(dfgrad):
    out = subprocess.run([dfgrad, "--format", "ndjson", "-q", "-c", DATA, "-c", EXPORT],
                         capture_output=True, text=True, check=True).stdout
    row = json.loads(out.strip().splitlines()[-1])
    return (np.array(row["x"]), np.array(row["y"]).astype(int),
            np.array(row["w1"]), np.array(row["w2"]))


def numpy_step(x, y, w1, b1, w2, b2, lr=0.5):
    a = x @ w1 + b1
    h = np.maximum(a, 0.0)
    z = h @ w2 + b2
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    gz = p / len(y)
    g2 = h.T @ gz
    ga = (gz @ w2.T) * (a > 0)
    g1 = x.T @ ga
    return w1 - lr * g1, b1 - lr * ga.sum(axis=0), w2 - lr * g2, b2 - lr * gz.sum(axis=0)


def numpy_loss(x, y, w1, b1, w2, b2):
    z = np.maximum(x @ w1 + b1, 0.0) @ w2 + b2
    m = z.max(axis=1, keepdims=True)
    lse = (m + np.log(np.exp(z - m).sum(axis=1, keepdims=True)))[:, 0]
    return float(np.mean(lse - z[np.arange(len(y)), y]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dfgrad")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", default="cpu", choices=["cpu", "gpu", "auto"],
                    help="datafusion_grad.tensor_device for ours (gpu needs a build with --features cuda)")
    args = ap.parse_args()
    dfgrad = dfgrad_path(args.dfgrad)

    x, y, w1, w2 = export_data(dfgrad)
    params = (w1, np.zeros(20), w2, np.zeros(10))
    short, long = 3, 3 + args.steps
    times, losses = run_ours(dfgrad, [short, long], args.repeat, args.device)
    ours_step = (times[long] - times[short]) / args.steps

    np_times = []
    for _ in range(args.repeat):
        p = tuple(q.copy() for q in params)
        t = time.perf_counter()
        for _ in range(long):
            p = numpy_step(x, y, *p)
        np_times.append((time.perf_counter() - t) / long)
    np_step = statistics.median(np_times)
    p = params
    for _ in range(short):
        p = numpy_step(x, y, *p)
    np_loss_short = numpy_loss(x, y, *p)
    for _ in range(long - short):
        p = numpy_step(x, y, *p)
    np_loss_long = numpy_loss(x, y, *p)

    print(f"dfgrad: {dfgrad}, tensor_device = '{args.device}'")
    print("| | ours | NumPy (1 thread) | ours / NumPy |")
    print("|---|---:|---:|---:|")
    print(f"| one step, batch 2000 (ms) | {ours_step * 1e3:.2f} | {np_step * 1e3:.2f} | {ours_step / np_step:.2f}x |")
    print(f"| 3 steps, whole query incl. planning (s) | {times[short]:.3f} | {3 * np_step:.3f} | |")
    print(f"| Umbra, 3 iterations (published) | {UMBRA_3_ITERATIONS_S} s: ours is {UMBRA_3_ITERATIONS_S / times[short]:.0f}x faster | | |")
    worst = max(abs(losses[0] - np_loss_short), abs(losses[1] - np_loss_long))
    print(f"loss after {short} / {long} steps: ours {losses[0]:.12f} / {losses[1]:.12f}, "
          f"NumPy {np_loss_short:.12f} / {np_loss_long:.12f} (max diff {worst:.2e})")
    if worst > 1e-9:
        sys.exit("ours and NumPy disagree")


if __name__ == "__main__":
    main()

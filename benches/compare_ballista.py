#!/usr/bin/env python3
"""One gradient step over a partitioned Parquet data set: local DataFusion
vs a Ballista cluster of two executors on this machine (issue 7's benchmark).

The step is one distributed query,

    SELECT w - 0.5 * grad(avg(power(w*x + b - y, 2)), w),
           b - 0.5 * grad(avg(power(w*x + b - y, 2)), b)
    FROM points CROSS JOIN (SELECT 0.5 AS w, 0.1 AS b) GROUP BY w, b

(the gradient taken through the aggregate), over `--rows` rows (10M by
default) in `--files` Parquet files (8). It is timed

  * local:    `dfgrad --table points=DIR/ -c STEP`, DataFusion on all cores;
  * ballista: `dfgrad --ballista df://127.0.0.1:PORT --table points=DIR/ -c
              STEP` against `dfgrad-scheduler` and two `dfgrad-executor`
              processes (each `--concurrent-tasks` = cores / 2), all started
              by this script on loopback.

With `--steps N` (N > 1) the query is a training loop of N such steps in
one recursive query (`WITH RECURSIVE fit(step, w, b) ... WHERE step < N`),
which the Ballista client drives one distributed query per step, and a
third engine is timed: `ballista, data read every step` (the same with
`SET datafusion_grad.cache_loop_invariants = false`, so the executors do not
keep the decoded data across the steps).

Both read the same files from disk (page cache warm after the warm-up run);
the time is the `Elapsed` line dfgrad prints (planning, the rewrite on the
client, execution, results collected), median of `--repeat` runs after one
warm-up. Both results must agree to 1e-9 (relative); the script fails
otherwise.

Needs the binaries of the `ballista` feature:

    cargo build --features ballista --bins       # target/debug, optimized deps
    python3 benches/compare_ballista.py --bin-dir "$CARGO_TARGET_DIR/debug"
"""

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time

STEP = (
    "SELECT w - 0.5 * grad(avg(power(w * x + b - y, 2)), w) AS w, "
    "b - 0.5 * grad(avg(power(w * x + b - y, 2)), b) AS b "
    "FROM points CROSS JOIN (SELECT CAST(0.5 AS DOUBLE) AS w, CAST(0.1 AS DOUBLE) AS b) AS p "
    "GROUP BY w, b"
)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dfgrad(bin_dir, args):
    out = subprocess.run(
        [os.path.join(bin_dir, "dfgrad"), *args],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        sys.exit(f"dfgrad {' '.join(args)} failed:\n{out.stderr}")
    return out.stdout + out.stderr


def write_data(bin_dir, directory, rows, files):
    per = rows // files
    for f in range(files):
        path = os.path.join(directory, f"part-{f}.parquet")
        dfgrad(
            bin_dir,
            [
                "-q",
                "-c",
                f"COPY (SELECT x, 2.5 * x - 0.7 + 0.05 * sin(i * 12.9898) AS y FROM "
                f"(SELECT value AS i, CAST(value % 1000 AS DOUBLE) / 500.0 - 1.0 AS x "
                f"FROM generate_series({f * per + 1}, {(f + 1) * per}))) "
                f"TO '{path}' STORED AS PARQUET",
            ],
        )


def loop(steps):
    """`steps` steps of STEP's update in one recursive query, from the same
    start; its last parameters."""
    loss = "avg(power(w * x + b - y, 2))"
    return (
        "WITH RECURSIVE fit(step, w, b) AS ("
        "SELECT 0 AS step, CAST(0.5 AS DOUBLE) AS w, CAST(0.1 AS DOUBLE) AS b "
        "UNION ALL "
        f"SELECT step + 1, w - 0.5 * grad({loss}, w), b - 0.5 * grad({loss}, b) "
        f"FROM fit CROSS JOIN points WHERE step < {steps} GROUP BY step, w, b) "
        f"SELECT w, b FROM fit WHERE step = {steps}"
    )


def timed_step(bin_dir, extra, directory, query=STEP, setting=None):
    statements = f"SET {setting}; {query}" if setting else query
    out = dfgrad(bin_dir, [*extra, "--table", f"points={directory}/", "-c", statements])
    # the table's one data row (stdout), "1 row(s) fetched. Elapsed S seconds." (stderr)
    elapsed = float(re.findall(r"Elapsed ([0-9.]+) seconds", out)[-1])
    row = [line for line in out.splitlines() if re.match(r"\|\s*-?[0-9]", line)][0]
    values = [float(v) for v in row.strip("|").split("|")]
    return elapsed, values


def start_cluster(bin_dir, work, tasks):
    port = free_port()
    procs = [
        subprocess.Popen(
            [os.path.join(bin_dir, "dfgrad-scheduler"), "--bind-port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    ]
    for e in range(2):
        d = os.path.join(work, f"executor-{e}")
        os.makedirs(d, exist_ok=True)
        procs.append(
            subprocess.Popen(
                [
                    os.path.join(bin_dir, "dfgrad-executor"),
                    "--scheduler-port", str(port),
                    "--bind-port", str(free_port()),
                    "--bind-grpc-port", str(free_port()),
                    "--concurrent-tasks", str(tasks),
                    "--work-dir", d,
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    # wait for both executors to register (the scheduler's REST API)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                s.sendall(b"GET /api/executors HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                body = b""
                while chunk := s.recv(65536):
                    body += chunk
            if body.count(b'"last_seen"') >= 2:
                return procs, f"df://127.0.0.1:{port}"
        except OSError:
            pass
        time.sleep(0.2)
    for p in procs:
        p.kill()
    sys.exit("the executors did not register within 60 s")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "debug"))
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1, help="steps of a training loop in one recursive query (1: one step)")
    args = ap.parse_args()
    query = STEP if args.steps == 1 else loop(args.steps)
    engines = [("local", [], None), ("ballista", ["--ballista", None], None)]
    if args.steps > 1:
        engines.append(
            ("ballista, data read every step", ["--ballista", None], "datafusion_grad.cache_loop_invariants = false")
        )
    cores = os.cpu_count() or 2
    with tempfile.TemporaryDirectory() as work:
        data = os.path.join(work, "points")
        os.makedirs(data)
        t = time.time()
        write_data(args.bin_dir, data, args.rows, args.files)
        print(f"data: {args.rows:,} rows in {args.files} Parquet files ({time.time() - t:.1f} s to write)")
        procs, url = start_cluster(args.bin_dir, work, max(1, cores // 2))
        try:
            results = {}
            for name, extra, setting in engines:
                extra = [url if a is None else a for a in extra]
                timed_step(args.bin_dir, extra, data, query, setting)  # warm-up
                runs = [timed_step(args.bin_dir, extra, data, query, setting) for _ in range(args.repeat)]
                results[name] = (statistics.median(r[0] for r in runs), runs[-1][1])
        finally:
            for p in procs:
                p.kill()
    lt, lv = results["local"]
    print(f"cores: {cores}; executors: 2 x {max(1, cores // 2)} tasks; steps: {args.steps}")
    print(f"| engine | query (s, median of {args.repeat}) | rows/s per step |")
    print("|---|---|---|")
    for name, (secs, _) in results.items():
        print(f"| {name} | {secs:.3f} | {args.rows * args.steps / secs / 1e6:.1f}M |")
    worst = 0.0
    for name, (secs, values) in results.items():
        if name == "local":
            continue
        print(f"{name} / local: {secs / lt:.2f}x")
        diff = max(abs(a - b) / max(abs(a), abs(b), 1.0) for a, b in zip(lv, values))
        print(f"parameters at the end: local {lv}, {name} {values} (largest relative difference {diff:.1e})")
        worst = max(worst, diff)
    if worst > 1e-9:
        sys.exit("the results differ")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Linear regression by gradient descent, side by side (issue 3's benchmark).

The same training run -- `--iters` (20) full-batch gradient-descent steps on the
mean squared error of a linear model, starting from all-zero parameters -- is
timed in

  * ours, `grad`:  dfgrad, one recursive CTE whose update is
                   `w - lr * grad(avg(power(w*x + b - y, 2)), w)`
                   (the gradient taken through the aggregate);
  * ours, `hand`:  dfgrad, the same recursive CTE with the derivative written
                   by hand: `w - lr * avg(2 * (w*x + b - y) * x)`;
  * DuckDB:        the hand-written recursive CTE (Python package `duckdb`);
  * NumPy:         the same steps as vector operations (`r = X @ w + b - y`,
                   `g = 2 * X.T @ r / n`);

for every size in `--rows` and every model size in `--params` (2 = one feature
`x1` and the intercept `b`; 10 = nine features and `b`), and compared with the
memory-bandwidth bound: `iters * bytes scanned per iteration / copy bandwidth`,
where one iteration must read every input column once (`rows * params * 8`
bytes: the features and `y`) and the copy bandwidth is measured here with a
large `numpy.copyto` (STREAM convention: bytes read + bytes written per second,
best of one and of as many threads as there are cores).

Data: generated with NumPy from a fixed seed (features uniform in [-1, 1],
`y = X w* + b* + 0.1 * N(0, 1)`), written once per size to a Parquet file in a
temporary directory (CSV when pyarrow is missing). Row groups of 128Ki rows:
DataFusion splits a Parquet scan at row-group boundaries, and a file written
as one row group (pyarrow's default up to 1Mi rows) ends up in ONE partition
of the in-memory table (`partition_sizes=[123, 0]`), i.e. on one core. The
10M-row, 10-parameter case holds 800 MB of data per engine (one at a time).

Fairness:
  * Every engine works from memory: ours runs `CREATE TABLE pts AS SELECT *
    FROM points` (the Parquet file registered with `--table`) once, then all
    timed queries in the same dfgrad process; the time of each statement is the
    `Elapsed` line dfgrad prints for it (planning + execution, results
    collected; the load is not included). DuckDB loads the file with `CREATE
    TABLE ... AS SELECT * FROM read_parquet(...)` and the time is the
    wall-clock time of `execute(...).fetchall()` (planning included too).
    NumPy gets the columns as contiguous float64 arrays.
  * `--warmup` runs (discarded) precede `--repeat` timed runs; ours' two
    variants alternate within one process (ABBA order), so slow phases of a
    shared machine hit both. The tables report the median.
  * The SQL engines use the machine's cores: DataFusion's default
    `target_partitions` (= cores), DuckDB's default `threads`. NumPy runs on
    one core (its elementwise operations are single-threaded; its BLAS is set
    to one thread unless OPENBLAS_NUM_THREADS / OMP_NUM_THREADS say otherwise:
    on 2 shared cores, threaded OpenBLAS was 1.6-30x slower at 100k-1M rows).
  * All engines must end at the same parameters: the script prints the
    largest absolute difference from NumPy's result (last run) over every
    run of every engine, and
    fails (exit status 1) when it exceeds `--tolerance`.

Usage:

    python3 benches/compare_training.py                       # 1M and 10M rows
    python3 benches/compare_training.py --quick               # 100k rows, smoke test
    python3 benches/compare_training.py --rows 1000000 --params 2 --repeat 5
    DFGRAD=target/release/dfgrad python3 benches/compare_training.py
    python3 benches/compare_training.py --dfgrad python   # via `pip install ./python`

The dfgrad binary: `--dfgrad PATH`, else `$DFGRAD`, else
`$CARGO_TARGET_DIR/release/dfgrad` if present, else `/work/target/debug/dfgrad`.
Requires numpy; duckdb and pyarrow are optional (`pip install duckdb pyarrow`).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

# NumPy's BLAS (the matrix-vector products) runs on one thread unless told
# otherwise: its elementwise operations are single-threaded anyway, and on a
# small shared machine OpenBLAS' worker threads lose more time waiting to be
# scheduled than they gain. Must be set before NumPy is imported.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402 (after the thread settings)

try:
    import pyarrow as pa
    import pyarrow.parquet as pq
except ImportError:  # CSV fallback
    pa = None
    pq = None

try:
    import duckdb
except ImportError:
    duckdb = None


SEED = 42
ROW_GROUP = 128 * 1024
ELAPSED = re.compile(r"row\(s\) fetched\. Elapsed ([0-9.]+) seconds\.")


# --------------------------------------------------------------------------- data


def true_params(k: int) -> tuple[np.ndarray, float]:
    """Weights and intercept of the generating model for `k` features."""
    if k == 1:
        return np.array([3.0]), -2.0  # the README example's line
    return np.linspace(-2.0, 2.0, k), 0.5


def feature_names(k: int) -> list[str]:
    return [f"x{j}" for j in range(1, k + 1)]


def weight_names(k: int) -> list[str]:
    return [f"w{j}" for j in range(1, k + 1)]


def generate(rows: int, k: int, directory: Path) -> Path:
    """Writes `rows` points with `k` features once; returns the file."""
    stem = directory / f"points_{rows}_{k}"
    path = stem.with_suffix(".parquet" if pq is not None else ".csv")
    if path.exists():
        return path
    rng = np.random.default_rng(SEED)
    w_true, b_true = true_params(k)
    columns = {}
    y = np.full(rows, b_true)
    for j, name in enumerate(feature_names(k)):
        x = rng.uniform(-1.0, 1.0, rows)
        y += w_true[j] * x
        columns[name] = x
    y += 0.1 * rng.standard_normal(rows)
    columns["y"] = y
    if pq is not None:
        pq.write_table(pa.table(columns), path, row_group_size=ROW_GROUP)
    else:
        data = np.column_stack(list(columns.values()))
        np.savetxt(path, data, delimiter=",", fmt="%.17g",
                   header=",".join(columns), comments="")
    return path


def one_group_copy(path: Path) -> Path | None:
    """The file of `path` rewritten the way a user's pyarrow writes it by
    default (one row group up to 1Mi rows); None without pyarrow."""
    if pq is None:
        return None
    copy = path.with_name(path.stem + "_default.parquet")
    if not copy.exists():
        pq.write_table(pq.read_table(path), copy)
    return copy


def load_numpy(path: Path, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The file's features (`(rows, k)`, C order; 1-D for k = 1) and `y`."""
    names = feature_names(k)
    if pq is not None:
        table = pq.read_table(path)
        cols = [table.column(n).to_numpy() for n in names]
        y = np.ascontiguousarray(table.column("y").to_numpy())
    else:
        data = np.loadtxt(path, delimiter=",", skiprows=1)
        cols = [data[:, j] for j in range(k)]
        y = np.ascontiguousarray(data[:, k])
    x = np.ascontiguousarray(cols[0]) if k == 1 else np.column_stack(cols)
    return x, y


# --------------------------------------------------------------------------- SQL


def training_sql(k: int, iters: int, lr: float, variant: str, table: str = "pts") -> str:
    """The recursive CTE over `table`; `variant` is `grad` or `hand`
    (hand-written derivative)."""
    ws, xs = weight_names(k), feature_names(k)
    params = ws + ["b"]
    residual = " + ".join(f"{w} * {x}" for w, x in zip(ws, xs)) + " + b - y"
    if variant == "grad":
        loss = f"avg(power({residual}, 2))"
        updates = [f"{p} - {lr} * grad({loss}, {p})" for p in params]
    elif variant == "hand":
        updates = [f"{w} - {lr} * avg(2 * ({residual}) * {x})" for w, x in zip(ws, xs)]
        updates.append(f"b - {lr} * avg(2 * ({residual}))")
    else:
        raise ValueError(variant)
    anchor = ", ".join(f"CAST(0.0 AS DOUBLE) AS {p}" for p in params)
    keys = ", ".join(["step"] + params)
    return (
        f"WITH RECURSIVE fit({keys}) AS (\n"
        f"  SELECT 0 AS step, {anchor}\n"
        f"  UNION ALL\n"
        f"  SELECT step + 1,\n    " + ",\n    ".join(updates) + "\n"
        f"  FROM fit CROSS JOIN {table}\n"
        f"  WHERE step < {iters}\n"
        f"  GROUP BY {keys}\n"
        f")\n"
        f"SELECT {', '.join(params)} FROM fit WHERE step = {iters}"
    )


# --------------------------------------------------------------------------- engines


@dataclass
class Result:
    times: list[float] = field(default_factory=list)
    params: np.ndarray | None = None  # the last run's result
    runs: list[np.ndarray] = field(default_factory=list)  # every run's result
    note: str = ""

    def record(self, params: np.ndarray) -> None:
        self.params = params
        self.runs.append(params)

    @property
    def median(self) -> float | None:
        return statistics.median(self.times) if self.times else None


def parse_tables(stdout: str, columns: list[str]) -> list[np.ndarray]:
    """The data row of every ASCII table in `stdout` whose header is `columns`."""
    rows, expect_data = [], False
    for line in stdout.splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if expect_data:
            # An empty cell is SQL NULL: NaN, which then fails the agreement check.
            rows.append(np.array([float(c) if c else np.nan for c in cells]))
            expect_data = False
        elif cells == columns:
            expect_data = True
    return rows


def run_ours(binary: str, path: Path, k: int, args) -> dict[str, Result]:
    """Both variants in one dfgrad process, after one load into memory."""
    params = weight_names(k) + ["b"]
    sql = {v: training_sql(k, args.iters, args.lr, v) for v in ("grad", "hand")}
    order = []
    for i in range(args.warmup + args.repeat):
        order += ["grad", "hand"] if i % 2 == 0 else ["hand", "grad"]
    cmd = [binary, "--table", f"points={path}",
           "-c", "CREATE TABLE pts AS SELECT * FROM points"]
    for v in order:
        cmd += ["-c", sql[v]]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"dfgrad failed ({proc.returncode}): {proc.stderr.strip()}")
    elapsed = [float(m) for m in ELAPSED.findall(proc.stderr)]
    values = parse_tables(proc.stdout, params)
    if len(elapsed) != 1 + len(order) or len(values) != len(order):
        raise RuntimeError(f"unexpected dfgrad output:\n{proc.stdout}\n{proc.stderr}")
    results = {v: Result(note=f"load {elapsed[0]:.2f}s") for v in ("grad", "hand")}
    for i, (v, t, p) in enumerate(zip(order, elapsed[1:], values)):
        res = results[v]
        res.record(p)
        if i >= 2 * args.warmup:
            res.times.append(t)
    return results


# The file-backed loops: where the data lives, and whether the loop-invariant
# data is kept across iterations (datafusion_grad.cache_loop_invariants).
FILE_VARIANTS = [
    ("memory", "pts", True), ("memory, not kept", "pts", False),
    ("file 128Ki groups", "points", True), ("file 128Ki groups, not kept", "points", False),
    ("file 1 group", "points1", True), ("file 1 group, not kept", "points1", False),
]


def run_ours_files(binary: str, path: Path, one_group: Path, k: int,
                   args) -> dict[str, Result]:
    """The `grad` loop over the in-memory table and straight over the files
    (`--table`, no load), with the loop-invariant data kept and not kept,
    all in one dfgrad process, interleaved."""
    params = weight_names(k) + ["b"]
    cmd = [binary, "--table", f"points={path}", "--table", f"points1={one_group}",
           "-c", "CREATE TABLE pts AS SELECT * FROM points"]
    statements = ["load"]
    kept = True
    for i in range(args.warmup + args.repeat):
        variants = FILE_VARIANTS if i % 2 == 0 else FILE_VARIANTS[::-1]
        for name, table, keep in variants:
            if keep != kept:
                cmd += ["-c", f"SET datafusion_grad.cache_loop_invariants = {str(keep).lower()}"]
                statements.append("set")
                kept = keep
            cmd += ["-c", training_sql(k, args.iters, args.lr, "grad", table)]
            statements.append((name, i >= args.warmup))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"dfgrad failed ({proc.returncode}): {proc.stderr.strip()}")
    elapsed = [float(m) for m in ELAPSED.findall(proc.stderr)]
    values = iter(parse_tables(proc.stdout, params))
    if len(elapsed) != len(statements):
        raise RuntimeError(f"unexpected dfgrad output:\n{proc.stdout}\n{proc.stderr}")
    results = {name: Result(note="dfgrad --table, grad form") for name, _, _ in FILE_VARIANTS}
    for statement, t in zip(statements, elapsed):
        if isinstance(statement, tuple):
            name, timed = statement
            results[name].record(next(values))
            if timed:
                results[name].times.append(t)
    return results


def run_ours_python(path: Path, k: int, args) -> dict[str, Result]:
    """As run_ours, through the Python package (`pip install ./python`: a
    release build), timing `ctx.sql(q).to_arrow_table()`."""
    import datafusion_grad as dg

    params = weight_names(k) + ["b"]
    sql = {v: training_sql(k, args.iters, args.lr, v) for v in ("grad", "hand")}
    ctx = dg.SessionContext()
    if path.suffix == ".parquet":
        ctx.register_parquet("points", str(path))
    else:
        ctx.register_csv("points", str(path))
    t0 = time.perf_counter()
    ctx.sql("CREATE TABLE pts AS SELECT * FROM points").collect()
    load = time.perf_counter() - t0
    results = {v: Result(note=f"load {load:.2f}s, python package") for v in ("grad", "hand")}
    for i in range(args.warmup + args.repeat):
        for v in (["grad", "hand"] if i % 2 == 0 else ["hand", "grad"]):
            t0 = time.perf_counter()
            table = ctx.sql(sql[v]).to_arrow_table()
            t = time.perf_counter() - t0
            if table.num_rows != 1:
                raise RuntimeError(f"ours returned {table.num_rows} rows")
            row = table.to_pylist()[0]
            results[v].record(np.array([np.nan if row[c] is None else row[c] for c in params]))
            if i >= args.warmup:
                results[v].times.append(t)
    return results


def run_duckdb(path: Path, k: int, args) -> Result:
    con = duckdb.connect()
    reader = "read_parquet" if path.suffix == ".parquet" else "read_csv_auto"
    t0 = time.perf_counter()
    con.execute(f"CREATE TABLE pts AS SELECT * FROM {reader}('{path}')")
    load = time.perf_counter() - t0
    threads = con.execute("SELECT current_setting('threads')").fetchone()[0]
    res = Result(note=f"load {load:.2f}s, threads={threads}")
    sql = training_sql(k, args.iters, args.lr, "hand")
    for i in range(args.warmup + args.repeat):
        t0 = time.perf_counter()
        rows = con.execute(sql).fetchall()
        t = time.perf_counter() - t0
        if len(rows) != 1:
            raise RuntimeError(f"DuckDB returned {len(rows)} rows")
        res.record(np.array([np.nan if v is None else v for v in rows[0]], dtype=float))
        if i >= args.warmup:
            res.times.append(t)
    con.close()
    return res


def numpy_train(x: np.ndarray, y: np.ndarray, iters: int, lr: float) -> np.ndarray:
    n = y.shape[0]
    if x.ndim == 1:
        w, b = 0.0, 0.0
        for _ in range(iters):
            r = w * x
            r += b
            r -= y
            gw = 2.0 * np.dot(r, x) / n
            gb = 2.0 * r.sum() / n
            w, b = w - lr * gw, b - lr * gb
        return np.array([w, b])
    w, b = np.zeros(x.shape[1]), 0.0
    for _ in range(iters):
        r = x @ w
        r += b
        r -= y
        gw = 2.0 * (r @ x) / n
        gb = 2.0 * r.sum() / n
        w, b = w - lr * gw, b - lr * gb
    return np.append(w, b)


def run_numpy(path: Path, k: int, args) -> Result:
    x, y = load_numpy(path, k)
    res = Result()
    for i in range(args.warmup + args.repeat):
        t0 = time.perf_counter()
        res.record(numpy_train(x, y, args.iters, args.lr))
        t = time.perf_counter() - t0
        if i >= args.warmup:
            res.times.append(t)
    return res


def copy_bandwidth(mib: int) -> tuple[float, str]:
    """Best copy bandwidth (bytes read + written per second) of 1 and all cores."""
    n = mib * 1024 * 1024 // 8
    src = np.ones(n)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in
    threads = os.cpu_count() or 1
    best, how = 0.0, ""
    for t in sorted({1, threads}):
        bounds = [(i * n // t, (i + 1) * n // t) for i in range(t)]
        with concurrent.futures.ThreadPoolExecutor(t) as pool:
            for _ in range(3):
                t0 = time.perf_counter()
                list(pool.map(lambda se: np.copyto(dst[se[0]:se[1]], src[se[0]:se[1]]), bounds))
                bw = 2 * src.nbytes / (time.perf_counter() - t0)
                if bw > best:
                    best, how = bw, f"{t} thread(s)"
    del src, dst
    gc.collect()
    return best, how


# --------------------------------------------------------------------------- main


def default_binary() -> str:
    if os.environ.get("DFGRAD"):
        return os.environ["DFGRAD"]
    target = os.environ.get("CARGO_TARGET_DIR")
    if target and Path(target, "release", "dfgrad").exists():
        return str(Path(target, "release", "dfgrad"))
    return "/work/target/debug/dfgrad"


def fmt_s(t: float | None) -> str:
    return "–" if t is None else f"{t:.3f}"


def fmt_ratio(a: float | None, b: float | None) -> str:
    return "–" if a is None or b is None else f"{a / b:.2f}x"


def fmt_pct(bound: float, t: float | None) -> str:
    return "–" if t is None else f"{100 * bound / t:.0f}%"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dfgrad", default=default_binary(),
                   help="dfgrad binary, or 'python' to run ours through the installed "
                        "Python package (a release build)")
    p.add_argument("--rows", default="1000000,10000000", help="comma-separated sizes")
    p.add_argument("--params", default="2,10", help="comma-separated parameter counts (>= 2)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--repeat", type=int, default=3, help="timed runs per engine")
    p.add_argument("--warmup", type=int, default=1, help="discarded runs per engine")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: 100k rows, --repeat 1 (overrides --rows, --repeat)")
    p.add_argument("--engines", default="ours,duckdb,numpy")
    p.add_argument("--bandwidth-mib", type=int, default=512,
                   help="size of the array copied to measure bandwidth")
    p.add_argument("--tolerance", type=float, default=1e-9,
                   help="largest accepted |parameter difference| between engines")
    p.add_argument("--data-dir", help="keep the generated files here (default: a temp dir)")
    p.add_argument("--no-files", action="store_true",
                   help="skip the loops straight over the Parquet files")
    p.add_argument("--json", help="also write the raw results to this file")
    args = p.parse_args()
    if args.quick:
        args.rows, args.repeat = "100000", 1
    sizes = [int(s) for s in args.rows.split(",")]
    counts = [int(s) for s in args.params.split(",")]
    engines = set(args.engines.split(","))
    if any(c < 2 for c in counts):
        p.error("--params: every model has at least one weight and the intercept")
    if "ours" in engines and args.dfgrad != "python" and not Path(args.dfgrad).exists():
        p.error(f"dfgrad binary not found: {args.dfgrad} (use --dfgrad or $DFGRAD)")
    if "duckdb" in engines and duckdb is None:
        print("note: duckdb is not installed (pip install duckdb); skipping it", file=sys.stderr)
        engines.discard("duckdb")

    bw, bw_how = copy_bandwidth(args.bandwidth_mib)
    print(f"dfgrad: {args.dfgrad}", file=sys.stderr)
    print(f"copy bandwidth: {bw / 1e9:.1f} GB/s ({bw_how}, {args.bandwidth_mib} MiB copy)",
          file=sys.stderr)

    tmp = None
    if args.data_dir:
        data_dir = Path(args.data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="dfgrad-bench-")
        data_dir = Path(tmp.name)

    records, failed = [], False
    for rows in sizes:
        for count in counts:
            k = count - 1
            path = generate(rows, k, data_dir)
            rec = {"rows": rows, "params": count, "bytes_per_iter": rows * count * 8,
                   "file": path.name}
            rec["bound_s"] = args.iters * rec["bytes_per_iter"] / bw
            res: dict[str, Result] = {}
            if "ours" in engines:
                ours = (run_ours_python(path, k, args) if args.dfgrad == "python"
                        else run_ours(args.dfgrad, path, k, args))
                res["ours grad"], res["ours hand"] = ours["grad"], ours["hand"]
                one_group = one_group_copy(path)
                if not args.no_files and args.dfgrad != "python" and one_group is not None:
                    for name, r in run_ours_files(args.dfgrad, path, one_group, k, args).items():
                        res[f"ours {name}"] = r
            if "duckdb" in engines:
                res["DuckDB hand"] = run_duckdb(path, k, args)
                gc.collect()
            if "numpy" in engines:
                res["NumPy"] = run_numpy(path, k, args)
                gc.collect()
            ref_name = "NumPy" if "NumPy" in res else next(iter(res))
            ref = res[ref_name].params
            rec["reference"] = ref_name
            rec["engines"] = {}
            for name, r in res.items():
                # Every run counts (warm-up included), so unstable results show.
                diff = max(float(np.max(np.abs(run - ref))) for run in r.runs)
                failed |= not diff <= args.tolerance
                rec["engines"][name] = {"times": r.times, "median_s": r.median,
                                        "params": r.params.tolist(),
                                        "max_abs_diff": diff, "note": r.note}
            w_true, b_true = true_params(k)
            rec["max_abs_err_vs_true"] = float(np.max(np.abs(ref - np.append(w_true, b_true))))
            records.append(rec)
            print(f"done: {rows} rows, {count} params: "
                  + ", ".join(f"{n} {fmt_s(r.median)}s ({r.note})" if r.note
                              else f"{n} {fmt_s(r.median)}s" for n, r in res.items()),
                  file=sys.stderr)

    def t(rec, name):
        e = rec["engines"].get(name)
        return None if e is None else e["median_s"]

    print(f"\nLinear regression, {args.iters} gradient-descent steps in one recursive query; "
          f"median of {args.repeat} run(s) after {args.warmup} warm-up; "
          f"copy bandwidth {bw / 1e9:.1f} GB/s.\n")
    print("| rows | params | MB scanned/iter | ours grad (s) | ours hand (s) | DuckDB hand (s) "
          "| NumPy (s) | bandwidth bound (s) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in records:
        print(f"| {r['rows']:,} | {r['params']} | {r['bytes_per_iter'] / 1e6:.0f} "
              f"| {fmt_s(t(r, 'ours grad'))} | {fmt_s(t(r, 'ours hand'))} "
              f"| {fmt_s(t(r, 'DuckDB hand'))} | {fmt_s(t(r, 'NumPy'))} | {r['bound_s']:.3f} |")
    print()
    print("| rows | params | grad / hand (target ≤ 1.1x) | ours grad / DuckDB | ours hand / DuckDB "
          "| ours grad / NumPy | ours hand / NumPy "
          "| % of bound: ours grad | ours hand | DuckDB | NumPy |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in records:
        g, h, d, n = (t(r, e) for e in ("ours grad", "ours hand", "DuckDB hand", "NumPy"))
        b = r["bound_s"]
        print(f"| {r['rows']:,} | {r['params']} | {fmt_ratio(g, h)} | {fmt_ratio(g, d)} "
              f"| {fmt_ratio(h, d)} | {fmt_ratio(g, n)} | {fmt_ratio(h, n)} "
              f"| {fmt_pct(b, g)} | {fmt_pct(b, h)} | {fmt_pct(b, d)} | {fmt_pct(b, n)} |")
    print("\nRatios are time / time (> 1: the first is slower); % of bound = bandwidth bound / time.\n")
    if any("ours file 1 group" in r["engines"] for r in records):
        names = [f"ours {name}" for name, _, _ in FILE_VARIANTS]
        print("The `grad` loop straight over the Parquet file (`dfgrad --table`, no load), "
              "loop-invariant data kept (the default) or not "
              "(`datafusion_grad.cache_loop_invariants = false`), same process, "
              "interleaved; in parentheses: / the in-memory loop (target ≤ 1.2x):\n")
        print("| rows | params | " + " | ".join(n[5:] + " (s)" for n in names) + " |")
        print("|---:|---:|" + "---:|" * len(names))
        for r in records:
            memory = t(r, "ours memory")
            print(f"| {r['rows']:,} | {r['params']} | "
                  + " | ".join(f"{fmt_s(t(r, n))} ({fmt_ratio(t(r, n), memory)})"
                               for n in names) + " |")
        print()
    ref_name = records[0]["reference"] if records else ""
    names = [n for n in records[0]["engines"] if n != ref_name] if records else []
    print(f"Largest |parameter difference| from {ref_name}'s result "
          f"(and {ref_name}'s distance to the generating parameters):\n")
    print("| rows | params | " + " | ".join(names) + f" | {ref_name} vs true |")
    print("|---:|---:|" + "---:|" * (len(names) + 1))
    for r in records:
        print(f"| {r['rows']:,} | {r['params']} | "
              + " | ".join(f"{r['engines'][n]['max_abs_diff']:.1e}" for n in names)
              + f" | {r['max_abs_err_vs_true']:.1e} |")

    if args.json:
        Path(args.json).write_text(json.dumps(
            {"dfgrad": args.dfgrad, "copy_bandwidth_Bps": bw, "iters": args.iters,
             "lr": args.lr, "repeat": args.repeat, "warmup": args.warmup,
             "records": records}, indent=2))
    if tmp is not None:
        tmp.cleanup()
    if failed:
        print(f"\nFAILED: engines disagree by more than {args.tolerance:g}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

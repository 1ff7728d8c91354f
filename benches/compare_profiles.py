#!/usr/bin/env python3
"""The main job's training loop in two builds of `dfgrad`, side by side.

The README's two commands share one build in the dev profile (issue 46,
item 7); the main job must stay within 1.2x of a release build. This runs
`compare_training.py`'s training query (`--iters` gradient-descent steps of a
linear model, the `grad` form) over an in-memory table of `--rows` points in
each binary: `--runs` + 2 times in one process (the load and the first two
runs discarded), `--processes` processes of each binary, alternating (A B B A
…), and prints the medians and their ratio. Both binaries must end at the same
parameters, to 1e-9 (the script fails otherwise).

Usage:

    cargo build --release --features test-build --bin dfgrad   # ~1 hour cold on 2 cores
    python3 benches/compare_profiles.py \\
        --dev "$CARGO_TARGET_DIR/debug/dfgrad" --release "$CARGO_TARGET_DIR/release/dfgrad"
"""

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_training  # noqa: E402  (the data and the query)


def timed(binary: str, script: Path) -> tuple[list[float], str]:
    """Each statement's `Elapsed` time, and what the last query printed."""
    run = subprocess.run([binary, "-f", str(script)], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, check=False)
    if run.returncode != 0:
        sys.exit(f"{binary} failed:\n{run.stdout[-2000:]}")
    times = [float(t) for t in re.findall(r"Elapsed ([0-9.]+) seconds", run.stdout)]
    tables = run.stdout.strip().split("row(s) fetched")
    return times, tables[-2] if len(tables) > 1 else ""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dev", required=True, help="dfgrad of the dev profile")
    p.add_argument("--release", required=True, help="dfgrad of the release profile")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--params", default="2,10", help="comma-separated parameter counts (>= 2)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--runs", type=int, default=10, help="timed runs per process")
    p.add_argument("--processes", type=int, default=3, help="processes per binary")
    args = p.parse_args()
    binaries = {"dev": args.dev, "release": args.release}
    print("| parameters | dev (s) | release (s) | dev / release |")
    print("|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for params in (int(k) for k in args.params.split(",")):
            data = compare_training.generate(args.rows, params - 1, Path(tmp))
            query = compare_training.training_sql(params - 1, args.iters, 0.5, "grad")
            script = Path(tmp) / "profiles.sql"
            script.write_text(f"CREATE TABLE pts AS SELECT * FROM '{data}';\n"
                              + (query.strip().rstrip(";") + ";\n") * (args.runs + 2))
            times = {name: [] for name in binaries}
            results = {}
            order = list(binaries)
            for i in range(args.processes):
                for name in (order if i % 2 == 0 else order[::-1]):
                    t, result = timed(binaries[name], script)
                    times[name] += t[3:]  # the load and two warm-up runs
                    results[name] = result
            numbers = {n: [float(v) for v in re.findall(r"-?[0-9][0-9.e+-]*", r.split("+", 1)[-1])]
                       for n, r in results.items()}
            agree = len(numbers["dev"]) == len(numbers["release"]) and all(
                abs(a - b) <= 1e-9 * (1 + abs(b)) for a, b in zip(numbers["dev"], numbers["release"]))
            if not agree:
                sys.exit(f"the two builds disagree:\n{results['dev']}\n{results['release']}")
            dev, release = (statistics.median(times[n]) for n in ("dev", "release"))
            print(f"| {params} | {dev:.4f} | {release:.4f} | {dev / release:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

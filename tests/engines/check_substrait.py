#!/usr/bin/env python3
"""Differentiated plans exported as Substrait, run in Apache Arrow's Acero.

For each query of CORPUS, over small deterministic tables:
  1. run it in dfgrad (`--format csv`);
  2. export its differentiated plan with `--substrait FILE --substrait-profile acero`;
  3. run the plan's bytes with `pyarrow.substrait.run_query` (Acero), the
     tables handed over by a table provider in the plan's column order;
  4. sort both results and compare them: numbers to 1e-9 relative, NaN
     equal to NaN and NULL to NULL.
Each query of REFUSED must be refused by the export with an `[unexportable]`
error naming the construct (Acero cannot run it, or would give other
numbers).

Usage: check_substrait.py [DFGRAD]   (default:
${CARGO_TARGET_DIR:-$HOME/.cache/datafusion-grad/target}/debug/dfgrad)

Prints one line per check and `N passed, M failed` last; exits non-zero on
any failure.
"""

import csv
import io
import math
import os
import subprocess
import sys
import tempfile

import pyarrow as pa
import pyarrow.substrait as pss

NULL = None

# t: x has a NULL and ties for round(); g is an integer group.
T = {
    "x": [0.5, 1.0, 2.0, NULL, 4.0, -3.0, 2.5, -0.5, 1.5, -1.5, 0.25, 3.5],
    "y": [1.0, -2.0, 3.0, 4.0, 0.25, 0.5, 1.5, -1.0, 2.0, 0.75, -0.5, 1.25],
    "g": [1, 1, 2, 2, 2, 3, 3, 3, 1, 2, 1, 3],
}
# pts: regression points, grouped by the weight w.
PTS = {
    "w": [0.5, 0.5, 0.5, 1.5, 1.5, 1.5, 2.0, 2.0, 2.0],
    "x": [1.0, 2.0, -1.0, 0.5, 3.0, -2.0, 1.0, 4.0, -0.5],
    "y": [2.0, 3.5, -1.5, 1.0, 6.5, -3.0, 1.0, 9.0, 0.0],
}
TYPES = {"x": pa.float64(), "y": pa.float64(), "w": pa.float64(), "g": pa.int64()}
TABLES = {"t": T, "pts": PTS}

CORPUS = [
    # rules, one variable; x is NULL in one row
    "SELECT x, grad(x * x * y, x) AS dx FROM t",
    "SELECT grad(sin(x) * exp(y), x) AS a, grad(sin(x) * exp(y), y) AS b FROM t",
    "SELECT grad(abs(x) * y + signum(y) * x, x) AS d FROM t",
    "SELECT grad(power(abs(x) + 1.0, y) + sqrt(abs(x) + 1.0) + ln(abs(x) + 2.0), x) AS d FROM t",
    "SELECT grad(asinh(x) + atan(x) + cosh(y) * tanh(x) + sinh(x * 0.5), x) AS d FROM t",
    "SELECT grad(log(abs(x) + 1.0) + log(2.0, abs(y) + 1.0) + log2(abs(x) + 3.0) + log10(abs(y) + 1.0), x) AS d FROM t",
    "SELECT grad(atan2(y, x) + asin(y / 5.0) + acos(x / 5.0), x) AS d FROM t",
    # CASE: searched (NULL condition falls through), simple, without ELSE
    "SELECT x, grad(CASE WHEN x > 1 THEN x * x ELSE -x END, x) AS d FROM t",
    "SELECT grad(CASE g WHEN 1 THEN x * y WHEN 2 THEN y ELSE x END, x) AS d FROM t",
    "SELECT x, CASE WHEN x > 1 THEN grad(x * x * y, x) END AS d FROM t",
    # piecewise functions of x in f itself
    "SELECT x, round(x) AS r, grad(round(x) * x + floor(x) * y + ceil(y) * x, x) AS d FROM t",
    # forward and reverse mode, second derivatives
    "SELECT jvp(x * y + sin(x), x, 1.0, y, 2.0) AS j FROM t",
    "SELECT vjp(exp(x) * y, x, 3.0) AS v, vjp(x * y, y, x) AS u FROM t",
    "SELECT grad(grad(sin(x) * x, x), x) AS d2, grad(grad(x * x * y, x), y) AS dxy FROM t",
    "SELECT x, grad(x * x * y, x, y)['y'] AS gy FROM t",
    # derived columns
    "WITH v AS (SELECT x, y, sin(x) AS s FROM t) SELECT grad(s * x, x) AS d FROM v",
    "SELECT grad(z * z, x) AS d FROM (SELECT x, y, x * y AS z FROM t) AS u",
    # filters, ORDER BY, LIMIT, OFFSET
    "SELECT x, grad(tanh(x * y), x) AS d FROM t WHERE y > 0",
    "SELECT x, grad(x * x * x, x) AS d FROM t WHERE x IS NOT NULL ORDER BY x DESC LIMIT 4",
    "SELECT x, grad(exp(x) / (1.0 + exp(x)), x) AS d FROM t WHERE x IS NOT NULL ORDER BY x LIMIT 3 OFFSET 2",
    "SELECT x, grad(sin(x), x) AS d FROM t ORDER BY x NULLS FIRST LIMIT 3",
    "SELECT x, grad(x * y, x) AS d FROM t ORDER BY y OFFSET 9",
    # aggregates through the chain rule, GROUP BY the variable
    "SELECT w, grad(avg((w * x - y) * (w * x - y)), w) AS dw FROM pts GROUP BY w",
    "SELECT w, grad(sqrt(avg((w * x - y) * (w * x - y))), w) AS d FROM pts GROUP BY w",
    "SELECT w, grad(avg(ln(1.0 + exp(-y * w * x))), w) AS d FROM pts GROUP BY w HAVING count(*) > 2",
    "SELECT w, grad(sum(w * x * x) / count(x), w) AS d, min(x) AS lo, max(y) AS hi FROM pts GROUP BY w",
    "SELECT g, count(*) AS n, sum(grad(x * x, x)) AS s, avg(grad(sin(x), x)) AS a FROM t GROUP BY g",
    "SELECT sum(grad(x * y, x)) AS s, count(x) AS n FROM t",
    "SELECT g * 2 AS k, sum(grad(x * x * y, x)) AS s FROM t GROUP BY g * 2",
]

# (query, words the refusal must contain)
REFUSED = [
    ("SELECT grad(x * x, x) + x % y AS d FROM t", "`%`"),
    ("SELECT cbrt(x) AS c, grad(x * x, x) AS d FROM t", "`cbrt`"),
    ("SELECT trunc(x) AS c FROM t", "`trunc`"),
    ("SELECT degrees(x) AS c FROM t", "`degrees`"),
    ("SELECT radians(x) AS c FROM t", "`radians`"),
    ("SELECT cot(x) AS c FROM t", "`cot`"),
    ("SELECT nanvl(x, y) AS c FROM t", "`nanvl`"),
    ("SELECT x IS DISTINCT FROM y AS b FROM t", "IS DISTINCT FROM"),
    ("SELECT TRY_CAST(x AS BIGINT) AS c FROM t", "TRY_CAST"),
    ("SELECT sum(grad(x * x, x)) FILTER (WHERE y > 0) AS s FROM t", "FILTER"),
    ("SELECT g, sum(x) AS s FROM t GROUP BY ROLLUP(g)", "ROLLUP"),
    ("SELECT round(x, 1) AS r FROM t", "round"),
    ("SELECT w, grad(avg(w * x) OVER (PARTITION BY w), w) AS d FROM pts", "window"),
    ("SELECT t.x, grad(t.x * pts.w, t.x) AS d FROM t JOIN pts ON t.x = pts.x", "join"),
    ("SELECT grad(x * x, x, y) AS g FROM t", "named_struct"),
    ("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT n FROM r",
     "recursive CTE"),
]

REL_TOL = 1e-9


def default_dfgrad():
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.expanduser(
        "~/.cache/datafusion-grad/target")
    return os.path.join(target, "debug", "dfgrad")


def fmt(v):
    return "" if v is None else repr(v)


def write_tables(directory):
    """Writes each table as CSV; returns dfgrad's --table arguments."""
    args = []
    for name, cols in TABLES.items():
        path = os.path.join(directory, f"{name}.csv")
        names = list(cols)
        with open(path, "w") as f:
            f.write(",".join(names) + "\n")
            for row in zip(*cols.values()):
                f.write(",".join(fmt(v) for v in row) + "\n")
        args += ["--table", f"{name}={path}"]
    return args


def arrow_tables():
    return {name: pa.table({c: pa.array(v, TYPES[c]) for c, v in cols.items()})
            for name, cols in TABLES.items()}


def parse_cell(text):
    if text == "":
        return None
    if text in ("true", "false"):
        return text == "true"
    try:
        return float(text)
    except ValueError:
        return text


def cell(v):
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, (int, float)):
        return float(v)
    return v


def sort_key(row):
    def k(v):
        if v is None:
            return (0, 0.0, "")
        if isinstance(v, float) and math.isnan(v):
            return (2, 0.0, "")
        if isinstance(v, (bool, float)):
            return (1, float(v), "")
        return (3, 0.0, str(v))
    return tuple(k(v) for v in row)


def same_value(a, b):
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        if math.isinf(a) or math.isinf(b):
            return a == b
        return a == b or abs(a - b) <= REL_TOL * max(abs(a), abs(b))
    return a == b


def compare(got, want):
    """None if equal, else a description of the first difference."""
    if len(got) != len(want):
        return f"{len(got)} rows from Acero, {len(want)} from dfgrad"
    for i, (g, w) in enumerate(zip(sorted(got, key=sort_key), sorted(want, key=sort_key))):
        if len(g) != len(w) or not all(same_value(a, b) for a, b in zip(g, w)):
            return f"row {i}: Acero {g} vs dfgrad {w}"
    return None


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def main():
    dfgrad = sys.argv[1] if len(sys.argv) > 1 else default_dfgrad()
    if not os.path.exists(dfgrad):
        print(f"dfgrad not found at {dfgrad}")
        print("0 passed, 1 failed")
        return 1
    tables = arrow_tables()

    def provider(names, schema):
        return tables[names[-1]].select(schema.names).cast(schema)

    passed = failed = 0

    def report(ok, label, detail=""):
        nonlocal passed, failed
        if ok:
            passed += 1
            print(f"ok    {label}")
        else:
            failed += 1
            print(f"FAIL  {label}\n      {detail}")

    with tempfile.TemporaryDirectory() as d:
        table_args = write_tables(d)
        plan_path = os.path.join(d, "plan.pb")
        for sql in CORPUS:
            direct = run([dfgrad, "-q", "--format", "csv", *table_args, "-c", sql])
            if direct.returncode != 0:
                report(False, sql, "dfgrad failed: " + direct.stderr.strip())
                continue
            lines = list(csv.reader(io.StringIO(direct.stdout)))
            want = [[parse_cell(c) for c in row] for row in lines[1:]]
            if os.path.exists(plan_path):
                os.remove(plan_path)
            export = run([dfgrad, *table_args, "--substrait", plan_path,
                          "--substrait-profile", "acero", "-c", sql])
            if export.returncode != 0:
                report(False, sql, "export failed: " + export.stderr.strip())
                continue
            with open(plan_path, "rb") as f:
                plan = f.read()
            try:
                reader = pss.run_query(pa.py_buffer(plan), table_provider=provider,
                                       use_threads=False)
                result = reader.read_all()
            except Exception as e:  # noqa: BLE001 - any Acero failure is a failed check
                report(False, sql, f"Acero failed: {type(e).__name__}: {e}")
                continue
            got = [[cell(v) for v in row.values()] for row in result.to_pylist()]
            if result.num_columns != len(lines[0]):
                report(False, sql, f"Acero gave {result.num_columns} columns, dfgrad {len(lines[0])}")
                continue
            diff = compare(got, want)
            report(diff is None, sql, diff or "")

        for sql, words in REFUSED:
            out = run([dfgrad, *table_args, "--substrait", plan_path,
                       "--substrait-profile", "acero", "-c", sql])
            message = out.stderr.strip()
            ok = (out.returncode != 0 and "[unexportable]" in message
                  and words in message)
            report(ok, f"refused: {sql}", f"exit {out.returncode}: {message}")

    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

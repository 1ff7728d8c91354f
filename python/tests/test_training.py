"""A whole training loop in one query, checked against least squares."""

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import datafusion_grad as dg

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

POINTS = """
CREATE TABLE points AS
SELECT x, 3.0 * x - 2.0 + 0.1 * sin(i * 12.9898) AS y
FROM (SELECT value AS i, CAST(value % 200 AS DOUBLE) / 100.0 - 1.0 AS x
      FROM generate_series(1, 2000))
"""

LOOP = """
WITH RECURSIVE fit(step, w, b) AS (
  SELECT 0 AS step, CAST(0.0 AS DOUBLE) AS w, CAST(0.0 AS DOUBLE) AS b
  UNION ALL
  SELECT step + 1,
         w - 0.5 * grad(avg(power(w * x + b - y, 2)), w),
         b - 0.5 * grad(avg(power(w * x + b - y, 2)), b)
  FROM fit CROSS JOIN points
  WHERE step < 300
  GROUP BY step, w, b
)
SELECT w, b FROM fit WHERE step = 300
"""


def test_gradient_descent_reaches_least_squares():
    ctx = dg.SessionContext()
    ctx.sql(POINTS).collect()
    got = ctx.sql(LOOP).to_pylist()[0]
    data = ctx.table("points").to_pandas()
    design = np.column_stack([data["x"], np.ones(len(data))])
    (w, b), *_ = np.linalg.lstsq(design, data["y"].to_numpy(), rcond=None)
    assert got["w"] == pytest.approx(w, abs=1e-6)
    assert got["b"] == pytest.approx(b, abs=1e-6)


def test_training_step_as_dml_from_python():
    ctx = dg.SessionContext()
    ctx.sql(POINTS).collect()
    ctx.sql("CREATE TABLE params (step INT, w DOUBLE, b DOUBLE)").collect()
    ctx.sql("INSERT INTO params VALUES (0, 0.0, 0.0)").collect()
    step = """
    INSERT INTO params
    SELECT step + 1,
           w - 0.5 * grad(avg(power(w * x + b - y, 2)), w),
           b - 0.5 * grad(avg(power(w * x + b - y, 2)), b)
    FROM (SELECT * FROM params ORDER BY step DESC LIMIT 1) CROSS JOIN points
    GROUP BY step, w, b
    """
    for _ in range(300):
        ctx.sql(step).collect()
    last = ctx.sql("SELECT w, b FROM params WHERE step = 300").to_pylist()[0]
    loop = ctx.sql(LOOP).to_pylist()[0]
    assert last["w"] == pytest.approx(loop["w"], abs=1e-12)
    assert last["b"] == pytest.approx(loop["b"], abs=1e-12)


def test_shipped_example_runs():
    ctx = dg.SessionContext()
    text = (EXAMPLES / "linear_regression.sql").read_text()
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))
    statements = [s for s in code.split(";") if s.strip()]
    for statement in statements[:-1]:
        ctx.sql(statement).collect()
    rows = ctx.sql(statements[-1]).to_pylist()
    assert rows[-1]["mse"] < 0.01


def test_plotting_example(tmp_path):
    import re
    import subprocess
    import sys

    pytest.importorskip("matplotlib")
    script = Path(__file__).resolve().parents[1] / "examples" / "train_plot.py"
    out = tmp_path / "loss.png"
    run = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True, check=True)
    accuracy = float(re.search(r"accuracy=([0-9.]+)", run.stdout).group(1))
    assert accuracy > 0.95, run.stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("partitions", [4, 16])
def test_loop_over_a_one_row_group_file_on_many_cores(tmp_path, partitions):
    # pyarrow writes 300,000 rows as one row group; a loop keeps them, read by
    # one scan per column group in shares of rows, zipped back into rows. Exact
    # integer sums: a share paired with another share's rows changes them.
    n = 300_000
    a = np.arange(1, n + 1, dtype=np.float64)
    b = np.mod(a, 1009.0)
    pq.write_table(pa.table({"a": a, "b": b}), tmp_path / "pairs.parquet")
    ctx = dg.SessionContext()
    ctx.sql(f"SET datafusion.execution.target_partitions = {partitions}").collect()
    ctx.register_parquet("pairs", tmp_path / "pairs.parquet")
    loop = """WITH RECURSIVE r(step, s) AS (
        SELECT 0, 0.0
        UNION ALL
        SELECT step + 1, sum(a * b) FROM r CROSS JOIN pairs WHERE step < 2 GROUP BY step)
      SELECT s FROM r WHERE step = 2"""
    expected = float(np.dot(a, b))
    for _ in range(6):
        assert ctx.sql(loop).to_pydict()["s"] == [expected]


@pytest.mark.parametrize("partitions", [3, 8, 13])
def test_loops_over_one_row_group_files_of_several_columns(tmp_path, partitions):
    # Columns of several types (with nulls, strings, narrow integers) in one
    # row group, read by column groups and shares of rows: each loop's exact
    # integer sums equal those of the same loop reading the file whole.
    n = 270_000
    i = np.arange(n, dtype=np.int64)
    table = pa.table(
        {
            "i": i,
            "f": (i % 977).astype(np.float64),
            "t": pa.array([str(v % 31) for v in range(n)]),
            "k": pa.array((i % 7).astype(np.int32), mask=(i % 11 == 0)),
            "g": (i % 5).astype(np.int16),
        }
    )
    pq.write_table(table, tmp_path / "wide.parquet")
    ctx = dg.SessionContext()
    ctx.sql(f"SET datafusion.execution.target_partitions = {partitions}").collect()
    ctx.register_parquet("wide", tmp_path / "wide.parquet")
    loops = [
        # every column, rows paired across all of them
        """WITH RECURSIVE r(step, s) AS (
             SELECT 0 AS step, CAST(0 AS BIGINT) AS s
             UNION ALL
             SELECT step + 1, s + sum(i * (f + length(t) + coalesce(k, 100) + g))
             FROM r CROSS JOIN wide WHERE step < 2 GROUP BY step, s)
           SELECT s FROM r WHERE step = 2""",
        # a filter on the data and two columns
        """WITH RECURSIVE r(step, s) AS (
             SELECT 0 AS step, CAST(0 AS BIGINT) AS s
             UNION ALL
             SELECT step + 1, s + sum(i * k) FROM r CROSS JOIN (SELECT i, k FROM wide WHERE g <> 3)
             WHERE step < 2 GROUP BY step, s)
           SELECT s FROM r WHERE step = 2""",
    ]
    shown = "\n".join(ctx.sql("EXPLAIN " + loops[0]).to_pydict()["plan"])
    assert "ZipColumnsExec" in shown, shown
    for loop in loops:
        ctx.sql("SET datafusion_grad.cache_loop_invariants = false").collect()
        whole = ctx.sql(loop).to_pydict()["s"]
        ctx.sql("SET datafusion_grad.cache_loop_invariants = true").collect()
        for _ in range(3):
            assert ctx.sql(loop).to_pydict()["s"] == whole

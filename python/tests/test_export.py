"""differentiate_sql, rewrite_sql and Substrait from Python."""

import sqlite3

import pytest

import datafusion_grad as dg


def test_differentiate_sql_dialects():
    assert dg.differentiate_sql("x * y", "x") == "y"
    assert dg.differentiate_sql("sin(x)", "x", dialect="postgres") == "cos(x)"
    for dialect in ["datafusion", "duckdb", "postgres", "sqlite", "generic"]:
        assert "grad" not in dg.differentiate_sql("exp(x) * ln(y)", "y", dialect=dialect)


def test_rewrite_sql_runs_in_sqlite():
    sql = dg.rewrite_sql(
        "CREATE TABLE t (x DOUBLE, y DOUBLE); SELECT grad(x * x * y + sin(y), y) AS d FROM t",
        dialect="sqlite",
    )
    create, select = [s.strip() for s in sql.split(";") if s.strip()]
    assert "grad" not in select
    db = sqlite3.connect(":memory:")
    db.execute(create)
    db.execute("INSERT INTO t VALUES (2.0, 0.0)")
    assert db.execute(select).fetchone()[0] == pytest.approx(4.0 + 1.0)


def test_rewrite_sql_over_a_session():
    ctx = dg.SessionContext()
    ctx.from_pydict({"x": [1.0]}, name="t")
    out = ctx.rewrite_sql("SELECT grad(x * x, x) AS d FROM t", "duckdb")
    assert "grad" not in out and "FROM t" in out
    assert dg.rewrite_sql("SELECT 1", "postgres") == "SELECT 1"


def test_to_substrait_runs_in_acero():
    import pyarrow as pa
    import pyarrow.substrait as substrait

    data = pa.table({"x": [1.0, 2.0, -3.0]})
    ctx = dg.SessionContext()
    ctx.from_arrow(data, name="t")
    plan = ctx.to_substrait("SELECT grad(x * x * x, x) AS d FROM t", profile="acero")
    assert isinstance(plan, bytes)
    reader = substrait.run_query(pa.py_buffer(plan), table_provider=lambda names, schema: data)
    assert reader.read_all().column(0).to_pylist() == [3.0, 12.0, 27.0]

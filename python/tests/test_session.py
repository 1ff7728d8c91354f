"""SessionContext and DataFrame: SQL with grad/jvp/vjp, files, results."""

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import datafusion_grad as dg


@pytest.fixture
def ctx():
    ctx = dg.SessionContext()
    ctx.from_pydict({"x": [0.5, 1.0, 2.0], "y": [3.0, -1.0, 0.25]}, name="t")
    return ctx


def test_grad_values(ctx):
    got = ctx.sql("SELECT grad(sin(x) * y, x) AS d FROM t ORDER BY x").to_pydict()["d"]
    assert got == pytest.approx([math.cos(x) * y for x, y in [(0.5, 3.0), (1.0, -1.0), (2.0, 0.25)]])


def test_several_wrt_struct(ctx):
    rows = ctx.sql("SELECT grad(x * x * y, x, y) AS g FROM t ORDER BY x").to_pylist()
    assert rows[0]["g"] == {"x": pytest.approx(2 * 0.5 * 3.0), "y": pytest.approx(0.25)}


def test_jvp_vjp_and_second_order(ctx):
    got = ctx.sql(
        "SELECT jvp(x * y, x, 2.0, y, 1.0) AS j, vjp(exp(x), x, y) AS v, "
        "grad(grad(x * x * x, x), x) AS h FROM t ORDER BY x"
    ).to_pydict()
    assert got["j"] == pytest.approx([2 * 3.0 + 0.5, 2 * -1.0 + 1.0, 2 * 0.25 + 2.0])
    assert got["v"] == pytest.approx([3.0 * math.exp(0.5), -math.exp(1.0), 0.25 * math.exp(2.0)])
    assert got["h"] == pytest.approx([3.0, 6.0, 12.0])


def test_grad_through_aggregate(ctx):
    # d/dw avg((w*x - y)^2) at w = 1, by hand
    got = ctx.sql(
        "SELECT grad(avg((w * x - y) * (w * x - y)), w) AS d "
        "FROM t, (SELECT 1.0 AS w) p GROUP BY w"
    ).to_pydict()["d"][0]
    xs, ys = [0.5, 1.0, 2.0], [3.0, -1.0, 0.25]
    assert got == pytest.approx(sum(2 * (x - y) * x for x, y in zip(xs, ys)) / 3)


def test_ddl_and_dml(ctx):
    ctx.sql("CREATE TABLE p (w DOUBLE)").collect()
    ctx.sql("INSERT INTO p VALUES (3.0)").collect()
    ctx.sql("INSERT INTO p SELECT w - 0.25 * grad(w * w, w) FROM p").collect()
    assert sorted(ctx.sql("SELECT w FROM p").to_pydict()["w"]) == [1.5, 3.0]
    assert ctx.table_exist("p")
    ctx.deregister_table("p")
    assert not ctx.table_exist("p")


def test_results_in_every_form(ctx):
    df = ctx.sql("SELECT x, grad(x * x, x) AS d FROM t ORDER BY x")
    assert df.columns == ["x", "d"]
    assert df.schema() == pa.schema([("x", pa.float64()), ("d", pa.float64())])
    table = df.to_arrow_table()
    assert table.column("d").to_pylist() == [1.0, 2.0, 4.0]
    batches = df.collect()
    assert sum(b.num_rows for b in batches) == 3
    assert pa.table(df).equals(table)  # __arrow_c_stream__
    assert df.to_pandas()["d"].tolist() == [1.0, 2.0, 4.0]
    assert df.to_polars()["d"].to_list() == [1.0, 2.0, 4.0]
    assert df.count() == 3
    assert df.to_pylist()[0] == {"x": 0.5, "d": 1.0}


def test_show_and_explain(ctx, capsys):
    df = ctx.sql("SELECT grad(x * x, x) AS d FROM t")
    df.show()
    out = capsys.readouterr().out
    assert "| d" in out and "4.0" in out
    plan = df.explain_string()
    assert "logical_plan" in plan and "physical_plan" in plan
    assert "grad" not in plan  # already replaced by its derivative
    df.explain(analyze=True)
    assert "output_rows" in capsys.readouterr().out


def test_files(tmp_path):
    ctx = dg.SessionContext()
    table = pa.table({"x": [1.0, 2.0], "y": [5.0, 6.0]})
    pq.write_table(table, tmp_path / "t.parquet")
    (tmp_path / "t.csv").write_text("x,y\n1.0,5.0\n2.0,6.0\n")
    (tmp_path / "t.json").write_text("\n".join(json.dumps(r) for r in table.to_pylist()))
    ctx.register_parquet("tp", tmp_path / "t.parquet")
    ctx.register_csv("tc", tmp_path / "t.csv")
    ctx.register_json("tj", tmp_path / "t.json")
    for name in ["tp", "tc", "tj"]:
        got = ctx.sql(f"SELECT grad(x * x * y, x) AS d FROM {name} ORDER BY x").to_pydict()
        assert got == {"d": [10.0, 24.0]}, name


def test_csv_delimiter_is_one_character(tmp_path):
    ctx = dg.SessionContext()
    (tmp_path / "t.csv").write_text("x;y\n1.0;5.0\n")
    ctx.register_csv("t", tmp_path / "t.csv", delimiter=";")
    assert ctx.sql("SELECT y FROM t").to_pydict() == {"y": [5.0]}
    with pytest.raises(TypeError):
        ctx.register_csv("u", tmp_path / "t.csv", delimiter=";;")

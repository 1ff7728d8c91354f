"""grad in the stock `datafusion` package (datafusion-python 55), through
datafusion_grad.install: FFI scalar functions, the differentiating query
planner, and the grad_query table function."""

import math

import pytest

datafusion = pytest.importorskip("datafusion")

import datafusion_grad as dg  # noqa: E402
from datafusion_grad import _internal  # noqa: E402


@pytest.fixture
def ctx():
    ctx = dg.install(datafusion.SessionContext())
    ctx.from_pydict({"x": [0.5, 1.0, 2.0], "y": [3.0, -1.0, 0.25]}, name="t")
    ctx.from_pydict({"w": [1.5]}, name="p")
    return ctx


def test_version_is_55():
    assert datafusion.__version__.startswith("55.")


def test_grad_in_select(ctx):
    got = ctx.sql("SELECT grad(sin(x) * y, x) AS d FROM t ORDER BY x").to_pydict()["d"]
    assert got == pytest.approx([math.cos(x) * y for x, y in [(0.5, 3.0), (1.0, -1.0), (2.0, 0.25)]])


def test_struct_jvp_vjp_second_order(ctx):
    got = ctx.sql(
        "SELECT grad(x * x * y, x, y)['x'] AS gx, jvp(x * y, x, 2.0, y, 1.0) AS j, "
        "vjp(exp(x), x, y) AS v, grad(grad(x * x * x, x), x) AS h FROM t ORDER BY x"
    ).to_pydict()
    assert got["gx"] == pytest.approx([2 * 0.5 * 3.0, 2 * 1.0 * -1.0, 2 * 2.0 * 0.25])
    assert got["j"] == pytest.approx([2 * 3.0 + 0.5, 2 * -1.0 + 1.0, 2 * 0.25 + 2.0])
    assert got["v"] == pytest.approx([3.0 * math.exp(0.5), -math.exp(1.0), 0.25 * math.exp(2.0)])
    assert got["h"] == pytest.approx([3.0, 6.0, 12.0])


def test_where_order_join_subquery(ctx):
    got = ctx.sql(
        "SELECT t.x, grad(p.w * t.x * t.x, t.x) AS d FROM t JOIN p ON grad(p.w * p.w, p.w) > 0 "
        "WHERE grad(x * x, x) > 2.5 AND x IN (SELECT x FROM t WHERE grad(y * y, y) < 1) "
        "ORDER BY grad(x * x, x)"
    ).to_pydict()
    assert got == {"x": [2.0], "d": [2 * 1.5 * 2.0]}


def test_grad_through_aggregate(ctx):
    got = ctx.sql(
        "SELECT grad(avg((w * x - y) * (w * x - y)), w) AS d FROM t CROSS JOIN p GROUP BY w"
    ).to_pydict()["d"][0]
    xs, ys = [0.5, 1.0, 2.0], [3.0, -1.0, 0.25]
    assert got == pytest.approx(sum(2 * (1.5 * x - y) * x for x, y in zip(xs, ys)) / 3)


def test_dataframe_api_and_views(ctx):
    df = ctx.sql("SELECT x, grad(x * x * x, x) AS d FROM t")
    assert sorted(df.to_pydict()["d"]) == [0.75, 3.0, 12.0]
    ctx.sql("CREATE VIEW v AS SELECT x, grad(x * x, x) AS d FROM t").collect()
    assert sorted(ctx.sql("SELECT d FROM v").to_pydict()["d"]) == [1.0, 2.0, 4.0]


def test_dml_and_ctas(ctx):
    ctx.sql("CREATE TABLE params (w DOUBLE)").collect()
    ctx.sql("INSERT INTO params VALUES (3.0)").collect()
    ctx.sql("INSERT INTO params SELECT w - 0.25 * grad(w * w, w) FROM params").collect()
    assert ctx.sql("SELECT w FROM params ORDER BY w").to_pydict() == {"w": [1.5, 3.0]}
    ctx.sql("CREATE TABLE cubes AS SELECT w, grad(w * w * w, w) AS d FROM params").collect()
    assert ctx.sql("SELECT d FROM cubes ORDER BY w").to_pydict() == {"d": [6.75, 27.0]}


def test_recursive_cte_through_grad_query(ctx):
    newton = (
        "WITH RECURSIVE it(n, x) AS (SELECT 0, 1.0 UNION ALL "
        "SELECT n + 1, x - (x * x - 2) / grad(x * x - 2, x) FROM it WHERE n < 6) "
        "SELECT x FROM it WHERE n = 6"
    )
    got = ctx.sql(f"SELECT * FROM grad_query('{newton}')").to_pydict()
    assert got["x"][0] == pytest.approx(math.sqrt(2), abs=1e-15)


def test_training_loop_over_callers_table_in_grad_query(ctx):
    ctx.sql(
        "CREATE TABLE points AS SELECT CAST(value AS DOUBLE) / 10 AS x, "
        "2.0 * CAST(value AS DOUBLE) / 10 + 1.0 AS y FROM generate_series(0, 20)"
    ).collect()
    loop = (
        "WITH RECURSIVE fit(step, w, b) AS (SELECT 0 AS step, 0.0 AS w, 0.0 AS b UNION ALL "
        "SELECT step + 1, w - 0.2 * grad(avg(power(w * x + b - y, 2)), w), "
        "b - 0.2 * grad(avg(power(w * x + b - y, 2)), b) "
        "FROM fit CROSS JOIN points WHERE step < 2000 GROUP BY step, w, b) "
        "SELECT w, b FROM fit WHERE step = 2000"
    )
    got = ctx.sql(f"SELECT * FROM grad_query('{loop}')").to_pylist()[0]
    assert got["w"] == pytest.approx(2.0, abs=1e-6)
    assert got["b"] == pytest.approx(1.0, abs=1e-6)
    # the result is an ordinary table to the stock session
    ctx.sql(f"CREATE TABLE fitted AS SELECT * FROM grad_query('{loop}')").collect()
    assert ctx.sql("SELECT count(*) AS n FROM fitted").to_pydict() == {"n": [1]}


def test_recursive_cte_through_the_planner(ctx):
    sql = (
        "WITH RECURSIVE it(n, x) AS (SELECT 0 AS n, 1.0 AS x UNION ALL "
        "SELECT n + 1, x - (x * x - 2) / grad(x * x - 2, x) FROM it WHERE n < 6) "
        "SELECT x FROM it WHERE n = 6"
    )
    assert ctx.sql(sql).to_pydict()["x"][0] == pytest.approx(math.sqrt(2), abs=1e-15)


def test_grad_query_refusals(ctx):
    with pytest.raises(Exception, match="one string literal"):
        ctx.sql("SELECT * FROM grad_query(1)").collect()
    with pytest.raises(Exception, match="grad_query runs queries"):
        ctx.sql("SELECT * FROM grad_query('CREATE TABLE z (a INT)')").collect()
    assert not ctx.table_exist("z")
    with pytest.raises(Exception, match="non_differentiable"):
        ctx.sql("SELECT * FROM grad_query('SELECT grad(random() * x, x) FROM t')").collect()


def test_without_the_planner_grad_never_computes():
    ctx = datafusion.SessionContext()
    ctx.register_udf(datafusion.udf(_internal.ScalarFunction("grad")))
    ctx.from_pydict({"x": [1.0]}, name="t")
    with pytest.raises(Exception, match="marker_reached_execution.*datafusion_grad.install"):
        ctx.sql("SELECT grad(x * x, x) FROM t").collect()


def test_install_works_in_place():
    ctx = datafusion.SessionContext()
    dg.install(ctx)  # the return value is not needed
    ctx.from_pydict({"x": [3.0]}, name="t")
    assert ctx.sql("SELECT grad(x * x, x) AS d FROM t").to_pydict() == {"d": [6.0]}
    # queries without grad, over in-memory tables, still work
    assert ctx.sql("SELECT x + 1 AS y FROM t").to_pydict() == {"y": [4.0]}


def test_python_udfs_of_the_caller_still_work(ctx):
    import pyarrow as pa
    import pyarrow.compute as pc

    twice = datafusion.udf(lambda a: pc.multiply(a, 2.0), [pa.float64()], pa.float64(), "immutable", "twice")
    ctx.register_udf(twice)
    got = ctx.sql("SELECT twice(x) AS t2, grad(x * x, x) AS d FROM t ORDER BY x").to_pydict()
    assert got == {"t2": [1.0, 2.0, 4.0], "d": [1.0, 2.0, 4.0]}
    # a caller's function inside grad has no derivative rule: refused, by name
    with pytest.raises(Exception, match="non_differentiable.*twice"):
        ctx.sql("SELECT grad(twice(x), x) FROM t").collect()


def test_explain_shows_the_derivative(ctx):
    logical, physical = ctx.sql("EXPLAIN SELECT grad(x * x, x) AS d FROM t").to_pydict()["plan"]
    assert logical.startswith("Projection: t.x + t.x AS d")
    assert "x@0 + x@0 as d" in physical


def test_install_checks_its_argument():
    with pytest.raises(TypeError, match="stock datafusion.SessionContext"):
        dg.install(dg.SessionContext())
    with pytest.raises(TypeError, match="grad, jvp, vjp"):
        _internal.ScalarFunction("hess")
    with pytest.raises(TypeError, match="tensor_sum or tensor_avg"):
        _internal.AggregateFunction("sum")


def test_tensor_functions_from_arrow_data():
    import numpy as np
    import pyarrow as pa

    ctx = dg.install(datafusion.SessionContext())
    w = np.array([[[1.0, 2.0], [3.0, 4.0]], [[0.5, -1.0], [2.0, 0.0]]])
    x = np.array([[1.0, -1.0], [2.0, 3.0]])
    ctx.from_arrow(pa.table({"w": dg.tensor.to_arrow(w), "x": dg.tensor.to_arrow(x)}), name="t")
    out = ctx.sql(
        "SELECT grad(tensor_total(matvec(w, x)), w) AS gw, "
        "grad(dot(matvec(w, x), matvec(w, x)), x) AS gx FROM t"
    ).to_arrow_table()
    # d/dw sum(w x) = 1 xᵀ per row; d/dx |w x|² = 2 wᵀ w x
    expected_gw = np.stack([np.outer(np.ones(2), r) for r in x])
    expected_gx = np.stack([2 * m.T @ m @ r for m, r in zip(w, x)])
    got = {tuple(r.ravel()) for r in dg.tensor.to_numpy(out["gw"])}
    assert got == {tuple(r.ravel()) for r in expected_gw}
    got = {tuple(r) for r in dg.tensor.to_numpy(out["gx"])}
    assert got == {tuple(r) for r in expected_gx}
    mean = ctx.sql("SELECT tensor_avg(x) AS m FROM t").to_arrow_table()["m"]
    np.testing.assert_array_equal(dg.tensor.to_numpy(mean), [[1.5, 1.0]])


def test_meta_gradient_through_a_training_loop_in_the_stock_session(ctx):
    # issue 48: the gradient of the validation loss after 10 steps over a data
    # table with respect to the initial weights (a tensor carried unchanged);
    # `auto` takes forward mode through the aggregating step. jax.grad of
    # the unrolled loop (as sql-tests/through_recursion.slt):
    want = [0.006651162632494247, -0.0007784882032474007, 0.001016796403781, -0.010528854655779239]
    ctx.sql(
        "CREATE TABLE tr AS SELECT tensor([sin(value * 1.0), cos(value * 2.0), sin(value * 0.3), "
        "cos(value * 0.7)], 4) AS x, sin(value * 0.37) AS y FROM generate_series(1, 30)"
    ).collect()
    ctx.sql(
        "CREATE TABLE va AS SELECT tensor([cos(value * 1.0), sin(value * 2.0), cos(value * 0.3), "
        "sin(value * 0.7)], 4) AS x, cos(value * 0.37) AS y FROM generate_series(1, 10)"
    ).collect()
    got = ctx.sql(
        """
        WITH RECURSIVE train(step, w, w0) AS (
          SELECT 0, w0 AS w, w0 FROM (SELECT tensor([0.1, 0.2, -0.1, 0.3], 4) AS w0) i
          UNION ALL
          SELECT step + 1, tensor_sub(w, scale(tensor_avg(grad(power(tanh(dot(w, x)) - y, 2), w)), 0.5)), w0
          FROM train CROSS JOIN tr WHERE step < 10 GROUP BY step, w, w0)
        SELECT grad(avg(power(tanh(dot(w, va.x)) - va.y, 2)), w0) AS g
        FROM train CROSS JOIN va WHERE step = 10 GROUP BY w0
        """
    ).to_pydict()["g"]
    assert len(got) == 1
    assert got[0] == pytest.approx(want, rel=1e-9, abs=1e-15)


def test_reverse_mode_through_an_aggregating_loop_in_the_stock_session(ctx):
    # issue 48: 20 weights (more than forward mode carries), so `auto` takes
    # the backward recursive query through the aggregating step; w <- w (1 -
    # 0.1 avg(y)) three times, so d|w_3|^2/dw0 = 2 (1 - 0.1 avg(y))^6 w0.
    ys = [math.sin(v * 0.37) for v in range(1, 31)]
    ctx.sql(
        "CREATE TABLE tr AS SELECT sin(value * 0.37) AS y FROM generate_series(1, 30)"
    ).collect()
    out = ctx.sql(
        """
        WITH RECURSIVE train(step, w, w0) AS (
          SELECT 0, w0 AS w, w0 FROM (SELECT random_tensor(5, 20) AS w0) i
          UNION ALL
          SELECT step + 1, tensor_sub(w, scale(w, 0.1 * avg(y))), w0
          FROM train CROSS JOIN tr WHERE step < 3 GROUP BY step, w, w0)
        SELECT w0, grad(tensor_total(tensor_mul(w, w)), w0) AS g FROM train WHERE step = 3
        """
    ).to_pydict()
    factor = 2 * (1 - 0.1 * sum(ys) / len(ys)) ** 6
    assert len(out["g"]) == 1
    assert out["g"][0] == pytest.approx([factor * v for v in out["w0"][0]], rel=1e-12)


def test_first_row_from_the_callers_table(ctx):
    # issue 48 (5): the first row built from a column of the caller's table
    # and the variable; d/ds of |w_5|^2 (jax.grad: 13.478965302991233)
    ctx.sql("CREATE TABLE init AS SELECT tensor([0.5, -0.25, 1.0], 3) AS w0").collect()
    got = ctx.sql(
        """
        WITH RECURSIVE s(step, w, sc) AS (
          SELECT 0, tensor_add(init.w0, scale(tensor([1.0, 2.0, 3.0], 3), sc)), sc
          FROM init CROSS JOIN (SELECT 0.1 AS sc) h
          UNION ALL SELECT step + 1, tensor_add(w, scale(tensor_tanh(w), 0.1)), sc FROM s WHERE step < 5)
        SELECT grad(tensor_total(tensor_mul(w, w)), sc) AS d FROM s WHERE step = 5
        """
    ).to_pydict()["d"]
    assert got == pytest.approx([13.478965302991233], rel=1e-12)


def test_value_of_each_training_row_in_the_stock_session(ctx):
    # issue 48 (4): the derivative of the validation loss after 20 steps of
    # weighted least squares over the caller's table with respect to each
    # row's weight, through the loop (relational reverse mode), in
    # grad_query and through the planner (which receives the session's
    # optimized plan, its scans of `d` narrowed differently: widened back).
    # jax.grad of the unrolled loop (as sql-tests/data_valuation.slt):
    want = [
        -0.00017097166137302458,
        -0.002409343276963795,
        -0.00012503997476119634,
        0.0009604264452518123,
        0.00023135447687449583,
    ]
    ctx.from_pydict(
        {
            "i": [1, 2, 3, 4, 5],
            "x": [0.5, 1.0, 1.5, 2.0, -1.0],
            "y": [1.0, 1.8, 3.1, 4.2, -2.1],
            "wt": [1.0, 0.5, 2.0, 1.5, 0.8],
        },
        name="d",
    )
    ctx.from_pydict({"x": [0.7, 1.2, -0.5], "y": [1.5, 2.3, -1.1]}, name="v")
    query = """
        WITH RECURSIVE train(step, w) AS (
          SELECT 0, CAST(0.0 AS DOUBLE)
          UNION ALL
          SELECT step + 1, w - 0.1 * sum(d.wt * grad(power(w * d.x - d.y, 2), w)) / sum(d.wt)
          FROM train CROSS JOIN d WHERE step < 20 GROUP BY step, w),
        loss AS (SELECT avg(power(w * v.x - v.y, 2)) AS loss FROM train CROSS JOIN v WHERE step = 20)
        SELECT d.i, grad((SELECT loss FROM loss), d.wt) AS g FROM d
    """
    got = ctx.sql(f"SELECT * FROM grad_query('{query}') ORDER BY i").to_pydict()["g"]
    assert got == pytest.approx(want, rel=1e-9, abs=1e-15)
    got = ctx.sql(f"{query} ORDER BY d.i").to_pydict()["g"]
    assert got == pytest.approx(want, rel=1e-9, abs=1e-15)


def test_gradient_with_respect_to_a_tables_rows_through_the_planner(ctx, tmp_path):
    # relational reverse mode in the stock session: the optimizer narrows
    # the scans of `q` (to (k, v) outside, to (v) and (k, v) in the loss)
    # and pushes filters into them; the gradient is each row's total
    # derivative of loss = sum over rows with k < 3 of v^2 * x-weights
    ctx.from_pydict({"k": [1, 2, 3, 4], "v": [0.5, -1.0, 2.0, 3.0], "tag": ["a", "b", "c", "d"]}, name="q")
    loss = "(SELECT sum(q.v * q.v) + sum(q.v) * max(t.x) FROM q CROSS JOIN t WHERE q.k < 3)"
    got = ctx.sql(f"SELECT k, grad({loss}, q.v) AS g FROM q ORDER BY k").to_pydict()
    # loss = 3 * sum_{k<3} v^2 + 3 * sum_{k<3} v * 2.0 (three rows of t, max x = 2)
    assert got["k"] == [1, 2, 3, 4]
    assert got["g"] == pytest.approx([6 * 0.5 + 6.0, 6 * -1.0 + 6.0, 0.0, 0.0], rel=1e-12)
    # rows told apart by columns the query does not read (k, tag): the
    # optimizer pruned them from the scan, the planner brings them back
    got = ctx.sql("SELECT grad((SELECT sum(q.v * q.v) FROM q), q.v) AS g FROM q").to_pydict()["g"]
    assert sorted(got) == pytest.approx([-2.0, 1.0, 4.0, 6.0], rel=1e-12)
    # the same from Parquet (filters pushed into the scan, projections too)
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "q.parquet"
    pq.write_table(ctx.sql("SELECT * FROM q").to_arrow_table(), path)
    ctx.register_parquet("qp", str(path))
    got = ctx.sql(
        "SELECT tag, grad((SELECT sum(qp.v * qp.v) FROM qp WHERE qp.k > 1), qp.v) AS g "
        "FROM qp WHERE qp.k <> 3 ORDER BY tag"
    ).to_pydict()
    assert got == {"tag": ["a", "b", "d"], "g": pytest.approx([0.0, -2.0, 6.0], rel=1e-12)}

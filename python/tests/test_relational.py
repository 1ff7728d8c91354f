"""Relational reverse mode checked against JAX: the gradient of a loss query
with respect to every row of a parameter table, for models whose parameters
are rows (a relational MLP, matrix factorization, a graph convolution), and
for a loss with MAX per group, CASE on a parameter and WHERE on the data."""

import numpy as np
import pytest

import datafusion_grad as dg

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy

RNG = np.random.default_rng(23)


def num(v):
    """`v` as an SQL literal."""
    return repr(float(v))


def double(v):
    """`v` as an SQL DOUBLE (DuckDB reads a bare `0.5` as a DECIMAL)."""
    return f"CAST({num(v)} AS DOUBLE)"


def gradients(ctx, sql, keys):
    """{key tuple: gradient} of the query's rows (keys, then `g`)."""
    return {tuple(r[k] for k in keys): r["g"] for r in ctx.sql(sql).to_pylist()}


def test_relational_mlp_matches_jax():
    n, d, h1, h2, c = 12, 3, 4, 3, 3
    x = RNG.normal(size=(n, d))
    y = RNG.integers(0, c, size=n)
    shapes = {1: (d + 1, h1), 2: (h1 + 1, h2), 3: (h2 + 1, c)}
    weights = {layer: RNG.normal(size=s) * 0.7 for layer, s in shapes.items()}

    def model(ws):
        def dense(a, w):
            return jnp.concatenate([jnp.ones((a.shape[0], 1)), a], axis=1) @ w

        a = jnp.tanh(dense(x, ws[1]))
        a = jnp.tanh(dense(a, ws[2]))
        z = dense(a, ws[3])
        m = jnp.max(z, axis=1, keepdims=True)
        lse = m[:, 0] + jnp.log(jnp.sum(jnp.exp(z - m), axis=1))
        return jnp.mean(lse - z[jnp.arange(n), y])

    expected = jax.grad(model)(weights)

    ddl = [
        "CREATE TABLE x AS SELECT * FROM (VALUES "
        + ", ".join(f"({r}, {i + 1}, {double(x[r, i])})" for r in range(n) for i in range(d))
        + ") AS t(n, i, x)",
        "CREATE TABLE y AS SELECT * FROM (VALUES "
        + ", ".join(f"({r}, {y[r]})" for r in range(n))
        + ") AS t(n, c)",
        # weight rows: (layer, i, j, val); input i = 0 is the bias
        "CREATE TABLE w AS SELECT * FROM (VALUES "
        + ", ".join(
            f"({layer}, {i}, {j}, {double(w[i, j])})"
            for layer, w in weights.items()
            for i in range(w.shape[0])
            for j in range(w.shape[1])
        )
        + ") AS t(layer, i, j, val)",
    ]
    ctx = dg.SessionContext()
    for statement in ddl:
        ctx.sql(statement).collect()
    sql = """
    WITH ones AS (SELECT DISTINCT n, 0 AS i, 1.0 AS v FROM x),
    a0 AS (SELECT n, i, x AS v FROM x UNION ALL SELECT * FROM ones),
    h1 AS (SELECT a0.n, w.j, tanh(sum(a0.v * w.val)) AS h FROM a0
           JOIN w ON w.layer = 1 AND w.i = a0.i GROUP BY a0.n, w.j),
    a1 AS (SELECT n, j + 1 AS i, h AS v FROM h1 UNION ALL SELECT * FROM ones),
    h2 AS (SELECT a1.n, w.j, tanh(sum(a1.v * w.val)) AS h FROM a1
           JOIN w ON w.layer = 2 AND w.i = a1.i GROUP BY a1.n, w.j),
    a2 AS (SELECT n, j + 1 AS i, h AS v FROM h2 UNION ALL SELECT * FROM ones),
    z AS (SELECT a2.n, w.j AS c, sum(a2.v * w.val) AS z FROM a2
          JOIN w ON w.layer = 3 AND w.i = a2.i GROUP BY a2.n, w.j),
    m AS (SELECT n, max(z) AS m FROM z GROUP BY n),
    lse AS (SELECT z.n, m.m + ln(sum(exp(z.z - m.m))) AS lse
            FROM z JOIN m ON z.n = m.n GROUP BY z.n, m.m),
    loss AS (SELECT avg(lse.lse - z.z) AS loss FROM lse
             JOIN z ON z.n = lse.n JOIN y ON y.n = z.n AND y.c = z.c)
    SELECT layer, i, j, grad((SELECT loss FROM loss), val) AS g FROM w
    """
    got = gradients(ctx, sql, ["layer", "i", "j"])
    assert len(got) == sum(w.size for w in weights.values())
    for (layer, i, j), g in got.items():
        assert g == pytest.approx(float(expected[layer][i, j]), rel=1e-9, abs=1e-12)

    # The backward pass exported as SQL text gives the same gradients in DuckDB.
    duckdb = pytest.importorskip("duckdb")
    exported = dg.rewrite_sql(sql, "duckdb", ctx)
    assert "grad(" not in exported
    db = duckdb.connect()
    for statement in ddl:
        db.execute(statement)
    cursor = db.execute(exported)
    names = [c[0] for c in cursor.description]
    rows = [dict(zip(names, r)) for r in cursor.fetchall()]
    assert len(rows) == len(got)
    for r in rows:
        expected_g = float(expected[r["layer"]][r["i"], r["j"]])
        assert r["g"] == pytest.approx(expected_g, rel=1e-9, abs=1e-12)


def matrix_factorization(u, v, observed, lam, extra_rating=None):
    """A session with factor tables `u`, `v` (id, k, val), ratings `r` (the
    `observed` triples, and `extra_rating` if given) and the view `mf_loss`:
    squared errors plus L2 terms taken in scalar subqueries."""
    ctx = dg.SessionContext()
    for name, m in (("u", u), ("v", v)):
        rows = ", ".join(f"({a}, {b}, {num(m[a, b])})" for a in range(m.shape[0]) for b in range(m.shape[1]))
        ctx.sql(f"CREATE TABLE {name} AS SELECT * FROM (VALUES {rows}) AS t(id, k, val)").collect()
    rows = ", ".join([f"({a}, {b}, {num(r)})" for a, b, r in observed] + ([extra_rating] if extra_rating else []))
    ctx.sql(f"CREATE TABLE r AS SELECT * FROM (VALUES {rows}) AS t(usr, item, rating)").collect()
    ctx.sql(
        f"""CREATE VIEW mf_loss AS
        SELECT sum(e * e) + {lam} * (SELECT sum(val * val) FROM u)
                          + {lam} * (SELECT sum(val * val) FROM v) AS loss
        FROM (SELECT r.usr, r.item, sum(u.val * v.val) - r.rating AS e
              FROM r JOIN u ON u.id = r.usr JOIN v ON v.id = r.item AND v.k = u.k
              GROUP BY r.usr, r.item, r.rating)"""
    ).collect()
    return ctx


def test_matrix_factorization_with_l2_subqueries_matches_jax():
    users, items, k, lam = 5, 4, 2, 0.05
    u = RNG.normal(size=(users, k))
    v = RNG.normal(size=(items, k))
    observed = [(a, b, float(RNG.normal())) for a in range(users) for b in range(items) if RNG.random() < 0.6]

    def loss(u, v):
        fit = sum((jnp.dot(u[a], v[b]) - r) ** 2 for a, b, r in observed)
        return fit + lam * jnp.sum(u * u) + lam * jnp.sum(v * v)

    du, dv = jax.grad(loss, argnums=(0, 1))(u, v)
    ctx = matrix_factorization(u, v, observed, lam)
    got_u = gradients(ctx, "SELECT id, k, grad((SELECT loss FROM mf_loss), val) AS g FROM u", ["id", "k"])
    got_v = gradients(ctx, "SELECT id, k, grad((SELECT loss FROM mf_loss), val) AS g FROM v", ["id", "k"])
    for (a, b), g in got_u.items():
        assert g == pytest.approx(float(du[a, b]), rel=1e-9, abs=1e-12)
    for (a, b), g in got_v.items():
        assert g == pytest.approx(float(dv[a, b]), rel=1e-9, abs=1e-12)
    assert len(got_u) == users * k and len(got_v) == items * k
    # the same as a relation in FROM, over CTEs and over the view and table
    # named only there (looked up in the session's catalogs)
    from_form = gradients(
        ctx,
        "WITH l AS (SELECT * FROM mf_loss), vv AS (SELECT * FROM v) "
        "SELECT id, k, val AS g FROM grad(l, vv.val)",
        ["id", "k"],
    )
    assert from_form == pytest.approx(got_v, rel=1e-12)
    named = gradients(ctx, "SELECT id, k, val AS g FROM grad(mf_loss, v.val)", ["id", "k"])
    assert named == pytest.approx(got_v, rel=1e-12)
    with pytest.raises(dg.errors.InvalidWrtError, match="neither a CTE of the statement nor a table"):
        ctx.sql("SELECT * FROM grad(no_such_loss, v.val)").collect()


def test_graph_convolution_over_weighted_edges_matches_jax():
    nodes, f, h = 6, 3, 2
    feats = RNG.normal(size=(nodes, f))
    edges = [(a, b, float(RNG.uniform(0.2, 1.0))) for a in range(nodes) for b in range(nodes) if a != b and RNG.random() < 0.4]
    w = RNG.normal(size=(f, h))
    target = RNG.normal(size=nodes)

    def loss(w, ew):
        xw = feats @ w
        agg = jnp.zeros((nodes, h))
        for (a, b, _), e in zip(edges, ew):
            agg = agg.at[b].add(e * xw[a])
        out = jnp.tanh(agg)
        return jnp.sum((jnp.sum(out, axis=1) - target) ** 2)

    ew = jnp.array([e for _, _, e in edges])
    dw, dew = jax.grad(loss, argnums=(0, 1))(w, ew)
    ctx = dg.SessionContext()
    rows = ", ".join(f"({n}, {i}, {num(feats[n, i])})" for n in range(nodes) for i in range(f))
    ctx.sql(f"CREATE TABLE feat AS SELECT * FROM (VALUES {rows}) AS t(node, f, x)").collect()
    rows = ", ".join(f"({a}, {b}, {num(e)})" for a, b, e in edges)
    ctx.sql(f"CREATE TABLE edge AS SELECT * FROM (VALUES {rows}) AS t(src, dst, weight)").collect()
    rows = ", ".join(f"({i}, {j}, {num(w[i, j])})" for i in range(f) for j in range(h))
    ctx.sql(f"CREATE TABLE w AS SELECT * FROM (VALUES {rows}) AS t(f, h, val)").collect()
    rows = ", ".join(f"({n}, {num(target[n])})" for n in range(nodes))
    ctx.sql(f"CREATE TABLE target AS SELECT * FROM (VALUES {rows}) AS t(node, y)").collect()
    ctx.sql(
        """CREATE VIEW gcn_loss AS
        WITH xw AS (SELECT feat.node, w.h, sum(feat.x * w.val) AS v
                    FROM feat JOIN w ON w.f = feat.f GROUP BY feat.node, w.h),
        out AS (SELECT edge.dst AS node, xw.h, tanh(sum(edge.weight * xw.v)) AS o
                FROM edge JOIN xw ON xw.node = edge.src GROUP BY edge.dst, xw.h),
        per_node AS (SELECT target.node, target.y, coalesce(sum(out.o), 0.0) AS s
                     FROM target LEFT JOIN out ON out.node = target.node
                     GROUP BY target.node, target.y)
        SELECT sum((s - y) * (s - y)) AS loss FROM per_node"""
    ).collect()
    got_w = gradients(ctx, "SELECT f, h, grad((SELECT loss FROM gcn_loss), val) AS g FROM w", ["f", "h"])
    got_e = gradients(ctx, "SELECT src, dst, grad((SELECT loss FROM gcn_loss), weight) AS g FROM edge", ["src", "dst"])
    for (i, j), g in got_w.items():
        assert g == pytest.approx(float(dw[i, j]), rel=1e-9, abs=1e-12)
    for k, (a, b, _) in enumerate(edges):
        assert got_e[(a, b)] == pytest.approx(float(dew[k]), rel=1e-9, abs=1e-12)


def test_max_per_group_case_where_and_unread_rows_match_jax():
    p = np.array([0.4, -1.2, 2.0, 0.7, 1.5])
    data = [(0, 1.0), (0, -2.0), (1, 0.5), (1, 3.0), (2, -0.5), (2, 1.5), (3, -1.0)]

    def loss(p):
        total = 0.0
        for g in range(3):  # row 3's data has x < 0 everywhere; row 4 has no data
            terms = [jnp.where(p[g] > 1.0, p[g] * p[g], 2 * p[g]) * x for gg, x in data if gg == g and x > -1.5]
            total = total + jnp.max(jnp.stack(terms)) ** 2
        return total

    expected = jax.grad(loss)(p)
    ctx = dg.SessionContext()
    rows = ", ".join(f"({k}, {num(v)})" for k, v in enumerate(p))
    ctx.sql(f"CREATE TABLE p AS SELECT * FROM (VALUES {rows}) AS t(g, val)").collect()
    rows = ", ".join(f"({g}, {num(x)})" for g, x in data)
    ctx.sql(f"CREATE TABLE d AS SELECT * FROM (VALUES {rows}) AS t(g, x)").collect()
    got = gradients(
        ctx,
        """WITH m AS (SELECT d.g, max(CASE WHEN p.val > 1.0 THEN p.val * p.val ELSE 2 * p.val END * d.x) AS m
                      FROM d JOIN p ON p.g = d.g WHERE d.x > -1.5 AND d.g < 3 GROUP BY d.g)
           SELECT g, grad((SELECT sum(m * m) FROM m), val) AS g FROM p""".replace("SELECT g, grad", "SELECT p.g AS k, grad"),
        ["k"],
    )
    for (k,), g in got.items():
        assert g == pytest.approx(float(expected[k]), rel=1e-9, abs=1e-12)
    assert got[(3,)] == 0.0 and got[(4,)] == 0.0


def test_duplicate_parameter_rows_are_a_typed_error():
    ctx = dg.SessionContext()
    ctx.sql("CREATE TABLE p AS SELECT * FROM (VALUES (1, 2.0), (1, 3.0)) AS t(g, val)").collect()
    with pytest.raises(dg.errors.InvalidWrtError, match="several rows with the same other columns"):
        ctx.sql("SELECT g, grad((SELECT sum(val * val) FROM p), val) FROM p").collect()


def test_update_steps_of_matrix_factorization_match_jax():
    """Training by UPDATE, one parameter table per statement (alternating
    steps: u against the loss at (u, v), then v at the new u), a NULL rating
    skipped by the loss, against the same steps in JAX."""
    users, items, k, lam, lr = 4, 3, 2, 0.1, 0.05
    u = RNG.normal(size=(users, k))
    v = RNG.normal(size=(items, k))
    observed = [(a, b, float(RNG.normal())) for a in range(users) for b in range(items) if (a + b) % 3 != 1]

    def loss(u, v):
        fit = sum((jnp.dot(u[a], v[b]) - r) ** 2 for a, b, r in observed)
        return fit + lam * jnp.sum(u * u) + lam * jnp.sum(v * v)

    ctx = matrix_factorization(u, v, observed, lam, extra_rating="(0, 1, CAST(NULL AS DOUBLE))")
    uj, vj = jnp.array(u), jnp.array(v)
    for _ in range(3):
        for name in ("u", "v"):
            count = ctx.sql(
                f"UPDATE {name} SET val = val - {lr} * grad((SELECT loss FROM mf_loss), val)"
            ).to_pydict()["count"]
            assert count == [(users if name == "u" else items) * k]
        uj = uj - lr * jax.grad(loss, argnums=0)(uj, vj)
        vj = vj - lr * jax.grad(loss, argnums=1)(uj, vj)
    for name, want in (("u", uj), ("v", vj)):
        got = ctx.sql(f"SELECT id, k, val FROM {name}").to_pylist()
        assert len(got) == want.size
        for r in got:
            assert r["val"] == pytest.approx(float(want[r["id"], r["k"]]), rel=1e-10, abs=1e-12)

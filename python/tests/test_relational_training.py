"""Training loops of relational models in ONE `WITH RECURSIVE` query, checked
against the same number of gradient-descent steps in JAX: the work table holds
the parameter rows, and the loss that `grad(…)` differentiates reads them
(the recursive term reads the work table more than once, which datafusion-grad
runs by its own iteration)."""

import numpy as np
import pytest

import datafusion_grad as dg

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy

RNG = np.random.default_rng(41)


def num(v):
    """`v` as an SQL literal."""
    return repr(float(v))


def sgd(loss, params, lr, steps):
    """`steps` steps of plain gradient descent on `loss` from `params`."""
    grad = jax.grad(loss)
    for _ in range(steps):
        g = grad(params)
        params = jax.tree_util.tree_map(lambda p, d: p - lr * d, params, g)
    return params


def test_relational_mlp_training_loop_matches_jax():
    n, d, h1, h2, c, lr, steps = 10, 3, 4, 3, 3, 0.3, 4
    x = RNG.normal(size=(n, d))
    y = RNG.integers(0, c, size=n)
    shapes = {1: (d + 1, h1), 2: (h1 + 1, h2), 3: (h2 + 1, c)}
    weights = {layer: RNG.normal(size=s) * 0.7 for layer, s in shapes.items()}

    def loss(ws):
        def dense(a, w):
            return jnp.concatenate([jnp.ones((a.shape[0], 1)), a], axis=1) @ w

        a = jnp.tanh(dense(x, ws[1]))
        a = jnp.tanh(dense(a, ws[2]))
        z = dense(a, ws[3])
        m = jnp.max(z, axis=1, keepdims=True)
        lse = m[:, 0] + jnp.log(jnp.sum(jnp.exp(z - m), axis=1))
        return jnp.mean(lse - z[jnp.arange(n), y])

    expected = sgd(loss, {k: jnp.array(v) for k, v in weights.items()}, lr, steps)

    ctx = dg.SessionContext()
    rows = ", ".join(f"({r}, {i + 1}, {num(x[r, i])})" for r in range(n) for i in range(d))
    ctx.sql(f"CREATE TABLE x AS SELECT * FROM (VALUES {rows}) AS t(n, i, x)").collect()
    rows = ", ".join(f"({r}, {y[r]})" for r in range(n))
    ctx.sql(f"CREATE TABLE y AS SELECT * FROM (VALUES {rows}) AS t(n, c)").collect()
    rows = ", ".join(
        f"({layer}, {i}, {j}, {num(w[i, j])})"
        for layer, w in weights.items()
        for i in range(w.shape[0])
        for j in range(w.shape[1])
    )
    ctx.sql(f"CREATE TABLE w0 AS SELECT * FROM (VALUES {rows}) AS t(layer, i, j, val)").collect()
    got = ctx.sql(
        f"""
        WITH RECURSIVE train(step, layer, i, j, val) AS (
          SELECT 0, layer, i, j, val FROM w0
          UNION ALL
          SELECT step + 1, layer, i, j, val - {lr} * grad((
            WITH w AS (SELECT layer, i, j, val FROM train),
            ones AS (SELECT DISTINCT n, 0 AS i, 1.0 AS v FROM x),
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
                    FROM z JOIN m ON z.n = m.n GROUP BY z.n, m.m)
            SELECT avg(lse.lse - z.z) FROM lse
            JOIN z ON z.n = lse.n JOIN y ON y.n = z.n AND y.c = z.c), val)
          FROM train WHERE step < {steps})
        SELECT step, layer, i, j, val FROM train WHERE step = {steps}
        """
    ).to_pylist()
    assert len(got) == sum(w.size for w in weights.values())
    for r in got:
        want = float(expected[r["layer"]][r["i"], r["j"]])
        assert r["val"] == pytest.approx(want, rel=1e-9, abs=1e-12)
    # the loop moved the weights: not a loop that did nothing
    moved = max(abs(float(expected[k][i, j]) - weights[k][i, j]) for k in weights for i, j in np.ndindex(weights[k].shape))
    assert moved > 1e-3


def test_matrix_factorization_training_loop_with_two_parameter_kinds_matches_jax():
    users, items, k, lam, lr, steps = 4, 3, 2, 0.05, 0.05, 5
    u = RNG.normal(size=(users, k))
    v = RNG.normal(size=(items, k))
    observed = [(a, b, float(RNG.normal())) for a in range(users) for b in range(items) if RNG.random() < 0.7]

    def loss(p):
        u, v = p
        fit = sum((jnp.dot(u[a], v[b]) - r) ** 2 for a, b, r in observed)
        return fit + lam * jnp.sum(u * u) + lam * jnp.sum(v * v)

    want_u, want_v = sgd(loss, (jnp.array(u), jnp.array(v)), lr, steps)

    ctx = dg.SessionContext()
    rows = ", ".join(
        [f"('u', {a}, {b}, {num(u[a, b])})" for a in range(users) for b in range(k)]
        + [f"('v', {a}, {b}, {num(v[a, b])})" for a in range(items) for b in range(k)]
    )
    ctx.sql(f"CREATE TABLE p0 AS SELECT * FROM (VALUES {rows}) AS t(kind, id, k, val)").collect()
    rows = ", ".join(f"({a}, {b}, {num(r)})" for a, b, r in observed)
    ctx.sql(f"CREATE TABLE r AS SELECT * FROM (VALUES {rows}) AS t(usr, item, rating)").collect()
    got = ctx.sql(
        f"""
        WITH RECURSIVE train(step, kind, id, k, val) AS (
          SELECT 0, kind, id, k, val FROM p0
          UNION ALL
          SELECT step + 1, kind, id, k, val - {lr} * grad((
            SELECT sum(e * e) + {lam} * (SELECT sum(val * val) FROM train WHERE kind = 'u')
                              + {lam} * (SELECT sum(val * val) FROM train WHERE kind = 'v')
            FROM (SELECT r.usr, r.item, sum(pu.val * pv.val) - r.rating AS e
                  FROM r JOIN train pu ON pu.kind = 'u' AND pu.id = r.usr
                         JOIN train pv ON pv.kind = 'v' AND pv.id = r.item AND pv.k = pu.k
                  GROUP BY r.usr, r.item, r.rating)), val)
          FROM train WHERE step < {steps})
        SELECT kind, id, k, val FROM train WHERE step = {steps}
        """
    ).to_pylist()
    assert len(got) == (users + items) * k
    for r in got:
        want = want_u if r["kind"] == "u" else want_v
        assert r["val"] == pytest.approx(float(want[r["id"], r["k"]]), rel=1e-9, abs=1e-12)

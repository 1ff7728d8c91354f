"""Derivatives through WITH RECURSIVE checked against JAX's derivatives of
the same loops written in Python. Forward mode: a simulation's sensitivity
to its parameter and initial state, the hypergradient of gradient descent
over a data table, a loop whose steps join a data table, a loop whose stop
depends on the data. Reverse mode: a 64-element tensor state's gradient
with respect to its initial value (with and without checkpointing), and a
data-dependent stop with the mode forced. Tensor states with a number
variable (forward mode carries tensor tangents): a matrix-driven vector
simulation's sensitivity, the hypergradient of a tensor network trained over
a data table."""

import numpy as np
import pytest

import datafusion_grad as dg

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy

RNG = np.random.default_rng(24)


def num(v):
    """`v` as an SQL DOUBLE literal."""
    return f"CAST({float(v)!r} AS DOUBLE)"


def one_row(ctx, sql):
    rows = ctx.sql(sql).to_pylist()
    assert len(rows) == 1, rows
    return rows[0]


def test_logistic_simulation_matches_jax():
    steps, dt = 50, 0.05

    def simulate(a, x0):
        def step(_, x):
            return x + dt * a * x * (1 - x)

        return jax.lax.fori_loop(0, steps, step, x0)

    da, dx0 = jax.grad(simulate, argnums=(0, 1))(2.7, 0.3)
    got = one_row(
        dg.SessionContext(),
        f"""
        WITH RECURSIVE s(step, x, a, x0) AS (
          SELECT 0 AS step, x0 AS x, a, x0 FROM (SELECT 0.3 AS x0, 2.7 AS a) i
          UNION ALL SELECT step + 1, x + {dt} * a * x * (1 - x), a, x0 FROM s WHERE step < {steps})
        SELECT x, grad(x, a) AS da, grad(x, x0) AS dx0 FROM s WHERE step = {steps}
        """,
    )
    assert got["x"] == pytest.approx(float(simulate(2.7, 0.3)), rel=1e-12)
    assert got["da"] == pytest.approx(float(da), rel=1e-9)
    assert got["dx0"] == pytest.approx(float(dx0), rel=1e-9)


def test_hypergradient_of_gradient_descent_over_a_data_table_matches_jax():
    n, steps = 40, 20
    xs = RNG.normal(size=n)
    ys = 1.7 * xs - 0.4 + 0.1 * RNG.normal(size=n)

    def final_loss(lr):
        def step(_, wb):
            w, b = wb
            r = w * xs + b - ys
            return (w - lr * jnp.mean(2 * r * xs), b - lr * jnp.mean(2 * r))

        w, b = jax.lax.fori_loop(0, steps, step, (0.0, 0.0))
        return jnp.mean((w * xs + b - ys) ** 2)

    lr = 0.15
    expected = jax.grad(final_loss)(lr)
    ctx = dg.SessionContext()
    rows = ", ".join(f"({num(x)}, {num(y)})" for x, y in zip(xs, ys))
    ctx.sql(f"CREATE TABLE d(x DOUBLE, y DOUBLE) AS VALUES {rows}").collect()
    loop = f"""
        WITH RECURSIVE p(step, w, b, lr) AS (
          SELECT 0 AS step, CAST(0.0 AS DOUBLE) AS w, CAST(0.0 AS DOUBLE) AS b, {num(lr)} AS lr
          UNION ALL
          SELECT p.step + 1,
                 p.w - p.lr * grad(avg(power(p.w * d.x + p.b - d.y, 2)), p.w),
                 p.b - p.lr * grad(avg(power(p.w * d.x + p.b - d.y, 2)), p.b),
                 p.lr
          FROM p CROSS JOIN d WHERE p.step < {steps} GROUP BY p.step, p.w, p.b, p.lr)
    """
    # the loss at the last step, through an aggregate over the data
    got = one_row(
        ctx,
        loop
        + f"""
        SELECT avg(power(p.w * d.x + p.b - d.y, 2)) AS loss,
               grad(avg(power(p.w * d.x + p.b - d.y, 2)), p.lr) AS dlr
        FROM p CROSS JOIN d WHERE p.step = {steps} GROUP BY p.lr
        """,
    )
    assert got["loss"] == pytest.approx(float(final_loss(lr)), rel=1e-9)
    assert got["dlr"] == pytest.approx(float(expected), rel=1e-8)


def test_loop_whose_steps_join_a_data_table_matches_jax():
    steps, dt = 30, 0.1
    forcing = RNG.normal(size=steps) * 0.3

    def simulate(k, v0):
        x, v = 1.0, v0
        for i in range(steps):
            x, v = x + dt * v, v + dt * (-k * x + forcing[i])
        return x * x + 0.5 * v * v

    dk, dv0 = jax.grad(simulate, argnums=(0, 1))(1.3, 0.2)
    ctx = dg.SessionContext()
    rows = ", ".join(f"({i}, {num(u)})" for i, u in enumerate(forcing))
    ctx.sql(f"CREATE TABLE forcing(step BIGINT, u DOUBLE) AS VALUES {rows}").collect()
    got = one_row(
        ctx,
        f"""
        WITH RECURSIVE s(step, x, v, k, v0) AS (
          SELECT 0 AS step, CAST(1.0 AS DOUBLE) AS x, v0 AS v, k, v0
          FROM (SELECT {num(1.3)} AS k, {num(0.2)} AS v0) i
          UNION ALL
          SELECT s.step + 1, s.x + {dt} * s.v, s.v + {dt} * (-s.k * s.x + f.u), s.k, s.v0
          FROM s JOIN forcing f ON f.step = s.step)
        SELECT grad(x * x + 0.5 * v * v, k) AS dk, grad(x * x + 0.5 * v * v, v0) AS dv0
        FROM s WHERE step = {steps}
        """,
    )
    assert got["dk"] == pytest.approx(float(dk), rel=1e-9)
    assert got["dv0"] == pytest.approx(float(dv0), rel=1e-9)


def run_to_threshold(c, x0):
    """x + c sqrt(x) from x0 until x passes 2.5: the trip count is piecewise
    constant (as jax.lax.while_loop's)."""

    def body(state):
        x, i = state
        return (x + c * jnp.sqrt(x), i + 1)

    return jax.lax.while_loop(lambda state: state[0] < 2.5, body, (x0, 0))[0]


def threshold_derivatives():
    """d/dc and d/dx0 of run_to_threshold at (0.4, 0.7), by JAX (which
    differentiates a while_loop in forward mode only)."""
    return (
        jax.jvp(run_to_threshold, (0.4, 0.7), (1.0, 0.0))[1],
        jax.jvp(run_to_threshold, (0.4, 0.7), (0.0, 1.0))[1],
    )


def test_loop_whose_stop_depends_on_the_data_matches_jax():
    # The threshold read from a table.
    run = run_to_threshold
    dc, dx0 = threshold_derivatives()
    ctx = dg.SessionContext()
    ctx.sql("CREATE TABLE limits(m DOUBLE) AS VALUES (2.5)").collect()
    got = one_row(
        ctx,
        """
        WITH RECURSIVE s(step, x, c, x0) AS (
          SELECT 0 AS step, x0 AS x, c, x0 FROM (SELECT CAST(0.4 AS DOUBLE) AS c, CAST(0.7 AS DOUBLE) AS x0) i
          UNION ALL
          SELECT s.step + 1, s.x + s.c * sqrt(s.x), s.c, s.x0 FROM s JOIN limits l ON s.x < l.m)
        SELECT x, grad(x, c) AS dc, grad(x, x0) AS dx0 FROM s ORDER BY step DESC LIMIT 1
        """,
    )
    assert got["x"] == pytest.approx(float(run(0.4, 0.7)), rel=1e-12)
    assert got["dc"] == pytest.approx(float(dc), rel=1e-9)
    assert got["dx0"] == pytest.approx(float(dx0), rel=1e-9)


def tensor_literal(values):
    return f"tensor([{', '.join(repr(float(v)) for v in values)}], {len(values)})"


@pytest.mark.parametrize("every", [0, 1, 4])
def test_tensor_state_in_reverse_mode_matches_jax(every):
    # 30 residual steps v + 0.1 tanh(v) of a 64-element state; the gradient
    # of the final sum of squares with respect to the initial state (64
    # variables: `auto` takes reverse mode).
    steps = 30
    v0 = RNG.normal(size=64)

    def final(v):
        v = jax.lax.fori_loop(0, steps, lambda _, v: v + 0.1 * jnp.tanh(v), v)
        return jnp.sum(v * v)

    want = np.asarray(jax.grad(final)(jnp.asarray(v0)))
    ctx = dg.SessionContext()
    ctx.sql(f"SET datafusion_grad.checkpoint_every = {every}").collect()
    got = one_row(
        ctx,
        f"""
        WITH RECURSIVE s(step, v, v0) AS (
          SELECT 0, v0 AS v, v0 FROM (SELECT {tensor_literal(v0)} AS v0) i
          UNION ALL
          SELECT step + 1, tensor_add(v, scale(tensor_tanh(v), 0.1)), v0 FROM s WHERE step < {steps})
        SELECT tensor_total(tensor_mul(v, v)) AS loss, grad(tensor_total(tensor_mul(v, v)), v0) AS g
        FROM s WHERE step = {steps}
        """,
    )
    assert got["loss"] == pytest.approx(float(final(jnp.asarray(v0))), rel=1e-12)
    np.testing.assert_allclose(np.asarray(got["g"], dtype=float), want, rtol=1e-10, atol=1e-12)


def matrix_literal(m):
    rows, cols = m.shape
    return f"tensor([{', '.join(repr(float(v)) for v in m.ravel())}], {rows}, {cols})"


@pytest.mark.parametrize("mode", ["auto", "forward", "reverse"])
def test_matrix_variable_at_every_row_matches_jax(mode):
    # A 2x2 matrix squared and damped until its norm is small (a
    # data-dependent stop); the gradient of each row's sum of squares with
    # respect to the initial matrix, at every row. `auto` takes forward mode
    # (4 directions, every row asks), which carries a tangent per element.
    m0 = np.array([[0.9, 0.2], [-0.3, 0.8]])

    def trajectory():
        m, out = jnp.asarray(m0), [jnp.asarray(m0)]
        while float(jnp.sum(m * m)) > 0.05 and len(out) <= 20:
            m = 0.9 * (m @ m)
            out.append(m)
        return len(out)

    def loss(m, k):
        for _ in range(k):
            m = 0.9 * (m @ m)
        return jnp.sum(m * m)

    rows = dg.SessionContext()
    rows.sql(f"SET datafusion_grad.recursion_mode = '{mode}'").collect()
    got = rows.sql(
        f"""
        WITH RECURSIVE s(step, m, m0) AS (
          SELECT 0, m0 AS m, m0 FROM (SELECT {matrix_literal(m0)} AS m0) i
          UNION ALL SELECT step + 1, scale(matmul(m, m), 0.9), m0 FROM s
          WHERE tensor_total(tensor_mul(m, m)) > 0.05 AND step < 20)
        SELECT step, grad(tensor_total(tensor_mul(m, m)), m0) AS g FROM s ORDER BY step
        """
    ).to_pylist()
    assert len(got) == trajectory()
    for row in got:
        want = np.asarray(jax.grad(loss)(jnp.asarray(m0), row["step"]))
        np.testing.assert_allclose(np.asarray(row["g"], dtype=float), want, rtol=1e-12)


def test_jvp_and_vjp_of_a_vector_variable_at_every_row_match_jax():
    # jvp along a tensor tangent and a number's tangent together (forward
    # mode: one call, several variables), vjp with a tensor cotangent.
    def run(v0, a, k):
        v = v0
        for _ in range(k):
            v = v + 0.5 * jnp.tanh(a * v)
        return v

    v0, a = jnp.array([0.5, -0.2, 0.1]), 0.3
    t, u = jnp.array([1.0, 2.0, -1.0]), jnp.array([0.3, -1.0, 2.0])
    got = dg.SessionContext().sql(
        f"""
        WITH RECURSIVE s(step, v, v0, a) AS (
          SELECT 0, v0 AS v, v0, {num(a)} FROM (SELECT {tensor_literal(v0)} AS v0) i
          UNION ALL SELECT step + 1, tensor_add(v, scale(tensor_tanh(scale(v, a)), 0.5)), v0, a
          FROM s WHERE step < 6)
        SELECT step, jvp(norm(v), v0, {tensor_literal(t)}, a, 0.5) AS j,
               vjp(v, v0, {tensor_literal(u)}) AS u FROM s ORDER BY step
        """
    ).to_pylist()
    assert [r["step"] for r in got] == list(range(7))
    for row in got:
        k = row["step"]
        _, j = jax.jvp(lambda v, b: jnp.linalg.norm(run(v, b, k)), (v0, a), (t, 0.5))
        _, back = jax.vjp(lambda v: run(v, a, k), v0)
        assert row["j"] == pytest.approx(float(j), rel=1e-12)
        np.testing.assert_allclose(np.asarray(row["u"], dtype=float), back(u)[0], rtol=1e-12)


@pytest.mark.parametrize("mode", ["auto", "forward", "reverse"])
def test_tensor_state_sensitivity_to_a_number_matches_jax(mode):
    # A vector state driven by a matrix, v + dt·k·tanh(A v): the sensitivity
    # of the final state to the number k (one variable: `auto` takes
    # forward mode, whose tangent is a vector of the state's shape).
    steps, dt = 25, 0.1
    a = RNG.normal(size=(6, 6))
    v0 = RNG.normal(size=6)

    def final(k):
        step = lambda _, v: v + dt * k * jnp.tanh(jnp.asarray(a) @ v)
        return jax.lax.fori_loop(0, steps, step, jnp.asarray(v0))

    k = 0.8
    want_grad = jax.grad(lambda k: jnp.sum(final(k) ** 2))(k)
    want_jvp = np.asarray(jax.jvp(final, (k,), (1.5,))[1])
    ctx = dg.SessionContext()
    ctx.sql(f"SET datafusion_grad.recursion_mode = '{mode}'").collect()
    select = "grad(tensor_total(tensor_mul(v, v)), k) AS g"
    if mode != "reverse":  # reverse mode differentiates number-valued f
        select += ", jvp(v, k, 1.5) AS t"
    got = one_row(
        ctx,
        f"""
        WITH RECURSIVE s(step, v, k) AS (
          SELECT 0, {tensor_literal(v0)}, {num(k)}
          UNION ALL
          SELECT step + 1, tensor_add(v, scale(tensor_tanh(matvec({matrix_literal(a)}, v)), {dt} * k)), k
          FROM s WHERE step < {steps})
        SELECT {select} FROM s WHERE step = {steps}
        """,
    )
    assert got["g"] == pytest.approx(float(want_grad), rel=1e-9)
    if mode != "reverse":
        np.testing.assert_allclose(np.asarray(got["t"], dtype=float), want_jvp, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("form", ["per_row", "key"])
def test_hypergradient_of_a_tensor_network_trained_over_a_data_table_matches_jax(form):
    # 15 gradient-descent steps of a one-hidden-layer tanh network whose
    # weights are a matrix and a vector (tensor columns), the gradient
    # taken through tensor_avg over the data; the hypergradient of the
    # final loss with respect to the learning rate, in forward mode
    # (second derivatives through tensor_avg, matvec, tanh and dot).
    n, steps, hidden, features = 30, 15, 4, 3
    xs = RNG.normal(size=(n, features))
    ys = np.sin(xs @ np.array([1.0, -0.5, 0.3]))
    w0 = 0.5 * RNG.normal(size=(hidden, features))
    v0 = 0.5 * RNG.normal(size=hidden)

    def loss(w, v):
        return jnp.mean((jnp.tanh(jnp.asarray(xs) @ w.T) @ v - jnp.asarray(ys)) ** 2)

    def final_loss(lr):
        def step(_, wv):
            gw, gv = jax.grad(loss, argnums=(0, 1))(*wv)
            return (wv[0] - lr * gw, wv[1] - lr * gv)

        return loss(*jax.lax.fori_loop(0, steps, step, (jnp.asarray(w0), jnp.asarray(v0))))

    lr = 0.3
    ctx = dg.SessionContext()
    rows = " UNION ALL ".join(
        f"SELECT {tensor_literal(x)} AS x, {num(y)} AS y" for x, y in zip(xs, ys)
    )
    ctx.sql(f"CREATE TABLE d AS {rows}").collect()
    row_loss = "power(dot(v, tensor_tanh(matvec(w, x))) - y, 2)"
    # the step's gradient as the average of the rows' gradients, or as the
    # gradient of the average with respect to the tensor GROUP BY key
    step_grad = {
        "per_row": lambda k: f"tensor_avg(grad({row_loss}, {k}))",
        "key": lambda k: f"grad(avg({row_loss}), {k})",
    }[form]
    got = one_row(
        ctx,
        f"""
        WITH RECURSIVE p(step, w, v, lr) AS (
          SELECT 0, {matrix_literal(w0)}, {tensor_literal(v0)}, {num(lr)}
          UNION ALL
          SELECT step + 1, tensor_sub(w, scale({step_grad("w")}, lr)),
                 tensor_sub(v, scale({step_grad("v")}, lr)), lr
          FROM p CROSS JOIN d WHERE step < {steps} GROUP BY step, w, v, lr)
        SELECT avg({row_loss}) AS loss, grad(avg({row_loss}), lr) AS dlr
        FROM p CROSS JOIN d WHERE step = {steps} GROUP BY lr
        """,
    )
    assert got["loss"] == pytest.approx(float(final_loss(lr)), rel=1e-10)
    assert got["dlr"] == pytest.approx(float(jax.grad(final_loss)(lr)), rel=1e-8)


@pytest.mark.parametrize("variable", ["w0", "lr"])
@pytest.mark.parametrize("hidden, mode", [(2, "auto"), (2, "reverse"), (6, "auto")])
def test_meta_gradient_of_a_training_loop_matches_jax(variable, hidden, mode):
    # 12 steps of w <- w - lr * avg(grad(loss, w)) over a data table, with w
    # a (hidden)x3 matrix of a tanh network and lr a per-parameter learning
    # rate (a matrix too); the gradient of the validation loss after the
    # loop with respect to the initial weights, or to the learning rates
    # (issue 48). 6 elements: `auto` takes forward mode through the
    # aggregating step, `reverse` the backward recursion; 18 elements:
    # `auto` takes reverse mode.
    n, steps = 25, 12
    xs, vxs = RNG.normal(size=(n, 3)), RNG.normal(size=(10, 3))
    ys, vys = np.sin(xs @ [1.0, -0.5, 0.3]), np.sin(vxs @ [1.0, -0.5, 0.3])
    w0 = 0.5 * RNG.normal(size=(hidden, 3))
    lr0 = 0.2 + 0.3 * RNG.random(size=(hidden, 3))

    def loss(w, x, y):
        return jnp.mean((jnp.sum(jnp.tanh(jnp.asarray(x) @ w.T), axis=1) - jnp.asarray(y)) ** 2)

    def valid_loss(w0, lr):
        def step(_, w):
            return w - lr * jax.grad(loss)(w, xs, ys)

        return loss(jax.lax.fori_loop(0, steps, step, w0), vxs, vys)

    want = jax.grad(valid_loss, argnums=0 if variable == "w0" else 1)(
        jnp.asarray(w0), jnp.asarray(lr0)
    )
    ctx = dg.SessionContext()
    ctx.sql(f"SET datafusion_grad.recursion_mode = '{mode}'").collect()
    for name, (x, y) in {"tr": (xs, ys), "va": (vxs, vys)}.items():
        rows = " UNION ALL ".join(
            f"SELECT {tensor_literal(a)} AS x, {num(b)} AS y" for a, b in zip(x, y)
        )
        ctx.sql(f"CREATE TABLE {name} AS {rows}").collect()
    row_loss = "power(tensor_total(tensor_tanh(matvec(w, {x}))) - {y}, 2)"
    got = one_row(
        ctx,
        f"""
        WITH RECURSIVE train(step, w, w0, lr) AS (
          SELECT 0, w0 AS w, w0, lr FROM (SELECT {matrix_literal(w0)} AS w0, {matrix_literal(lr0)} AS lr) i
          UNION ALL
          SELECT step + 1,
                 tensor_sub(w, tensor_mul(lr, tensor_avg(grad({row_loss.format(x="tr.x", y="tr.y")}, w)))),
                 w0, lr
          FROM train CROSS JOIN tr WHERE step < {steps} GROUP BY step, w, w0, lr)
        SELECT grad(avg({row_loss.format(x="va.x", y="va.y")}), {variable}) AS g
        FROM train CROSS JOIN va WHERE step = {steps} GROUP BY {variable}
        """,
    )
    assert np.asarray(got["g"]) == pytest.approx(np.asarray(want), rel=1e-8, abs=1e-12)


def test_gradients_at_several_iterations_of_a_training_loop_match_jax():
    # Reverse mode through an aggregating step, the derivative asked for at
    # some rows of a SELECT list (each its own backward pass) and summed
    # over rows of several iterations in an aggregate (one pass from each).
    n, steps = 20, 9
    xs = RNG.normal(size=(n, 5))
    ys = np.tanh(xs @ [0.5, -1.0, 0.25, 0.0, 1.0])
    w0 = 0.3 * RNG.normal(size=5)

    def run(w0, k):
        def step(_, w):
            return w - 0.4 * jax.grad(
                lambda w: jnp.mean((jnp.tanh(jnp.asarray(xs) @ w) - jnp.asarray(ys)) ** 2)
            )(w)

        return jax.lax.fori_loop(0, k, step, w0)

    def want(k):
        return np.asarray(jax.grad(lambda w: jnp.sum(run(w, k) ** 3))(jnp.asarray(w0)))

    ctx = dg.SessionContext()
    ctx.sql("SET datafusion_grad.recursion_mode = 'reverse'").collect()
    rows = " UNION ALL ".join(f"SELECT {tensor_literal(a)} AS x, {num(b)} AS y" for a, b in zip(xs, ys))
    ctx.sql(f"CREATE TABLE d AS {rows}").collect()
    loop = f"""
        WITH RECURSIVE train(step, w, w0) AS (
          SELECT 0, w0 AS w, w0 FROM (SELECT {tensor_literal(w0)} AS w0) i
          UNION ALL
          SELECT step + 1, tensor_sub(w, scale(tensor_avg(grad(power(tanh(dot(w, x)) - y, 2), w)), 0.4)), w0
          FROM train CROSS JOIN d WHERE step < {steps} GROUP BY step, w, w0)"""
    f = "grad(tensor_total(tensor_mul(tensor_mul(w, w), w)), w0)"
    got = ctx.sql(f"{loop} SELECT step, {f} AS g FROM train WHERE step IN (0, 4, {steps}) ORDER BY step").to_pylist()
    assert [r["step"] for r in got] == [0, 4, steps]
    for r in got:
        assert np.asarray(r["g"]) == pytest.approx(want(r["step"]), rel=1e-9, abs=1e-12)
    total = one_row(ctx, f"{loop} SELECT tensor_sum({f}) AS g FROM train WHERE step >= 7")
    assert np.asarray(total["g"]) == pytest.approx(
        sum(want(k) for k in range(7, steps + 1)), rel=1e-9, abs=1e-12
    )


def test_meta_gradient_of_a_network_matches_jax():
    # Issue 48, 3: a tanh/softmax network (w1 3x4, b1, w2 4x3, b2) trained
    # by one grad(cross_entropy(...), w1, b1, w2, b2) per batch, averaged
    # over two batches, 6 steps; the gradient of the held-out batch's loss
    # with respect to the initial first layer, in reverse mode.
    batches, n, d, h, c, steps, lr = 2, 8, 3, 4, 3, 6, 0.5
    x = np.round(RNG.uniform(-1, 1, (batches + 1, n, d)), 3)
    y = (np.arange((batches + 1) * n) % c).reshape(batches + 1, n).astype(float)
    w1, w2 = RNG.uniform(-0.5, 0.5, (d, h)), RNG.uniform(-0.5, 0.5, (h, c))

    def model(p, x):
        return jnp.tanh(x @ p[0] + p[1]) @ p[2] + p[3]

    def loss(p, b):
        logits = model(p, jnp.asarray(x[b]))
        lse = jax.scipy.special.logsumexp(logits, axis=1)
        return jnp.mean(lse - logits[jnp.arange(n), y[b].astype(int)])

    def held_out(w1_0):
        p = (w1_0, jnp.zeros(h), jnp.asarray(w2), jnp.zeros(c))
        for _ in range(steps):
            g = [jax.grad(loss)(p, b) for b in range(batches)]
            p = tuple(pk - lr * sum(gb[k] for gb in g) / batches for k, pk in enumerate(p))
        return loss(p, batches)

    want = np.asarray(jax.grad(held_out)(jnp.asarray(w1)))
    ctx = dg.SessionContext()
    ctx.sql("SET datafusion_grad.recursion_mode = 'reverse'").collect()
    rows = " UNION ALL ".join(
        f"SELECT {b} AS batch, {matrix_literal(x[b])} AS x, {tensor_literal(y[b])} AS y"
        for b in range(batches + 1)
    )
    ctx.sql(f"CREATE TABLE batches AS {rows}").collect()
    logits = "tensor_add(matmul(tensor_tanh(tensor_add(matmul(x, w1), b1)), w2), b2)"
    got = one_row(
        ctx,
        f"""
        WITH RECURSIVE train(step, w1, b1, w2, b2, w1_0) AS (
          SELECT 0, w1_0 AS w1, {tensor_literal(np.zeros(h))}, {matrix_literal(w2)},
                 {tensor_literal(np.zeros(c))}, w1_0
          FROM (SELECT {matrix_literal(w1)} AS w1_0) i
          UNION ALL
          SELECT step + 1,
                 tensor_sub(w1, scale(tensor_avg(g['w1']), {lr})),
                 tensor_sub(b1, scale(tensor_avg(g['b1']), {lr})),
                 tensor_sub(w2, scale(tensor_avg(g['w2']), {lr})),
                 tensor_sub(b2, scale(tensor_avg(g['b2']), {lr})), w1_0
          FROM (SELECT step, w1, b1, w2, b2, w1_0, grad(cross_entropy({logits}, y), w1, b1, w2, b2) AS g
                FROM train CROSS JOIN batches WHERE step < {steps} AND batch < {batches})
          GROUP BY step, w1, b1, w2, b2, w1_0)
        SELECT grad(cross_entropy({logits}, y), w1_0) AS g
        FROM train CROSS JOIN batches WHERE step = {steps} AND batch = {batches}
        """,
    )
    assert np.asarray(got["g"]) == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_data_dependent_stop_in_reverse_mode_matches_jax():
    run = run_to_threshold
    dc, dx0 = threshold_derivatives()
    ctx = dg.SessionContext()
    ctx.sql("SET datafusion_grad.recursion_mode = 'reverse'").collect()
    got = one_row(
        ctx,
        """
        WITH RECURSIVE s(step, x, c, x0) AS (
          SELECT 0 AS step, x0 AS x, c, x0 FROM (SELECT CAST(0.4 AS DOUBLE) AS c, CAST(0.7 AS DOUBLE) AS x0) i
          UNION ALL
          SELECT step + 1, x + c * sqrt(x), c, x0 FROM s WHERE x < 2.5)
        SELECT x, grad(x, c) AS dc, grad(x, x0) AS dx0 FROM s ORDER BY step DESC LIMIT 1
        """,
    )
    assert got["x"] == pytest.approx(float(run(0.4, 0.7)), rel=1e-12)
    assert got["dc"] == pytest.approx(float(dc), rel=1e-9)
    assert got["dx0"] == pytest.approx(float(dx0), rel=1e-9)


def test_progress_callback_sees_every_iteration_and_the_limit_is_typed():
    ctx = dg.SessionContext()
    seen = []
    ctx.set_progress(seen.append)
    loop = "WITH RECURSIVE r(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM r WHERE n < 25) SELECT max(n) AS m FROM r"
    assert ctx.sql(loop).to_pydict() == {"m": [25]}
    assert seen == list(range(1, 27))
    ctx.set_progress(None)
    ctx.sql("SET datafusion_grad.max_iterations = 5").collect()
    with pytest.raises(dg.errors.IterationLimitError, match="after 5 iterations"):
        ctx.sql(loop).collect()
    assert len(seen) == 26


def test_progress_as_a_tqdm_bar(capsys):
    pytest.importorskip("tqdm")
    ctx = dg.SessionContext()
    ctx.set_progress("tqdm")
    loop = "WITH RECURSIVE r(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM r WHERE n < 25) SELECT max(n) AS m FROM r"
    assert ctx.sql(loop).to_pydict() == {"m": [25]}
    assert ctx.sql(loop).to_pydict() == {"m": [25]}
    err = capsys.readouterr().err
    assert "recursive query" in err and "26" in err and "rows=25" in err
    with pytest.raises(ValueError, match="'tqdm' or None"):
        ctx.set_progress("bar")


@pytest.mark.parametrize("form", ["scalar", "from"])
@pytest.mark.parametrize("last", [1, 3])
def test_value_of_each_training_row_through_a_training_loop_matches_jax(form, last):
    # Relational reverse mode through a training loop: a 2x3 tanh network
    # trained by 10 steps of weighted descent (w <- w - lr * sum(wt * grad)
    # / sum(wt)) over 20 rows; the derivative of the validation loss with
    # respect to every row's weight, the loss read at the last iteration or
    # averaged over the last three (three backward passes).
    n, steps, hidden = 20, 10, 2
    xs, vxs = RNG.normal(size=(n, 3)), RNG.normal(size=(8, 3))
    ys, vys = np.sin(xs @ [1.0, -0.5, 0.3]), np.sin(vxs @ [1.0, -0.5, 0.3])
    wts = 0.5 + RNG.random(size=n)
    w0 = 0.5 * RNG.normal(size=(hidden, 3))

    def loss(w, x, y, weights):
        err = (jnp.sum(jnp.tanh(jnp.asarray(x) @ w.T), axis=1) - jnp.asarray(y)) ** 2
        return jnp.sum(weights * err) / jnp.sum(weights)

    def valid_loss(weights):
        w, total = jnp.asarray(w0), 0.0
        for k in range(1, steps + 1):
            w = w - 0.3 * jax.grad(loss)(w, xs, ys, weights)
            if k > steps - last:
                total = total + loss(w, vxs, vys, jnp.ones(len(vys)))
        return total / last

    want = jax.grad(valid_loss)(jnp.asarray(wts))
    ctx = dg.SessionContext()
    rows = " UNION ALL ".join(
        f"SELECT {i} AS i, {tensor_literal(a)} AS x, {num(b)} AS y, {num(c)} AS wt"
        for i, (a, b, c) in enumerate(zip(xs, ys, wts))
    )
    ctx.sql(f"CREATE TABLE tr AS {rows}").collect()
    rows = " UNION ALL ".join(
        f"SELECT {tensor_literal(a)} AS x, {num(b)} AS y" for a, b in zip(vxs, vys)
    )
    ctx.sql(f"CREATE TABLE va AS {rows}").collect()
    row_loss = "power(tensor_total(tensor_tanh(matvec(w, {x}))) - {y}, 2)"
    loop = f"""
        WITH RECURSIVE train(step, w) AS (
          SELECT 0, {matrix_literal(w0)}
          UNION ALL
          SELECT step + 1,
                 tensor_sub(w, scale(tensor_sum(scale(grad({row_loss.format(x="tr.x", y="tr.y")}, w), tr.wt)),
                                     0.3 / sum(tr.wt)))
          FROM train CROSS JOIN tr WHERE step < {steps} GROUP BY step, w),
        loss AS (SELECT avg({row_loss.format(x="va.x", y="va.y")}) AS loss
                 FROM train CROSS JOIN va WHERE step > {steps - last})
    """
    query = {
        "scalar": "SELECT i, grad((SELECT loss FROM loss), tr.wt) AS g FROM tr ORDER BY i",
        "from": "SELECT i, wt AS g FROM grad(loss, tr.wt) ORDER BY i",
    }[form]
    got = [r["g"] for r in ctx.sql(loop + query).to_pylist()]
    assert np.asarray(got) == pytest.approx(np.asarray(want), rel=1e-8, abs=1e-12)


@pytest.mark.parametrize("stock", [False, True])
def test_hypergradient_of_the_relational_training_loop_matches_jax(stock):
    """The README's relational loop (the parameter rows in the work table,
    read again by the loss subquery whose gradient each step takes): the
    learning rate's hypergradient per row and through an aggregate, and the
    value of each data row's y to the final loss (relational reverse mode
    through the loop), in our session and in the stock datafusion package
    through install."""
    groups, n, steps, lr = 4, 30, 12, 0.01
    g = RNG.integers(1, groups + 1, size=n)
    xs = RNG.normal(size=n)
    ys = 0.5 * g * xs + 0.1 * RNG.normal(size=n)

    def train(lr, ys=ys):
        def loss(w):
            return jnp.sum((xs * w[g - 1] - ys) ** 2) + 0.1 * (jnp.mean(w[g - 1]) - 1.0) ** 2

        def step(_, w):
            return w - lr * jax.grad(loss)(w)

        return jax.lax.fori_loop(0, steps, step, jnp.zeros(groups))

    w = train(lr)
    dw = jax.jacfwd(train)(lr)
    target = 0.5 * jnp.arange(1, groups + 1)
    dloss = jax.grad(lambda lr: jnp.mean((train(lr) - target) ** 2))(lr)
    dys = jax.grad(lambda ys: jnp.mean((train(lr, ys) - target) ** 2))(ys)
    if stock:
        datafusion = pytest.importorskip("datafusion")
        ctx = dg.install(datafusion.SessionContext())
    else:
        ctx = dg.SessionContext()
    rows = ", ".join(
        f"({i}, {int(k)}, {num(x)}, {num(y)})" for i, (k, x, y) in enumerate(zip(g, xs, ys))
    )
    ctx.sql(f"CREATE TABLE d(i INT, g INT, x DOUBLE, y DOUBLE) AS VALUES {rows}").collect()
    loop = f"""
        WITH RECURSIVE train(step, g, w, lr) AS (
          SELECT 0, g, CAST(0.0 AS DOUBLE), {num(lr)} FROM (SELECT DISTINCT g FROM d) t
          UNION ALL
          SELECT step + 1, g,
                 w - lr * grad((SELECT sum(power(d.x * p.w - d.y, 2)) + 0.1 * power(avg(p.w) - 1.0, 2)
                                FROM d JOIN train p ON p.g = d.g), w),
                 lr
          FROM train WHERE step < {steps})
    """
    got = ctx.sql(
        loop + f"SELECT g, w, grad(w, lr) AS dw FROM train WHERE step = {steps} ORDER BY g"
    ).to_pylist()
    assert [r["g"] for r in got] == list(range(1, groups + 1))
    for r in got:
        assert r["w"] == pytest.approx(float(w[r["g"] - 1]), rel=1e-10)
        assert r["dw"] == pytest.approx(float(dw[r["g"] - 1]), rel=1e-8)
    agg = ctx.sql(
        loop
        + f"SELECT grad(avg(power(w - 0.5 * g, 2)), lr) AS h FROM train WHERE step = {steps} GROUP BY lr"
    ).to_pylist()
    assert agg[0]["h"] == pytest.approx(float(dloss), rel=1e-8)
    valued = ctx.sql(
        loop
        + f""", loss AS (SELECT avg(power(w - 0.5 * g, 2)) AS loss FROM train WHERE step = {steps})
        SELECT d.i, grad((SELECT loss FROM loss), d.y) AS v FROM d ORDER BY d.i"""
    ).to_pylist()
    assert [r["i"] for r in valued] == list(range(n))
    got = np.asarray([r["v"] for r in valued])
    assert got == pytest.approx(np.asarray(dys), rel=1e-8, abs=1e-14)

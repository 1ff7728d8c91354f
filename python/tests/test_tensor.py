"""Tensor columns from NumPy: values, gradients and a training step, checked
against NumPy."""

import numpy as np
import pyarrow as pa
import pytest

import datafusion_grad as dg


def test_round_trip_vectors_and_matrices():
    v = np.array([[1.0, 2.0, 3.0], [-1.0, 0.5, 2.0]])
    m = np.arange(12.0).reshape(2, 2, 3)
    assert dg.tensor.to_arrow(v).type == pa.list_(pa.float64(), 3)
    np.testing.assert_array_equal(dg.tensor.to_numpy(dg.tensor.to_arrow(v)), v)
    np.testing.assert_array_equal(dg.tensor.to_numpy(dg.tensor.to_arrow(m)), m)
    with pytest.raises(ValueError, match="shape"):
        dg.tensor.to_arrow(np.zeros(3))
    with pytest.raises(ValueError, match="not a tensor column"):
        dg.tensor.to_numpy(pa.array([1.0]))


def test_gradient_of_a_linear_layer_matches_numpy():
    rng = np.random.default_rng(3)
    w = rng.normal(size=(4, 3, 5))  # one 3x5 weight matrix per row
    x = rng.normal(size=(4, 5))
    labels = np.array([0.0, 2.0, 1.0, 2.0])
    ctx = dg.SessionContext()
    ctx.register_arrow(
        "t",
        pa.table({"w": dg.tensor.to_arrow(w), "x": dg.tensor.to_arrow(x), "label": labels}),
    )
    out = ctx.sql(
        "SELECT cross_entropy(matvec(w, x), label) AS loss, "
        "grad(cross_entropy(matvec(w, x), label), w) AS g FROM t"
    ).to_arrow_table()
    g = dg.tensor.to_numpy(out["g"])
    z = np.einsum("rij,rj->ri", w, x)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    loss = -np.log(p[np.arange(4), labels.astype(int)])
    np.testing.assert_allclose(out["loss"].to_numpy(), loss, rtol=1e-12)
    p[np.arange(4), labels.astype(int)] -= 1.0
    np.testing.assert_allclose(g, np.einsum("ri,rj->rij", p, x), rtol=1e-12, atol=1e-15)


def test_training_step_in_one_query_decreases_the_loss():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(1, 64, 8))  # one batch of 64 samples
    y = (x[0] @ rng.normal(size=(8, 3))).argmax(axis=1).astype(float)
    ctx = dg.SessionContext()
    ctx.register_arrow(
        "data", pa.table({"x": dg.tensor.to_arrow(x), "y": dg.tensor.to_arrow(y[None, :])})
    )
    rows = ctx.sql(
        "WITH RECURSIVE fit(step, w) AS ("
        "  SELECT 0, scale(random_tensor(1, 8, 3), 0.1)"
        "  UNION ALL"
        "  SELECT step + 1, tensor_sub(w, scale(grad(cross_entropy(matmul(x, w), y), w), 0.5))"
        "  FROM fit CROSS JOIN data WHERE step < 30)"
        "SELECT step, cross_entropy(matmul(x, w), y) AS loss FROM fit CROSS JOIN data ORDER BY step"
    ).to_pydict()
    assert rows["step"] == list(range(31))
    assert rows["loss"][-1] < 0.5 * rows["loss"][0]

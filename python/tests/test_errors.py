"""Every error kind arrives as its own exception class, message intact,
picklable."""

import pickle

import pytest

import datafusion_grad as dg
from datafusion_grad import errors


@pytest.fixture
def ctx():
    ctx = dg.SessionContext()
    ctx.sql(
        "CREATE TABLE t(x DOUBLE, w DOUBLE, s VARCHAR) AS VALUES (2.0, 1.0, 'ab'), (-0.5, 3.0, 'c')"
    ).collect()
    return ctx


CASES = [
    (errors.NonDifferentiableError, "SELECT grad(x * random(), x) FROM t", "random"),
    (errors.InvalidWrtError, "SELECT grad(x * x, x + 1) FROM t", "t.x + "),
    (errors.WrongArityError, "SELECT grad(x) FROM t", "got 1 argument"),
    (errors.UnsupportedTypeError, "SELECT grad(x * x, s) FROM t", "Utf8"),
    (
        errors.NeedsPlanContextError,
        "SELECT grad(avg(x) OVER (ORDER BY w) * w, w) FROM t",
        "PARTITION BY",
    ),
    (
        errors.ShapeMismatchError,
        "SELECT dot(tensor([x, w], 2), tensor([x, w, x], 3)) FROM t",
        "vector[2]",
    ),
    (
        errors.InvalidTensorError,
        "SELECT cross_entropy(tensor([x, w], 2), 7) FROM t",
        "label 7",
    ),
]


@pytest.mark.parametrize(("cls", "sql", "piece"), CASES, ids=[c[0].__name__ for c in CASES])
def test_kind_class_and_message(ctx, cls, sql, piece):
    with pytest.raises(cls) as raised:
        ctx.sql(sql).collect()
    err = raised.value
    assert isinstance(err, dg.GradError) and isinstance(err, dg.DataFusionGradError)
    assert f"[{cls.kind}]" in str(err)
    assert piece in str(err)
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is cls and str(again) == str(err)


def test_unexportable(ctx):
    with pytest.raises(errors.UnexportableError, match="klingon"):
        ctx.rewrite_sql("SELECT grad(x * x, x) FROM t", "klingon")
    with pytest.raises(errors.UnexportableError, match="profile"):
        ctx.to_substrait("SELECT grad(x * x, x) FROM t", "nonsense")
    with pytest.raises(errors.UnexportableError):
        ctx.to_substrait("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT n FROM r")


def test_derivative_too_large():
    ctx = dg.SessionContext()
    names = [f"c{i}" for i in range(1200)]
    ctx.from_pydict({n: [1.0] for n in names}, name="wide")
    product = " * ".join(names)
    with pytest.raises(errors.DerivativeTooLargeError):
        ctx.sql(f"SELECT grad({product}, {', '.join(names)}) FROM wide").collect()


def test_other_errors_are_query_errors(ctx):
    with pytest.raises(errors.QueryError, match="nope"):
        ctx.sql("SELECT * FROM nope").collect()
    with pytest.raises(errors.QueryError):
        ctx.sql("SELEC 1")
    err = pickle.loads(pickle.dumps(errors.QueryError("m")))
    assert str(err) == "m"


def test_hierarchy():
    kinds = {cls.kind for cls in errors._BY_KIND.values()}
    assert kinds == {
        "non_differentiable",
        "invalid_wrt",
        "wrong_arity",
        "needs_plan_context",
        "marker_reached_execution",
        "unsupported_type",
        "derivative_too_large",
        "unexportable",
        "shape_mismatch",
        "invalid_tensor",
        "device_unavailable",
        "cluster_timeout",
        "iteration_limit",
    }
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.DataFusionGradError)
    assert errors._from_kind("something_new", "m").__class__ is errors.GradError

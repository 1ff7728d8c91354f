"""Exceptions raised by datafusion_grad.

Every error is a :class:`DataFusionGradError`. Differentiation errors are
:class:`GradError` subclasses, one per stable kind of the Rust
``datafusion_grad::ErrorKind`` (the ``kind`` attribute holds its name); any
other planning or execution error is a :class:`QueryError`;
:class:`IncompatibleDataFusionError` (Python only) refuses a stock
``datafusion`` package of another major version. All of them keep the
engine's message intact and pickle.

>>> import datafusion_grad as dg
>>> try:
...     dg.differentiate_sql("upper(x)", "x")
... except dg.errors.NonDifferentiableError as e:
...     print(e.kind)
non_differentiable
"""

from __future__ import annotations


class DataFusionGradError(Exception):
    """Base class of every exception raised by datafusion_grad."""


class QueryError(DataFusionGradError):
    """A planning or execution error that is not about differentiation
    (SQL syntax, unknown table, type mismatch, I/O, ...)."""


class IncompatibleDataFusionError(DataFusionGradError):
    """The stock ``datafusion`` package (datafusion-python) handed to
    :func:`datafusion_grad.install` or :class:`datafusion_grad.GradExtension`
    has another major version than the one datafusion_grad is built against.
    The FFI structs differ between majors, so the check runs before anything
    crosses the FFI boundary: this error instead of a crash. Raised by the
    Python package only (no Rust ErrorKind). ``found`` is the caller's
    version, ``expected`` the DataFusion version we are built against.

    Tables and results still move between the two through Arrow streams
    (:meth:`datafusion_grad.SessionContext.register_arrow`, and the stock
    ``SessionContext.from_arrow`` for our DataFrames)."""

    def __init__(self, found: str, expected: str) -> None:
        self.found = found
        self.expected = expected
        major = expected.split(".")[0]
        super().__init__(
            f"datafusion {found} is not supported: datafusion_grad is built against "
            f"DataFusion {expected} (datafusion-python {major}.*), and the FFI structs "
            "of different major versions differ, so plugging into this session would "
            "crash the process. Install the matching version "
            f'(pip install "datafusion=={major}.*"), or keep datafusion {found} '
            "(e.g. for xarray-sql) and move data through Arrow streams: "
            "datafusion_grad.SessionContext().register_arrow(name, their_dataframe) "
            "takes their tables and results, and their_ctx.from_arrow(our_dataframe) "
            "takes ours back"
        )

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return (type(self), (self.found, self.expected))


class GradError(DataFusionGradError):
    """A differentiation error; ``kind`` names the Rust ErrorKind."""

    kind: str = "grad"


class NonDifferentiableError(GradError):
    """A function has no derivative rule (``random()``, string functions,
    an unknown UDF without a registered rule, a volatile function)."""

    kind = "non_differentiable"


class InvalidWrtError(GradError):
    """The variable to differentiate by is not a column of the input."""

    kind = "invalid_wrt"


class WrongArityError(GradError):
    """grad/jvp/vjp called with the wrong number of arguments."""

    kind = "wrong_arity"


class NeedsPlanContextError(GradError):
    """The derivative needs plan context the rewrite does not have (e.g. the
    variable varies within an aggregate's group)."""

    kind = "needs_plan_context"


class MarkerReachedExecutionError(GradError):
    """A grad/jvp/vjp call reached execution without being rewritten (e.g. a
    stock datafusion session without :func:`datafusion_grad.install`)."""

    kind = "marker_reached_execution"


class UnsupportedTypeError(GradError):
    """An argument has a type that cannot be differentiated."""

    kind = "unsupported_type"


class DerivativeTooLargeError(GradError):
    """The derivative would exceed the engine's size limits."""

    kind = "derivative_too_large"


class UnexportableError(GradError):
    """The query cannot be written in the requested SQL dialect or Substrait
    profile."""

    kind = "unexportable"


class ShapeMismatchError(GradError):
    """Tensor arguments have shapes a function cannot combine."""

    kind = "shape_mismatch"


class InvalidTensorError(GradError):
    """A tensor holds a NULL element, or a label outside the logits' range."""

    kind = "invalid_tensor"


class DeviceUnavailableError(GradError):
    """``datafusion_grad.tensor_device = 'gpu'`` was set, but no GPU can be
    used: a build without the ``cuda`` feature, or no CUDA driver or device."""

    kind = "device_unavailable"


class ClusterTimeoutError(GradError):
    """A Ballista cluster gave no answer within
    ``datafusion_grad.ballista_timeout_seconds`` (e.g. it lost its
    executors)."""

    kind = "cluster_timeout"


class IterationLimitError(GradError):
    """A recursive query still produced rows after
    ``datafusion_grad.max_iterations`` iterations (a stop condition never
    met)."""

    kind = "iteration_limit"


_BY_KIND: dict[str, type[GradError]] = {
    cls.kind: cls
    for cls in (
        NonDifferentiableError,
        InvalidWrtError,
        WrongArityError,
        NeedsPlanContextError,
        MarkerReachedExecutionError,
        UnsupportedTypeError,
        DerivativeTooLargeError,
        UnexportableError,
        ShapeMismatchError,
        InvalidTensorError,
        DeviceUnavailableError,
        ClusterTimeoutError,
        IterationLimitError,
    )
}


def _from_kind(kind: str | None, message: str) -> DataFusionGradError:
    """The exception for an engine error of ``kind`` (None: not a GradError)."""
    if kind is None:
        return QueryError(message)
    return _BY_KIND.get(kind, GradError)(message)


__all__ = [
    "DataFusionGradError",
    "QueryError",
    "GradError",
    "IncompatibleDataFusionError",
    *sorted(cls.__name__ for cls in _BY_KIND.values()),
]

"""``grad`` in the stock ``datafusion`` package (datafusion-python 55).

Stock datafusion-python cannot take an analyzer rule, and its FFI scalar
functions do not forward ``simplify``, so a ``grad`` registered there alone
never differentiates (it fails with ``marker_reached_execution``, never
returns a number). :func:`install` adds what makes it work:

- ``grad``, ``jvp``, ``vjp`` as FFI scalar functions, so the SQL planner
  accepts them;
- a query planner that differentiates the plans the session hands it and
  plans them with DataFusion's physical planner in a session of datafusion-
  grad over the caller's catalogs, configuration and functions. The plans
  cross the FFI boundary by reference, not by protobuf, so every shape works:
  recursive CTEs (training loops), in-memory tables, DML, views, subqueries.
  It replaces the session's query planner (a session holds one);
- the table function ``grad_query('<SQL>')``, which runs a whole query inside
  datafusion-grad over the session's tables, for sessions that keep a query
  planner of their own (install with ``planner=False``).

The FFI structs differ between DataFusion major versions, so :func:`install`
and :class:`GradExtension` first compare the caller's ``datafusion.__version__``
with the version datafusion_grad is built against and raise
:class:`~datafusion_grad.errors.IncompatibleDataFusionError` (naming both) on a
mismatch, before anything crosses the FFI boundary. A session of another
datafusion-python (e.g. 54, which xarray-sql 0.6 pins) exchanges data with
ours through Arrow streams instead: see
:meth:`datafusion_grad.SessionContext.register_arrow`.
"""

from __future__ import annotations

from typing import Any

from . import _internal
from .errors import IncompatibleDataFusionError


def _datafusion_version() -> str:
    """The version of the importable ``datafusion`` package."""
    import datafusion

    version = getattr(datafusion, "__version__", None)
    if not isinstance(version, str):
        from importlib import metadata

        try:
            version = metadata.version("datafusion")
        except metadata.PackageNotFoundError:
            version = "(unknown version)"
    return version


def check_datafusion_version() -> None:
    """Raises :class:`~datafusion_grad.errors.IncompatibleDataFusionError`
    unless the ``datafusion`` package (datafusion-python) has the major
    version whose FFI datafusion_grad is built against (the one in
    ``datafusion_grad.DATAFUSION_VERSION``). :func:`install` and
    :class:`GradExtension` call it before they hand over any FFI capsule."""
    found = _datafusion_version()
    major = found.split(".")[0]
    if not (major.isdigit() and int(major) == _internal.FFI_VERSION):
        raise IncompatibleDataFusionError(found, _internal.DATAFUSION_VERSION)

class GradExtension:
    """The extension bundle for ``datafusion.SessionContext.with_extensions``:
    the by-reference codecs (plans cross the FFI boundary as references to
    live objects, so in-memory tables and recursive plans cross too) and the
    differentiating query planner, which replaces the session's planner.
    :func:`install` uses it; use it directly to combine with other bundles
    (list it last: it does not delegate to the planners before it)."""

    def __datafusion_session_components__(self, ctx: Any) -> Any:
        check_datafusion_version()
        from datafusion import SessionExtensionComponents

        codec = _internal.ByReferenceCodec(ctx)
        return SessionExtensionComponents(
            logical_extension_codecs=(codec,), physical_extension_codecs=(codec,)
        )

    def __datafusion_session_planner__(self, ctx: Any, fallback: Any) -> Any:
        check_datafusion_version()
        return _internal.GradPlanner()


def install(ctx: Any, planner: bool = True) -> Any:
    """Installs grad/jvp/vjp, the tensor functions and ``grad_query`` into
    the session of a stock ``datafusion.SessionContext``, and (unless ``planner=False``) the
    differentiating query planner with its codecs (:class:`GradExtension`).
    Returns ``ctx``. The codecs belong to a context *handle*: ``ctx`` is
    switched to the handle carrying them; other handles on the same session
    made before ``install`` (``with_*`` results) cannot pass in-memory tables
    to the planner.

    Without the planner, grad works only inside ``grad_query('<SQL>')``; a
    grad elsewhere fails with ``marker_reached_execution``.

    ``ctx`` must come from datafusion-python of the major version we are built
    against (``datafusion_grad.DATAFUSION_VERSION``); another one (e.g. 54,
    pinned by xarray-sql 0.6) raises
    :class:`~datafusion_grad.errors.IncompatibleDataFusionError` before
    anything crosses the FFI boundary. Move its tables into a
    :class:`datafusion_grad.SessionContext` through Arrow streams instead
    (:meth:`~datafusion_grad.SessionContext.register_arrow`).

    >>> import datafusion, datafusion_grad
    >>> ctx = datafusion_grad.install(datafusion.SessionContext())
    >>> ctx.from_pydict({"x": [1.0, 2.0]}, name="t")  # doctest: +ELLIPSIS
    DataFrame()...
    >>> ctx.sql("SELECT grad(x * x, x) AS d FROM t").to_pydict()
    {'d': [2.0, 4.0]}
    >>> sql = "WITH RECURSIVE it(n, x) AS (SELECT 0, 1.0 UNION ALL "
    >>> sql += "SELECT n + 1, x - (x * x - 2) / grad(x * x - 2, x) FROM it WHERE n < 6) "
    >>> sql += "SELECT x FROM it WHERE n = 6"
    >>> ctx.sql(f"SELECT * FROM grad_query('{sql}')").to_pydict()
    {'x': [1.414213562373095]}
    """
    # Before anything else: with another major version, handing over an FFI
    # capsule (register_udf, with_extensions) would crash the process.
    check_datafusion_version()
    import datafusion

    if not isinstance(ctx, datafusion.SessionContext):
        msg = (
            "install() takes a stock datafusion.SessionContext; "
            f"datafusion_grad.SessionContext has everything already (got {type(ctx).__name__})"
        )
        raise TypeError(msg)
    for name in _internal.ScalarFunction.names():
        ctx.register_udf(datafusion.udf(_internal.ScalarFunction(name)))
    for name in _internal.AggregateFunction.names():
        ctx.register_udaf(datafusion.udaf(_internal.AggregateFunction(name)))
    ctx.register_udtf(datafusion.udtf(_internal.GradQueryFunction(), "grad_query"))
    if planner:
        # with_extensions returns a new handle on the same session; the
        # caller's object takes it over, so `ctx` itself carries the codecs.
        ctx.ctx = ctx.with_extensions(GradExtension()).ctx
    return ctx

"""Differentiable SQL on Apache DataFusion.

``grad(f, x)``, ``jvp(f, x, t)`` and ``vjp(f, x, u)`` are SQL functions: each
row is an evaluation point, and the derivative is computed by rewriting the
query (reverse mode, shared subexpressions), so it works in every query
shape: aggregates, recursive CTEs (whole training loops in one query), DML.

>>> import datafusion_grad as dg
>>> ctx = dg.SessionContext()
>>> ctx.sql("SELECT grad(sin(x) * x, x) AS d FROM (VALUES (0.0)) AS t(x)").to_pydict()
{'d': [0.0]}
>>> dg.differentiate_sql("sin(x) * y", "x", dialect="postgres")
'(y * cos(x))'

Tensor columns (vectors and matrices, with differentiable ``matmul``,
``softmax``, ``cross_entropy``, ...) convert from and to NumPy with
:mod:`datafusion_grad.tensor`.

For the stock ``datafusion`` package, :func:`install` adds grad/jvp/vjp, the
table function ``grad_query`` and a differentiating query planner to a
``datafusion.SessionContext`` of datafusion-python of our DataFusion major
version (``DATAFUSION_VERSION``); other versions (and xarray-sql) exchange
tables and results with :class:`SessionContext` through Arrow streams.
"""

from __future__ import annotations

from . import errors, tensor
from ._internal import DATAFUSION_VERSION
from ._internal import differentiate_sql as _differentiate_sql
from .context import SessionContext
from .dataframe import DataFrame
from .errors import DataFusionGradError, GradError, IncompatibleDataFusionError, QueryError
from .interop import GradExtension, install

__version__ = "0.1.0"


def differentiate_sql(expr: str, wrt: str, dialect: str = "datafusion") -> str:
    """The derivative of the SQL expression ``expr`` with respect to the
    column ``wrt``, as SQL text of ``dialect`` (datafusion, duckdb, postgres,
    sqlite, generic). Identifiers are DOUBLE columns, taken to be non-NULL.

    >>> differentiate_sql("sin(x)", "x")
    'cos(x)'
    """
    return _differentiate_sql(expr, wrt, dialect)


def rewrite_sql(
    sql: str, dialect: str = "datafusion", ctx: SessionContext | None = None
) -> str:
    """``sql`` (one or more statements) with every grad/jvp/vjp replaced by
    its derivative, as SQL text of ``dialect`` that DuckDB, PostgreSQL or
    SQLite run as is. Tables are those of ``ctx`` (DDL in ``sql`` is run in
    it; a fresh session when omitted).

    >>> print(rewrite_sql("CREATE TABLE t (x DOUBLE); SELECT grad(x * x, x) AS d FROM t", "duckdb"))
    CREATE TABLE t (x DOUBLE);
    SELECT (t.x + t.x) AS d FROM t;
    """
    return (ctx or SessionContext()).rewrite_sql(sql, dialect)


__all__ = [
    "DATAFUSION_VERSION",
    "DataFrame",
    "DataFusionGradError",
    "GradError",
    "GradExtension",
    "IncompatibleDataFusionError",
    "QueryError",
    "SessionContext",
    "differentiate_sql",
    "errors",
    "install",
    "rewrite_sql",
    "tensor",
]

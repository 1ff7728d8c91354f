"""The :class:`SessionContext`: a DataFusion session with grad/jvp/vjp."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, Callable

import pyarrow as pa

from . import _internal
from .dataframe import DataFrame

if TYPE_CHECKING:
    import pandas
    import polars

_anonymous = itertools.count()


def _arrow_stream(data: Any) -> Any:
    """An Arrow C stream capsule for ``data``: any object exposing
    ``__arrow_c_stream__`` (pyarrow, polars, DataFrame, ...), a pyarrow
    RecordBatch, or a pandas DataFrame."""
    if hasattr(data, "__arrow_c_stream__"):
        return data.__arrow_c_stream__()
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data]).__arrow_c_stream__()
    if type(data).__module__.startswith("pandas"):
        return pa.Table.from_pandas(data, preserve_index=False).__arrow_c_stream__()
    msg = (
        "expected an Arrow stream (an object with __arrow_c_stream__, e.g. a "
        f"pyarrow Table or a polars DataFrame) or a pandas DataFrame, got {type(data).__name__}"
    )
    raise TypeError(msg)


class _TqdmBar:
    """A progress callback that draws a tqdm bar per recursive query (a new
    bar when the iteration count starts again)."""

    def __init__(self) -> None:
        try:
            from tqdm.auto import tqdm
        except ImportError as e:
            msg = "set_progress('tqdm') needs the tqdm package: pip install tqdm"
            raise ImportError(msg) from e
        self._tqdm = tqdm
        self._bar: Any = None

    def __call__(self, n: int, rows: int) -> None:
        if self._bar is None or n <= self._bar.n:
            if self._bar is not None:
                self._bar.close()
            self._bar = self._tqdm(desc="recursive query", unit="iteration")
        self._bar.set_postfix(rows=rows, refresh=False)
        self._bar.update(n - self._bar.n)


class SessionContext:
    """A DataFusion session with ``grad``, ``jvp``, ``vjp`` and
    ``differentiate_sql`` installed, modelled on ``datafusion.SessionContext``.

    >>> import datafusion_grad as dg
    >>> ctx = dg.SessionContext()
    >>> ctx.from_pydict({"x": [1.0, 2.0], "y": [3.0, 4.0]}, name="t")
    DataFrame(columns=['x', 'y'])
    >>> ctx.sql("SELECT grad(x * x * y, x) AS d FROM t").to_pydict()
    {'d': [6.0, 16.0]}
    """

    def __init__(self) -> None:
        self._raw = _internal.SessionContext()

    def set_progress(
        self, callback: Callable[..., object] | str | None, rows: bool = False
    ) -> None:
        """Calls ``callback(n)`` as iteration ``n`` (from 1) of a recursive
        query starts, e.g. to show a training loop's progress (with
        ``rows=True``: ``callback(n, rows)``, ``rows`` being the rows the
        iterations before it produced); ``"tqdm"``
        shows a tqdm progress bar per recursive query instead (``tqdm`` must
        be installed); ``None`` removes it. An exception the callback raises
        is reported as unraisable (``sys.unraisablehook``), not raised into
        the query.

        >>> import datafusion_grad as dg
        >>> ctx = dg.SessionContext()
        >>> seen = []
        >>> ctx.set_progress(seen.append)
        >>> ctx.sql("WITH RECURSIVE r(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM r WHERE n < 3) "
        ...         "SELECT max(n) AS m FROM r").to_pydict()
        {'m': [3]}
        >>> seen  # the 4th iteration produces no row: the recursion ends
        [1, 2, 3, 4]
        >>> seen.clear()
        >>> ctx.set_progress(lambda n, rows: seen.append((n, rows)), rows=True)
        >>> ctx.sql("WITH RECURSIVE r(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM r WHERE n < 3) "
        ...         "SELECT max(n) AS m FROM r").to_pydict()
        {'m': [3]}
        >>> seen
        [(1, 0), (2, 1), (3, 2), (4, 3)]
        """
        if isinstance(callback, str):
            if callback != "tqdm":
                msg = f"set_progress takes a callable, 'tqdm' or None, got {callback!r}"
                raise ValueError(msg)
            callback, rows = _TqdmBar(), True
        self._raw.set_progress(callback, rows)

    def sql(self, query: str) -> DataFrame:
        """Plans ``query``. DDL (CREATE TABLE/VIEW, DROP) runs at once; a
        query or DML statement runs when its results are asked for."""
        return DataFrame(self._raw.sql(query))

    def table(self, name: str) -> DataFrame:
        """The registered table ``name``."""
        return DataFrame(self._raw.table(name))

    def table_exist(self, name: str) -> bool:
        """Whether a table ``name`` is registered."""
        return self._raw.table_exist(name)

    def deregister_table(self, name: str) -> None:
        """Removes the table ``name``."""
        self._raw.deregister_table(name)

    def register_csv(
        self, name: str, path: str, has_header: bool = True, delimiter: str = ","
    ) -> None:
        """Registers the CSV file (or directory of files) at ``path``."""
        self._raw.register_csv(name, str(path), has_header, delimiter)

    def register_parquet(self, name: str, path: str) -> None:
        """Registers the Parquet file (or directory of files) at ``path``."""
        self._raw.register_parquet(name, str(path))

    def register_json(self, name: str, path: str) -> None:
        """Registers the newline-delimited JSON file(s) at ``path``."""
        self._raw.register_json(name, str(path))

    def register_arrow(self, name: str, data: Any) -> None:
        """Registers ``data`` as the in-memory table ``name``: any object
        exposing ``__arrow_c_stream__`` (pyarrow Table/RecordBatchReader,
        polars DataFrame, another query's DataFrame, a DataFrame of the stock
        ``datafusion`` package of any version, an xarray-sql result, ...), a
        pyarrow RecordBatch, or a pandas DataFrame. The stream is read once,
        when registering.

        This is the way in from a datafusion-python whose major version
        differs from ours (:func:`datafusion_grad.install` refuses those),
        e.g. 54, which xarray-sql 0.6 pins: run their query there, register
        its DataFrame here, and hand our DataFrame (also an Arrow stream)
        back to their ``from_arrow``. With xarray-sql's ``XarrayContext`` as
        ``theirs`` it reads the same; here the stock package stands in:

        >>> import datafusion, datafusion_grad as dg
        >>> theirs = datafusion.SessionContext()
        >>> ctx = dg.SessionContext()
        >>> ctx.register_arrow("t", theirs.sql("SELECT 1.0 AS x UNION ALL SELECT 2.0"))
        >>> df = ctx.sql("SELECT x, grad(x * x, x) AS d FROM t ORDER BY x")
        >>> theirs.from_arrow(df, name="result").to_pydict()
        {'x': [1.0, 2.0], 'd': [2.0, 4.0]}
        """
        self._raw.register_arrow_stream(name, _arrow_stream(data))

    def register_record_batches(
        self, name: str, partitions: list[list[pa.RecordBatch]]
    ) -> None:
        """Registers record batches (a list of partitions, each a list of
        batches, as datafusion-python takes them) as the table ``name``."""
        batches = [batch for partition in partitions for batch in partition]
        if not batches:
            msg = "register_record_batches needs at least one record batch (for the schema)"
            raise ValueError(msg)
        self.register_arrow(name, pa.Table.from_batches(batches))

    def from_arrow(self, data: Any, name: str | None = None) -> DataFrame:
        """A DataFrame over ``data`` (see :meth:`register_arrow`); registered
        as ``name`` when given."""
        if name is None:
            return DataFrame(self._raw.read_arrow_stream(_arrow_stream(data)))
        self.register_arrow(name, data)
        return self.table(name)

    def from_pandas(self, data: pandas.DataFrame, name: str | None = None) -> DataFrame:
        """A DataFrame over a pandas DataFrame (its index is dropped)."""
        return self.from_arrow(pa.Table.from_pandas(data, preserve_index=False), name)

    def from_polars(self, data: polars.DataFrame, name: str | None = None) -> DataFrame:
        """A DataFrame over a polars DataFrame."""
        return self.from_arrow(data, name)

    def from_pydict(self, data: dict[str, list[Any]], name: str | None = None) -> DataFrame:
        """A DataFrame over ``{column: [values]}``."""
        return self.from_arrow(pa.table(data), name)

    def rewrite_sql(self, sql: str, dialect: str = "datafusion") -> str:
        """``sql`` with every grad/jvp/vjp replaced by its derivative, as SQL
        text of ``dialect`` (datafusion, duckdb, postgres, sqlite, generic),
        over this session's tables. See :func:`datafusion_grad.rewrite_sql`."""
        return self._raw.rewrite_sql(sql, dialect)

    def to_substrait(self, sql: str, profile: str = "datafusion") -> bytes:
        """The Substrait plan (protobuf bytes) of the query ``sql``, with its
        derivatives already computed; ``profile="acero"`` targets
        ``pyarrow.substrait``."""
        return self._raw.to_substrait(sql, profile)

    def __repr__(self) -> str:
        return "SessionContext()"

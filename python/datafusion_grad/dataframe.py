"""The :class:`DataFrame` returned by :meth:`SessionContext.sql`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    import pandas
    import polars

    from ._internal import DataFrame as _RawDataFrame


class DataFrame:
    """A planned query. Nothing runs until results are asked for; each of
    :meth:`collect`, :meth:`to_arrow_table`, :meth:`to_pandas`,
    :meth:`to_polars` and ``__arrow_c_stream__`` runs it (with the GIL
    released; Ctrl-C cancels it).

    >>> import datafusion_grad as dg
    >>> ctx = dg.SessionContext()
    >>> df = ctx.sql("SELECT grad(x * x, x) AS d FROM (VALUES (1.0), (3.0)) AS t(x)")
    >>> df.to_pydict()
    {'d': [2.0, 6.0]}
    """

    def __init__(self, raw: _RawDataFrame) -> None:
        self._raw = raw

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        """The results as an Arrow C stream (Arrow PyCapsule interface): any
        Arrow consumer (pyarrow, polars, duckdb, ...) reads them without a copy."""
        return self._raw.__arrow_c_stream__(requested_schema)

    def __arrow_c_schema__(self) -> Any:
        """The result schema as an Arrow C schema capsule."""
        return self._raw.__arrow_c_schema__()

    def schema(self) -> pa.Schema:
        """The result schema (does not run the query)."""
        return pa.schema(self._raw)

    @property
    def columns(self) -> list[str]:
        """The result column names."""
        return self._raw.column_names()

    def to_arrow_table(self) -> pa.Table:
        """Runs the query; the results as a :class:`pyarrow.Table`."""
        return pa.RecordBatchReader.from_stream(self).read_all()

    def collect(self) -> list[pa.RecordBatch]:
        """Runs the query; the results as a list of record batches."""
        return list(pa.RecordBatchReader.from_stream(self))

    def to_pydict(self) -> dict[str, list[Any]]:
        """Runs the query; the results as ``{column: [values]}``."""
        return self.to_arrow_table().to_pydict()

    def to_pylist(self) -> list[dict[str, Any]]:
        """Runs the query; the results as a list of row dicts."""
        return self.to_arrow_table().to_pylist()

    def to_pandas(self) -> pandas.DataFrame:
        """Runs the query; the results as a pandas DataFrame (needs pandas)."""
        return self.to_arrow_table().to_pandas()

    def to_polars(self) -> polars.DataFrame:
        """Runs the query; the results as a polars DataFrame (needs polars)."""
        import polars

        return polars.from_arrow(self.to_arrow_table())

    def count(self) -> int:
        """Runs the query; the number of result rows."""
        return self._raw.count()

    def show(self, num: int = 20) -> None:
        """Runs the query and prints its first ``num`` rows as a table."""
        print(self._raw.show_string(num))

    def explain(self, verbose: bool = False, analyze: bool = False) -> None:
        """Prints the logical and physical plans. The optimized plan shows
        every grad/jvp/vjp already replaced by its derivative; ``analyze``
        runs the query and adds run-time metrics."""
        print(self._raw.explain_string(verbose, analyze))

    def explain_string(self, verbose: bool = False, analyze: bool = False) -> str:
        """The text :meth:`explain` prints."""
        return self._raw.explain_string(verbose, analyze)

    def __repr__(self) -> str:
        return f"DataFrame(columns={self.columns!r})"

"""Arrow, pandas and polars in and out (Arrow PyCapsule interface)."""

import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

import datafusion_grad as dg

DATA = {"x": [1.0, 2.0, 3.0], "y": [2.0, 0.0, -1.0]}
EXPECTED = {"d": [4.0, 0.0, -6.0]}  # d/dx x*x*y = 2*x*y
QUERY = "SELECT grad(x * x * y, x) AS d FROM {} ORDER BY x"


class StreamOnly:
    """Any object exposing only __arrow_c_stream__."""

    def __init__(self, table):
        self.table = table

    def __arrow_c_stream__(self, requested_schema=None):
        return self.table.__arrow_c_stream__(requested_schema)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: pa.table(DATA), id="pyarrow-table"),
        pytest.param(lambda: pa.RecordBatch.from_pydict(DATA), id="pyarrow-batch"),
        pytest.param(lambda: pa.table(DATA).to_reader(), id="pyarrow-reader"),
        pytest.param(lambda: pd.DataFrame(DATA), id="pandas"),
        pytest.param(lambda: pl.DataFrame(DATA), id="polars"),
        pytest.param(lambda: StreamOnly(pa.table(DATA)), id="capsule-object"),
    ],
)
def test_register_any_arrow_source(make):
    ctx = dg.SessionContext()
    ctx.register_arrow("t", make())
    assert ctx.sql(QUERY.format("t")).to_pydict() == EXPECTED


def test_from_helpers():
    ctx = dg.SessionContext()
    frames = {
        "a": ctx.from_pandas(pd.DataFrame(DATA), name="a"),
        "b": ctx.from_polars(pl.DataFrame(DATA), name="b"),
        "c": ctx.from_arrow(pa.table(DATA), name="c"),
        "d": ctx.from_pydict(DATA, name="d"),
    }
    for name, df in frames.items():
        assert df.to_pydict() == DATA
        assert ctx.sql(QUERY.format(name)).to_pydict() == EXPECTED
    unnamed = ctx.from_arrow(pa.table(DATA))
    assert unnamed.to_pydict() == DATA


def test_record_batches_partitions():
    ctx = dg.SessionContext()
    batch = pa.RecordBatch.from_pydict(DATA)
    ctx.register_record_batches("t", [[batch], [batch]])
    assert ctx.sql("SELECT count(*) AS n FROM t").to_pydict() == {"n": [6]}
    with pytest.raises(ValueError):
        ctx.register_record_batches("u", [[]])


def test_round_trips_keep_values_and_nulls():
    ctx = dg.SessionContext()
    ctx.from_pydict({"x": [1.5, None, -2.0]}, name="t")
    df = ctx.sql("SELECT x, grad(x * x, x) AS d FROM t")
    assert df.to_pydict() == {"x": [1.5, None, -2.0], "d": [3.0, None, -4.0]}
    pandas = df.to_pandas()
    assert pandas["d"].isna().tolist() == [False, True, False]
    assert df.to_polars()["d"].to_list() == [3.0, None, -4.0]
    # a query's result registered back as a table
    ctx.register_arrow("again", df)
    assert ctx.sql("SELECT sum(d) AS s FROM again").to_pydict() == {"s": [-1.0]}


def test_polars_reads_the_stream_directly():
    ctx = dg.SessionContext()
    ctx.from_pydict(DATA, name="t")
    frame = pl.from_arrow(pa.table(ctx.sql(QUERY.format("t"))))
    assert frame["d"].to_list() == EXPECTED["d"]


def test_rejects_non_arrow():
    ctx = dg.SessionContext()
    with pytest.raises(TypeError, match="__arrow_c_stream__"):
        ctx.register_arrow("t", [1, 2, 3])
    with pytest.raises(TypeError, match="arrow_array_stream"):
        ctx._raw.register_arrow_stream("t", pa.schema([("x", pa.int64())]).__arrow_c_schema__())

"""NumPy arrays as tensor columns and back.

A tensor column holds one vector (``FixedSizeList<float64, n>``) or matrix
(``FixedSizeList<FixedSizeList<float64, c>, r>``, row-major) per row.
:func:`to_arrow` turns a NumPy array of shape ``(rows, n)`` or
``(rows, r, c)`` into such a column without copying the data, and
:func:`to_numpy` turns a column back into a NumPy array of that shape.

>>> import numpy as np
>>> import pyarrow as pa
>>> import datafusion_grad as dg
>>> w = np.array([[1.0, 2.0], [3.0, -1.0]])          # two rows, vectors of 2
>>> ctx = dg.SessionContext()
>>> ctx.register_arrow("t", pa.table({"w": dg.tensor.to_arrow(w)}))
>>> g = ctx.sql("SELECT grad(dot(w, w), w) AS g FROM t").to_arrow_table()["g"]
>>> dg.tensor.to_numpy(g)
array([[ 2.,  4.],
       [ 6., -2.]])
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def to_arrow(array: np.ndarray) -> pa.FixedSizeListArray:
    """A tensor column from ``array`` of shape ``(rows, n)`` (vectors) or
    ``(rows, r, c)`` (matrices); the values are converted to float64."""
    values = np.ascontiguousarray(array, dtype=np.float64)
    if values.ndim not in (2, 3):
        msg = f"expected an array of shape (rows, n) or (rows, r, c), got {values.shape}"
        raise ValueError(msg)
    flat = pa.array(values.reshape(-1))
    if values.ndim == 2:
        return pa.FixedSizeListArray.from_arrays(flat, values.shape[1])
    rows = pa.FixedSizeListArray.from_arrays(flat, values.shape[2])
    return pa.FixedSizeListArray.from_arrays(rows, values.shape[1])


def to_numpy(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A NumPy array of shape ``(rows, n)`` or ``(rows, r, c)`` from a tensor
    column (vectors or matrices of floats). NULL tensors are refused."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if column.null_count:
        msg = "the tensor column has NULL rows; filter them out first"
        raise ValueError(msg)
    shape = [len(column)]
    values = column
    while pa.types.is_fixed_size_list(values.type):
        shape.append(values.type.list_size)
        values = values.flatten()
    if len(shape) not in (2, 3) or not pa.types.is_floating(values.type):
        msg = f"not a tensor column (vectors or matrices of floats): {column.type}"
        raise ValueError(msg)
    return values.to_numpy(zero_copy_only=False).astype(np.float64).reshape(shape)

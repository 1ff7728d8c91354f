//! `DataFrame`: a planned query, collected into Arrow through the Arrow
//! PyCapsule interface (`__arrow_c_stream__`), which pyarrow, pandas and
//! polars read without copying.

use arrow::array::RecordBatchIterator;
use arrow::ffi::FFI_ArrowSchema;
use arrow::ffi_stream::FFI_ArrowArrayStream;
use arrow::util::pretty::pretty_format_batches;
use datafusion::arrow::datatypes::Schema;
use datafusion::prelude::DataFrame;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::capsule;
use crate::errors::py_result;
use crate::runtime::wait;

/// A query of a `SessionContext`, run when its results are asked for.
#[pyclass(name = "DataFrame", module = "datafusion_grad._internal", frozen)]
pub struct PyDataFrame {
    df: DataFrame,
}

impl PyDataFrame {
    /// Wraps `df`.
    pub fn new(df: DataFrame) -> Self {
        Self { df }
    }
}

#[pymethods]
impl PyDataFrame {
    /// Runs the query and exports its batches as an Arrow C stream capsule.
    /// `requested_schema` is accepted as the protocol requires and ignored:
    /// the stream has the query's own schema.
    #[pyo3(signature = (requested_schema = None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = requested_schema;
        let df = self.df.clone();
        let schema = df.schema().inner().clone();
        let batches = py_result(wait(py, df.collect())?)?;
        let reader = RecordBatchIterator::new(batches.into_iter().map(Ok), schema);
        let stream = FFI_ArrowArrayStream::new(Box::new(reader));
        capsule::export(py, stream, "arrow_array_stream")
    }

    /// The result schema as an Arrow C schema capsule.
    fn __arrow_c_schema__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        let schema: &Schema = self.df.schema().as_arrow();
        let ffi =
            FFI_ArrowSchema::try_from(schema).map_err(|e| PyValueError::new_err(e.to_string()))?;
        capsule::export(py, ffi, "arrow_schema")
    }

    /// The first `limit` rows as a text table.
    #[pyo3(signature = (limit = 20))]
    fn show_string(&self, py: Python<'_>, limit: usize) -> PyResult<String> {
        let df = py_result(self.df.clone().limit(0, Some(limit)))?;
        let batches = py_result(wait(py, df.collect())?)?;
        pretty_format_batches(&batches)
            .map(|table| table.to_string())
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// The plan as text: logical and physical, optimized (with `grad` already
    /// replaced by its derivative); `analyze` runs the query and adds metrics.
    #[pyo3(signature = (verbose = false, analyze = false))]
    fn explain_string(&self, py: Python<'_>, verbose: bool, analyze: bool) -> PyResult<String> {
        let df = py_result(self.df.clone().explain(verbose, analyze))?;
        let batches = py_result(wait(py, df.collect())?)?;
        pretty_format_batches(&batches)
            .map(|table| table.to_string())
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// The number of rows (runs the query).
    fn count(&self, py: Python<'_>) -> PyResult<usize> {
        py_result(wait(py, self.df.clone().count())?)
    }

    /// The column names of the result.
    fn column_names(&self) -> Vec<String> {
        self.df
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    }
}

//! `SessionContext`: a DataFusion session with `grad`, `jvp`, `vjp` and the
//! rest of datafusion-grad installed.

use std::sync::Arc;

use arrow::ffi_stream::{ArrowArrayStreamReader, FFI_ArrowArrayStream};
use datafusion::arrow::array::{RecordBatch, RecordBatchReader};
use datafusion::arrow::error::ArrowError;
use datafusion::datasource::MemTable;
use datafusion::error::DataFusionError;
use datafusion::prelude::{CsvReadOptions, JsonReadOptions, ParquetReadOptions, SessionContext};
use datafusion_grad::exec::iterations::{Iteration, IterationProgress};
use datafusion_grad::export::SqlDialect;
use datafusion_grad::substrait::{plan_to_bytes, to_substrait, Profile};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyCapsule};

use crate::capsule;
use crate::dataframe::PyDataFrame;
use crate::errors::{py_result, to_py};
use crate::runtime::wait;

/// A session with everything of datafusion-grad installed.
#[pyclass(name = "SessionContext", module = "datafusion_grad._internal", frozen)]
pub struct PySessionContext {
    ctx: SessionContext,
}

#[pymethods]
impl PySessionContext {
    /// A new session (information_schema enabled).
    #[new]
    fn new() -> Self {
        let config = datafusion::prelude::SessionConfig::new().with_information_schema(true);
        Self {
            ctx: datafusion_grad::session_context_with_config(config),
        }
    }

    /// Calls `callback(n)` (`callback(n, rows)` with `rows`) as iteration
    /// `n` (from 1) of a recursive query starts (a training loop's
    /// progress; `rows`: the rows the iterations before it produced);
    /// `None` removes it. An exception it raises is reported as
    /// unraisable, not raised into the query.
    #[pyo3(signature = (callback, rows = false))]
    fn set_progress(&self, callback: Option<PyObject>, rows: bool) {
        let report: Arc<dyn Fn(Iteration) + Send + Sync> = match callback {
            Some(callback) => Arc::new(move |iteration: Iteration| {
                Python::with_gil(|py| {
                    let called = match rows {
                        true => callback.call1(py, (iteration.number, iteration.rows)),
                        false => callback.call1(py, (iteration.number,)),
                    };
                    if let Err(e) = called {
                        e.write_unraisable(py, None);
                    }
                })
            }),
            None => Arc::new(|_| {}),
        };
        let state = self.ctx.state_ref();
        let mut state = state.write();
        state
            .config_mut()
            .set_extension(Arc::new(IterationProgress(report)));
    }

    /// Plans `query` (DDL runs at once, like datafusion-python).
    fn sql(&self, py: Python<'_>, query: &str) -> PyResult<PyDataFrame> {
        let df = py_result(wait(py, self.ctx.sql(query))?)?;
        Ok(PyDataFrame::new(df))
    }

    /// Registers the CSV file(s) at `path` as table `name`.
    #[pyo3(signature = (name, path, has_header = true, delimiter = ","))]
    fn register_csv(
        &self,
        py: Python<'_>,
        name: &str,
        path: &str,
        has_header: bool,
        delimiter: &str,
    ) -> PyResult<()> {
        let delimiter = match delimiter.as_bytes() {
            [byte] => *byte,
            _ => {
                return Err(PyTypeError::new_err(
                    "delimiter must be one ASCII character",
                ))
            }
        };
        let options = CsvReadOptions::new()
            .has_header(has_header)
            .delimiter(delimiter);
        py_result(wait(py, self.ctx.register_csv(name, path, options))?)
    }

    /// Registers the Parquet file(s) at `path` as table `name`.
    fn register_parquet(&self, py: Python<'_>, name: &str, path: &str) -> PyResult<()> {
        let options = ParquetReadOptions::default();
        py_result(wait(py, self.ctx.register_parquet(name, path, options))?)
    }

    /// Registers the newline-delimited JSON file(s) at `path` as table `name`.
    fn register_json(&self, py: Python<'_>, name: &str, path: &str) -> PyResult<()> {
        let options = JsonReadOptions::default();
        py_result(wait(py, self.ctx.register_json(name, path, options))?)
    }

    /// Registers the batches of an Arrow C stream capsule (from
    /// `obj.__arrow_c_stream__()`) as the in-memory table `name`.
    fn register_arrow_stream(&self, name: &str, stream: Bound<'_, PyCapsule>) -> PyResult<()> {
        let table = mem_table(&stream)?;
        py_result(self.ctx.register_table(name, Arc::new(table)))?;
        Ok(())
    }

    /// The batches of an Arrow C stream capsule as a DataFrame (not
    /// registered under any name).
    fn read_arrow_stream(&self, stream: Bound<'_, PyCapsule>) -> PyResult<PyDataFrame> {
        let table = mem_table(&stream)?;
        let df = py_result(self.ctx.read_table(Arc::new(table)))?;
        Ok(PyDataFrame::new(df))
    }

    /// The table `name` as a DataFrame.
    fn table(&self, py: Python<'_>, name: &str) -> PyResult<PyDataFrame> {
        let df = py_result(wait(py, self.ctx.table(name))?)?;
        Ok(PyDataFrame::new(df))
    }

    /// Whether a table `name` is registered.
    fn table_exist(&self, name: &str) -> PyResult<bool> {
        py_result(self.ctx.table_exist(name))
    }

    /// Removes the table `name` (no error if there is none).
    fn deregister_table(&self, name: &str) -> PyResult<()> {
        py_result(self.ctx.deregister_table(name))?;
        Ok(())
    }

    /// `sql` with every grad/jvp/vjp replaced by its derivative, as SQL text
    /// of `dialect`, over this session's tables.
    #[pyo3(signature = (sql, dialect = "datafusion"))]
    fn rewrite_sql(&self, py: Python<'_>, sql: &str, dialect: &str) -> PyResult<String> {
        let dialect: SqlDialect = dialect
            .parse()
            .map_err(|e| to_py(DataFusionError::from(e)))?;
        py_result(wait(
            py,
            datafusion_grad::export::rewrite_sql(&self.ctx, sql, dialect),
        )?)
    }

    /// The Substrait plan (protobuf bytes) of the query `sql`, differentiated.
    #[pyo3(signature = (sql, profile = "datafusion"))]
    fn to_substrait<'py>(
        &self,
        py: Python<'py>,
        sql: &str,
        profile: &str,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let profile: Profile = profile
            .parse()
            .map_err(|e| to_py(DataFusionError::from(e)))?;
        let plan = py_result(wait(py, to_substrait(&self.ctx, sql, profile))?)?;
        Ok(PyBytes::new(py, &plan_to_bytes(&plan)))
    }
}

/// The batches of an Arrow C stream capsule as a [`MemTable`].
fn mem_table(stream: &Bound<'_, PyCapsule>) -> PyResult<MemTable> {
    let stream = capsule::named(stream.as_any(), "__arrow_c_stream__", "arrow_array_stream")?;
    // SAFETY: the capsule holds an FFI_ArrowArrayStream (checked by name, as
    // the Arrow PyCapsule interface specifies); from_raw moves the stream out
    // and marks the original released, so the capsule's destructor is a no-op.
    let reader =
        unsafe { ArrowArrayStreamReader::from_raw(stream.pointer() as *mut FFI_ArrowArrayStream) }
            .map_err(|e| to_py(e.into()))?;
    let schema = reader.schema();
    let batches: Vec<RecordBatch> = reader
        .collect::<Result<_, ArrowError>>()
        .map_err(|e| to_py(e.into()))?;
    py_result(MemTable::try_new(schema, vec![batches]))
}

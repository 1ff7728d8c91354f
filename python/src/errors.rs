//! DataFusion errors as Python exceptions of `datafusion_grad.errors`.
//!
//! A differentiation error carries its [`datafusion_grad::ErrorKind`]; it is
//! raised as the `GradError` subclass of that kind (e.g.
//! `NonDifferentiableError` for `non_differentiable`). Any other error is a
//! `QueryError`. The classes are defined in Python (errors.py), so they pickle.

use datafusion::error::DataFusionError;
use datafusion_grad::GradError;
use pyo3::prelude::*;

/// The Python exception for `err`.
pub fn to_py(err: DataFusionError) -> PyErr {
    Python::with_gil(|py| {
        let kind = GradError::find(&err).map(|e| e.kind().name());
        let message = err.to_string();
        let raised = py
            .import("datafusion_grad.errors")
            .and_then(|errors| errors.getattr("_from_kind")?.call1((kind, message)));
        match raised {
            Ok(exception) => PyErr::from_value(exception),
            Err(import_failed) => import_failed,
        }
    })
}

/// `result` with its error as the Python exception for it.
pub fn py_result<T>(result: datafusion::error::Result<T>) -> PyResult<T> {
    result.map_err(to_py)
}

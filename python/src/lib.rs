//! The native module `datafusion_grad._internal` of the Python package.
//!
//! The Python package (`python/datafusion_grad/`) wraps these classes; see
//! its docstrings for the user-facing API.
//!
//! The package is tested by its pytest suite. Under `cargo test` (the
//! workspace's test build in `.ci/test`, which builds this crate's
//! dependencies together with the root crate's so that maturin then reuses
//! them) the crate is empty: its test harness needs no Python to link.
#![cfg(not(test))]

mod capsule;
mod context;
mod dataframe;
mod errors;
mod handoff;
mod interop;
mod runtime;

use pyo3::prelude::*;

/// `differentiate_sql(expr, wrt, dialect="datafusion")`: the derivative of
/// the SQL expression `expr` with respect to the column `wrt`, as SQL text.
#[pyfunction]
#[pyo3(signature = (expr, wrt, dialect = "datafusion"))]
fn differentiate_sql(expr: &str, wrt: &str, dialect: &str) -> PyResult<String> {
    let dialect: datafusion_grad::export::SqlDialect = dialect
        .parse()
        .map_err(|e: datafusion_grad::GradError| errors::to_py(e.into()))?;
    errors::py_result(datafusion_grad::export::differentiate_sql(
        expr, wrt, dialect,
    ))
}

#[pymodule]
fn _internal(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<context::PySessionContext>()?;
    m.add_class::<dataframe::PyDataFrame>()?;
    m.add_class::<interop::PyScalarFunction>()?;
    m.add_class::<interop::PyAggregateFunction>()?;
    m.add_class::<interop::PyGradQuery>()?;
    m.add_class::<interop::PyGradPlanner>()?;
    m.add_class::<interop::PyByReferenceCodec>()?;
    m.add_function(wrap_pyfunction!(differentiate_sql, m)?)?;
    // What the package is built against: `datafusion_grad.install` compares
    // the caller's datafusion-python major version with the FFI version
    // before it hands over any FFI capsule (the FFI structs change between
    // majors, and a mismatch crashes the process).
    m.add("DATAFUSION_VERSION", datafusion::DATAFUSION_VERSION)?;
    m.add("FFI_VERSION", datafusion_ffi::version())?;
    Ok(())
}

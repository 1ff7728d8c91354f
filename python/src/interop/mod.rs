//! `grad` in stock datafusion-python 55, through the FFI capsules it accepts.
//!
//! Stock datafusion-python has no hook for an analyzer rule, and the FFI
//! scalar UDF does not forward `simplify`, so a `grad` registered there alone
//! never rewrites (it fails at execution with `marker_reached_execution`,
//! never computes a number). Two capsules make it differentiate:
//!
//! - [`PyGradPlanner`] (`__datafusion_query_planner__`): a query planner that
//!   receives the session's optimized plan, differentiates and plans it in a
//!   session of ours over the caller's catalogs, and hands the physical plan
//!   back by reference ([`crate::handoff`]), so every shape works — recursive
//!   queries and in-memory tables included.
//! - [`PyGradQuery`] (`__datafusion_table_function__`): the table function
//!   `grad_query('<SQL>')` runs a whole query in our engine over the caller's
//!   catalogs; only its execution plan crosses.

use std::sync::Arc;

use datafusion::catalog::Session;
use datafusion::execution::{FunctionRegistry, SessionStateBuilder};
use datafusion::prelude::SessionContext;
use datafusion_ffi::execution::FFI_TaskContextProvider;
use datafusion_ffi::proto::logical_extension_codec::FFI_LogicalExtensionCodec;
use datafusion_ffi::proto::physical_extension_codec::FFI_PhysicalExtensionCodec;
use datafusion_ffi::query_planner::FFI_QueryPlanner;
use datafusion_ffi::udaf::FFI_AggregateUDF;
use datafusion_ffi::udf::FFI_ScalarUDF;
use datafusion_ffi::udtf::FFI_TableFunction;
use datafusion_grad::engine::call::MarkerKind;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::capsule;
use crate::handoff::ByReference;
use crate::runtime::runtime;

mod grad_query;
mod planner;

use grad_query::GradQuery;
use planner::GradPlanner;

/// One of datafusion_grad's scalar functions (`grad`, `jvp`, `vjp` or a
/// tensor function such as `matmul`) as a `datafusion_scalar_udf` capsule, so
/// the stock SQL planner accepts calls to it.
#[pyclass(name = "ScalarFunction", module = "datafusion_grad._internal", frozen)]
pub struct PyScalarFunction {
    name: String,
}

#[pymethods]
impl PyScalarFunction {
    /// The function `name`.
    #[new]
    fn new(name: &str) -> PyResult<Self> {
        if !Self::names().iter().any(|n| n == name) {
            return Err(PyTypeError::new_err(format!(
                "no datafusion_grad scalar function {name:?}; expected grad, jvp, vjp or a \
                 tensor function"
            )));
        }
        Ok(Self {
            name: name.to_string(),
        })
    }

    /// Every name `ScalarFunction` accepts: the markers, then the tensor functions.
    #[staticmethod]
    fn names() -> Vec<String> {
        MarkerKind::ALL
            .iter()
            .map(|k| k.name().to_string())
            .chain(
                datafusion_grad::tensor::functions()
                    .iter()
                    .map(|f| f.name().to_string()),
            )
            .collect()
    }

    /// The capsule stock datafusion-python imports (`udf(obj)`).
    #[pyo3(signature = (*_args))]
    fn __datafusion_scalar_udf__<'py>(
        &self,
        py: Python<'py>,
        _args: Bound<'py, pyo3::types::PyTuple>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let udf = datafusion_grad::session_context()
            .udf(&self.name)
            .map_err(crate::errors::to_py)?;
        capsule::export(py, FFI_ScalarUDF::from(udf), "datafusion_scalar_udf")
    }
}

/// `tensor_sum` or `tensor_avg` as a `datafusion_aggregate_udf` capsule.
#[pyclass(
    name = "AggregateFunction",
    module = "datafusion_grad._internal",
    frozen
)]
pub struct PyAggregateFunction {
    name: String,
}

#[pymethods]
impl PyAggregateFunction {
    /// The aggregate `name`.
    #[new]
    fn new(name: &str) -> PyResult<Self> {
        if !Self::names().iter().any(|n| n == name) {
            return Err(PyTypeError::new_err(format!(
                "no datafusion_grad aggregate {name:?}; expected tensor_sum or tensor_avg"
            )));
        }
        Ok(Self {
            name: name.to_string(),
        })
    }

    /// Every name `AggregateFunction` accepts.
    #[staticmethod]
    fn names() -> Vec<String> {
        datafusion_grad::tensor::aggregates()
            .iter()
            .map(|a| a.name().to_string())
            .collect()
    }

    /// The capsule stock datafusion-python imports (`udaf(obj)`).
    #[pyo3(signature = (*_args))]
    fn __datafusion_aggregate_udf__<'py>(
        &self,
        py: Python<'py>,
        _args: Bound<'py, pyo3::types::PyTuple>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let udaf = datafusion_grad::session_context()
            .udaf(&self.name)
            .map_err(crate::errors::to_py)?;
        capsule::export(py, FFI_AggregateUDF::from(udaf), "datafusion_aggregate_udf")
    }
}

/// The table function `grad_query(sql)` as a `datafusion_table_function`
/// capsule.
#[pyclass(
    name = "GradQueryFunction",
    module = "datafusion_grad._internal",
    frozen
)]
#[derive(Default)]
pub struct PyGradQuery;

#[pymethods]
impl PyGradQuery {
    #[new]
    fn new() -> Self {
        Self
    }

    /// The capsule stock datafusion-python imports (`udtf(obj, name)`);
    /// `session` is the stock session, whose logical codec encodes arguments.
    fn __datafusion_table_function__<'py>(
        &self,
        py: Python<'py>,
        session: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let codec = logical_codec(&session)?;
        let function = FFI_TableFunction::new_with_ffi_codec(
            Arc::new(GradQuery),
            Some(runtime().handle().clone()),
            codec,
        );
        capsule::export(py, function, "datafusion_table_function")
    }
}

/// The query planner that differentiates, as a `datafusion_query_planner`
/// capsule for `ctx.set_query_planner`. It replaces the session's planner:
/// plans are differentiated, then planned with DataFusion's own physical
/// planner and optimizer rules in a session of ours over the caller's
/// catalogs, configuration and functions.
#[pyclass(name = "GradPlanner", module = "datafusion_grad._internal", frozen)]
#[derive(Default)]
pub struct PyGradPlanner;

#[pymethods]
impl PyGradPlanner {
    #[new]
    fn new() -> Self {
        Self
    }

    /// The capsule `ctx.set_query_planner` imports; `session` is the stock
    /// session (its task context provider resolves plan contents).
    #[pyo3(signature = (session = None))]
    fn __datafusion_query_planner__<'py>(
        &self,
        py: Python<'py>,
        session: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let Some(session) = session else {
            return Err(PyTypeError::new_err(
                "GradPlanner needs the session it is installed on: use ctx.set_query_planner(planner) \
                 or datafusion_grad.install(ctx)",
            ));
        };
        // The session's codec chains, which carry ByReferenceCodec when the
        // planner is installed through GradExtension.
        let logical = logical_codec(&session)?;
        // SAFETY: the protocol pairs this capsule name with the type.
        let physical: FFI_PhysicalExtensionCodec = unsafe {
            capsule::import(
                &session,
                "__datafusion_physical_extension_codec__",
                "datafusion_physical_extension_codec",
            )
        }?;
        let ffi = FFI_QueryPlanner::new_with_ffi_codecs(Arc::new(GradPlanner), logical, physical);
        capsule::export(py, ffi, "datafusion_query_planner")
    }
}

/// The [`ByReference`] codec as the logical and physical extension codec of
/// a stock session (`SessionExtensionComponents`), bound to `ctx`'s task
/// context provider.
#[pyclass(
    name = "ByReferenceCodec",
    module = "datafusion_grad._internal",
    frozen
)]
pub struct PyByReferenceCodec {
    provider: FFI_TaskContextProvider,
}

#[pymethods]
impl PyByReferenceCodec {
    #[new]
    fn new(ctx: Bound<'_, PyAny>) -> PyResult<Self> {
        // SAFETY: the protocol pairs this capsule name with the type.
        let provider: FFI_TaskContextProvider = unsafe {
            capsule::import(
                &ctx,
                "__datafusion_task_context_provider__",
                "datafusion_task_context_provider",
            )
        }?;
        Ok(Self { provider })
    }

    /// The id the session tags this codec's payloads with.
    #[classattr]
    fn __datafusion_codec_id__() -> &'static str {
        "datafusion_grad.by_reference"
    }

    #[pyo3(signature = (session = None))]
    fn __datafusion_logical_extension_codec__<'py>(
        &self,
        py: Python<'py>,
        session: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = session;
        let codec = FFI_LogicalExtensionCodec::new(
            Arc::new(ByReference),
            Some(runtime().handle().clone()),
            self.provider.clone(),
        );
        capsule::export(py, codec, "datafusion_logical_extension_codec")
    }

    #[pyo3(signature = (session = None))]
    fn __datafusion_physical_extension_codec__<'py>(
        &self,
        py: Python<'py>,
        session: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = session;
        let codec = FFI_PhysicalExtensionCodec::new(
            Arc::new(ByReference),
            Some(runtime().handle().clone()),
            self.provider.clone(),
        );
        capsule::export(py, codec, "datafusion_physical_extension_codec")
    }
}

/// The session's logical extension codec (arguments and plans are encoded
/// with it).
fn logical_codec(session: &Bound<'_, PyAny>) -> PyResult<FFI_LogicalExtensionCodec> {
    // SAFETY: the protocol pairs this capsule name with the type.
    unsafe {
        capsule::import(
            session,
            "__datafusion_logical_extension_codec__",
            "datafusion_logical_extension_codec",
        )
    }
}

/// A session of ours over the caller's catalogs, configuration and functions,
/// with datafusion-grad installed.
pub(crate) fn session_over(session: &dyn Session) -> SessionContext {
    let mut config = session.config().clone();
    // The caller's catalog list is shared: never replace its default catalog.
    config
        .options_mut()
        .catalog
        .create_default_catalog_and_schema = false;
    let state = SessionStateBuilder::new()
        .with_config(config)
        .with_default_features()
        .with_catalog_list(session.catalog_list())
        .build();
    let ctx = SessionContext::new_with_state(state);
    datafusion_grad::register(&ctx);
    // Only the caller's configuration extensions: DataFusion 55's
    // FFI_ConfigOptions lists an extension's entries without their prefix
    // (e.g. `tensor_device`), so a session carrying our `datafusion_grad`
    // settings fails every FFI round trip with "could not find config
    // namespace". Without them the settings take their defaults.
    ctx.state_ref()
        .write()
        .config_mut()
        .options_mut()
        .extensions = session.config().options().extensions.clone();
    // The caller's own functions (e.g. its Python UDFs) plan too; ours and
    // DataFusion's built-ins stay native.
    for udf in session.scalar_functions().values() {
        if ctx.udf(udf.name()).is_err() {
            ctx.register_udf(udf.as_ref().clone());
        }
    }
    for udaf in session.aggregate_functions().values() {
        if ctx.udaf(udaf.name()).is_err() {
            ctx.register_udaf(udaf.as_ref().clone());
        }
    }
    for udwf in session.window_functions().values() {
        if ctx.udwf(udwf.name()).is_err() {
            ctx.register_udwf(udwf.as_ref().clone());
        }
    }
    ctx
}

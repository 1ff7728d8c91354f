//! Tensor columns: vectors and matrices as Arrow fixed-size lists, with
//! differentiable SQL functions whose kernels run over whole batches.
//!
//! A vector is `FixedSizeList<Float64, n>`, a matrix
//! `FixedSizeList<FixedSizeList<Float64, c>, r>` (row-major); see [`shape`].
//! Each function is a [`function::Spec`] (its documentation, result shape
//! and batch kernel) in the module of its family: [`elementwise`],
//! [`reduce`], [`linalg`], [`rowwise`], [`construct`]; `tensor_sum` and
//! `tensor_avg` are aggregates ([`aggregate`]). Their derivative rules are in
//! [`crate::rules::tensor`], in the same table as the scalar rules, so
//! `grad(cross_entropy(matvec(w, x), label), w)` is a tensor of `w`'s shape.
//!
//! The functions compute with the dense `f64` kernels of [`kernels`]; the
//! matrix products (`matmul`, `matmul_tn`, `matmul_nt`, in a [`gemm_form`])
//! run on the CPU or on cuBLAS ([`linalg`] chooses; `cuda`, cargo feature
//! `cuda`) as the session's `datafusion_grad.tensor_device` setting
//! ([`crate::options::Device`]) says.
//!
//! Dependencies run one way: this module reads that setting from
//! [`crate::options`], which imports nothing from here; inside, the function
//! families import [`function`], [`shape`] and [`kernels`], [`linalg`]
//! imports `cuda`, and both import [`gemm_form`], which imports only
//! [`kernels`].
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> datafusion::error::Result<()> {
//! let ctx = datafusion_grad::session_context();
//! let df = ctx
//!     .sql("SELECT grad(dot(w, w), w) AS g FROM (SELECT tensor([1.0, 2.0], 2) AS w)")
//!     .await?;
//! let batches = df.collect().await?;
//! let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches)?.to_string();
//! assert!(text.contains("[2.0, 4.0]"));
//! # Ok(())
//! # }
//! ```

pub mod aggregate;
pub mod batch;
pub mod construct;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod elementwise;
pub mod function;
pub mod gemm_form;
pub mod kernels;
pub mod linalg;
pub mod reduce;
pub mod rowwise;
pub mod shape;

use std::sync::Arc;

use datafusion::logical_expr::expr::{AggregateFunction, ScalarFunction};
use datafusion::logical_expr::{AggregateUDF, Expr, ScalarUDF};
use datafusion::prelude::SessionContext;

pub use shape::Shape;

/// The specs of every tensor scalar function but the `tensor` constructor.
fn specs() -> impl Iterator<Item = &'static function::Spec> {
    elementwise::SPECS
        .iter()
        .chain(reduce::SPECS)
        .chain(linalg::SPECS)
        .chain(rowwise::SPECS)
        .chain([
            &construct::RESHAPE,
            &construct::RANDOM_TENSOR,
            &construct::ONE_HOT,
        ])
}

/// Every tensor scalar function.
pub fn functions() -> Vec<ScalarUDF> {
    specs()
        .map(|s| ScalarUDF::new_from_impl(function::TensorFunction::new(s)))
        .chain(std::iter::once(ScalarUDF::new_from_impl(
            construct::TensorConstructor::default(),
        )))
        .collect()
}

/// The tensor aggregates `tensor_sum` and `tensor_avg`.
pub fn aggregates() -> Vec<AggregateUDF> {
    vec![
        AggregateUDF::new_from_impl(aggregate::TensorAggregate::sum()),
        AggregateUDF::new_from_impl(aggregate::TensorAggregate::avg()),
    ]
}

/// Registers every tensor function and aggregate in `ctx`.
pub fn register(ctx: &SessionContext) {
    for f in functions() {
        ctx.register_udf(f);
    }
    for a in aggregates() {
        ctx.register_udaf(a);
    }
}

/// Whether `name` is one of the tensor scalar functions (all of them are
/// strict — NULL when an argument is — and never raise an error on values).
pub fn is_tensor_function(name: &str) -> bool {
    specs().any(|s| s.name == name)
}

/// A call of the tensor function `name` (one of [`functions`]) on `args`.
pub fn call(name: &str, args: Vec<Expr>) -> Expr {
    static UDFS: std::sync::OnceLock<Vec<Arc<ScalarUDF>>> = std::sync::OnceLock::new();
    let udfs = UDFS.get_or_init(|| functions().into_iter().map(Arc::new).collect());
    let udf = udfs
        .iter()
        .find(|f| f.name() == name)
        .unwrap_or_else(|| panic!("`{name}` is not a tensor function"));
    Expr::ScalarFunction(ScalarFunction::new_udf(Arc::clone(udf), args))
}

/// A call of the tensor aggregate `name` (`tensor_sum` or `tensor_avg`) on
/// `arg`, over all rows of the group.
pub fn aggregate_call(name: &str, arg: Expr) -> Expr {
    let udaf = aggregates()
        .into_iter()
        .find(|a| a.name() == name)
        .unwrap_or_else(|| panic!("`{name}` is not a tensor aggregate"));
    Expr::AggregateFunction(AggregateFunction::new_udf(
        Arc::new(udaf),
        vec![arg],
        false,
        None,
        vec![],
        None,
    ))
}

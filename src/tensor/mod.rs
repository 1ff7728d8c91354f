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
pub mod kernels;
pub mod linalg;
pub mod reduce;
pub mod rowwise;
pub mod shape;

use std::sync::Arc;

use datafusion::common::config::{ConfigField, ConfigOptions, Visit};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{AggregateUDF, Expr, ScalarUDF};
use datafusion::prelude::SessionContext;

use crate::options::GradOptions;

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

/// Where the matrix products (`matmul`, `matmul_tn`, `matmul_nt`) run: the
/// value of the `datafusion_grad.tensor_device` setting. Every other tensor
/// function runs on the CPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Device {
    /// The GPU when this build has the `cuda` feature, a CUDA device is
    /// present and the product is large enough to gain from it; else the CPU.
    #[default]
    Auto,
    /// Always the CPU kernels.
    Cpu,
    /// Always the GPU (cuBLAS); a `device_unavailable` error where there is
    /// none (or the build lacks the `cuda` feature).
    Gpu,
}

impl Device {
    /// The device chosen by `options` (the default where the
    /// `datafusion_grad` settings are not registered).
    pub fn of(options: &ConfigOptions) -> Self {
        options
            .extensions
            .get::<GradOptions>()
            .map(|o| o.tensor_device)
            .unwrap_or_default()
    }
}

impl std::str::FromStr for Device {
    type Err = DataFusionError;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Device::Auto),
            "cpu" => Ok(Device::Cpu),
            "gpu" => Ok(Device::Gpu),
            _ => Err(DataFusionError::Configuration(format!(
                "datafusion_grad.tensor_device must be one of auto, cpu, gpu; got '{s}'"
            ))),
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Device::Auto => "auto",
            Device::Cpu => "cpu",
            Device::Gpu => "gpu",
        })
    }
}

impl ConfigField for Device {
    fn visit<V: Visit>(&self, v: &mut V, key: &str, description: &'static str) {
        v.some(key, self, description)
    }

    fn set(&mut self, key: &str, value: &str) -> Result<()> {
        if !key.is_empty() {
            return Err(DataFusionError::Configuration(format!(
                "datafusion_grad.tensor_device has no field {key}"
            )));
        }
        *self = value.parse()?;
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_setting() {
        let mut options = ConfigOptions::default();
        // Not registered: the default.
        assert_eq!(Device::of(&options), Device::Auto);
        assert!(options.set("datafusion_grad.tensor_device", "gpu").is_err());
        options.extensions.insert(GradOptions::default());
        assert_eq!(Device::of(&options), Device::Auto);
        for (value, device) in [
            ("cpu", Device::Cpu),
            ("GPU", Device::Gpu),
            (" auto ", Device::Auto),
        ] {
            options.set("datafusion_grad.tensor_device", value).unwrap();
            assert_eq!(Device::of(&options), device);
            assert_eq!(device.to_string().parse::<Device>().unwrap(), device);
        }
        let err = options
            .set("datafusion_grad.tensor_device", "tpu")
            .unwrap_err();
        assert!(
            err.to_string().contains("auto, cpu, gpu; got 'tpu'"),
            "{err}"
        );
        assert_eq!(
            Device::of(&options),
            Device::Auto,
            "a refused value changes nothing"
        );
        let entries = options.entries();
        let entry = entries
            .iter()
            .find(|e| e.key.ends_with("tensor_device"))
            .expect("listed with the other settings");
        assert_eq!(entry.value.as_deref(), Some("auto"));
    }

    #[test]
    fn register_keeps_a_configured_device() {
        let options = GradOptions::with_device(Device::Cpu);
        let config = datafusion::prelude::SessionConfig::new().with_option_extension(options);
        let ctx = crate::session_context_with_config(config);
        assert_eq!(Device::of(ctx.state().config_options()), Device::Cpu);
        let ctx = crate::session_context();
        assert_eq!(Device::of(ctx.state().config_options()), Device::Auto);
    }

    #[test]
    fn auto_threshold() {
        // The MLP's first layer (2000 samples, 784 -> 20) qualifies, and so
        // do products of 2^21 multiply-adds or more, alone or in a batch,
        // with 8 or more multiply-adds per element moved; small products,
        // and large ones with little work per element, do not.
        assert!(linalg::gpu_worthwhile(2000, 20, 784, 1));
        assert!(linalg::gpu_worthwhile(64, 64, 4096, 1));
        assert!(!linalg::gpu_worthwhile(2000, 10, 20, 1));
        assert!(!linalg::gpu_worthwhile(1 << 12, 1 << 12, 1, 1));
        assert!(!linalg::gpu_worthwhile(4096, 1, 4096, 1));
        assert!(!linalg::gpu_worthwhile(127, 128, 128, 1));
        assert!(linalg::gpu_worthwhile(128, 128, 128, 1));
        assert!(!linalg::gpu_worthwhile(64, 64, 64, 1));
        assert!(linalg::gpu_worthwhile(64, 64, 64, 8));
        assert!(linalg::gpu_worthwhile(32, 32, 32, 256));
        assert!(!linalg::gpu_worthwhile(16, 16, 16, 1024));
    }
}

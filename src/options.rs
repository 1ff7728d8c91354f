//! datafusion-grad's settings, under the `datafusion_grad` prefix of
//! DataFusion's configuration, so SQL can change them:
//!
//! ```sql
//! SET datafusion_grad.tensor_device = 'cpu';
//! SET datafusion_grad.broadcast_aggregate = false;
//! SET datafusion_grad.ballista_timeout_seconds = 3600;
//! ```

use datafusion::common::config::ConfigExtension;
use datafusion::common::extensions_options;
use datafusion::prelude::SessionContext;

use crate::tensor::Device;

extensions_options! {
    /// The `datafusion_grad.*` settings.
    pub struct GradOptions {
        /// Where matmul, matmul_tn and matmul_nt run: auto (the GPU for large
        /// products when a CUDA device is present, else the CPU), cpu, or gpu
        /// (an error where no GPU can be used).
        pub tensor_device: Device, default = Device::Auto
        /// Whether a GROUP BY over the left side of a cross join (a training
        /// loop's parameters) runs as a broadcast aggregation
        /// (`BroadcastAggregateExec`) instead of hashing every joined row.
        pub broadcast_aggregate: bool, default = true
        /// Seconds a Ballista client waits for one distributed query (one
        /// iteration of a recursive query) before it fails with a
        /// `cluster_timeout` error; 0: no bound.
        pub ballista_timeout_seconds: u64, default = 600
    }
}

impl GradOptions {
    /// The settings with `tensor_device` = `device`, e.g. for
    /// `SessionConfig::new().with_option_extension(GradOptions::with_device(Device::Cpu))`.
    pub fn with_device(device: Device) -> Self {
        Self {
            tensor_device: device,
            ..Self::default()
        }
    }
}

impl ConfigExtension for GradOptions {
    const PREFIX: &'static str = "datafusion_grad";
}

/// Adds the settings to `ctx`'s configuration unless it has them already.
pub fn register(ctx: &SessionContext) {
    let state = ctx.state_ref();
    let mut state = state.write();
    let extensions = &mut state.config_mut().options_mut().extensions;
    if extensions.get::<GradOptions>().is_none() {
        extensions.insert(GradOptions::default());
    }
}

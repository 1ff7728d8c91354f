//! datafusion-grad's settings, under the `datafusion_grad` prefix of
//! DataFusion's configuration, so SQL can change them:
//!
//! ```sql
//! SET datafusion_grad.tensor_device = 'cpu';
//! SET datafusion_grad.broadcast_aggregate = false;
//! SET datafusion_grad.contraction = false;
//! SET datafusion_grad.cache_loop_invariants = false;
//! SET datafusion_grad.spread_iterations = true;
//! SET datafusion_grad.ballista_timeout_seconds = 3600;
//! SET datafusion_grad.max_iterations = 1000000;
//! SET datafusion_grad.recursion_mode = 'reverse';
//! SET datafusion_grad.checkpoint_every = 10;
//! ```
//!
//! This module is a leaf: it imports nothing from the rest of the crate, and
//! the modules that read a setting ([`crate::tensor`], `broadcast`, the
//! Ballista client) import it, one way. So the settings' value types live
//! here too — [`Device`], the value of `tensor_device`, although only the
//! tensor functions read it — as DataFusion keeps the value types of its own
//! settings (e.g. `SpillCompression`) beside `ConfigOptions` in
//! `datafusion_common::config`, which its operators import.

use datafusion::common::config::{
    ConfigEntry, ConfigExtension, ConfigField, ConfigOptions, ExtensionOptions, Visit,
};
use datafusion::common::config_namespace;
use datafusion::error::{DataFusionError, Result};
use datafusion::prelude::SessionContext;

/// `FromStr`, `Display` and `ConfigField` for the value type `$ty` of the
/// setting `datafusion_grad.$key`: one word per variant, any case, an
/// unknown word a configuration error naming the choices.
macro_rules! word_setting {
    ($ty:ident, $key:literal, { $($variant:ident => $word:literal),+ $(,)? }) => {
        impl std::str::FromStr for $ty {
            type Err = DataFusionError;

            fn from_str(s: &str) -> Result<Self> {
                match s.trim().to_ascii_lowercase().as_str() {
                    $($word => Ok($ty::$variant),)+
                    _ => Err(DataFusionError::Configuration(format!(
                        concat!("datafusion_grad.", $key, " must be one of {}; got '{}'"),
                        [$($word),+].join(", "),
                        s
                    ))),
                }
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(match self {
                    $($ty::$variant => $word,)+
                })
            }
        }

        impl ConfigField for $ty {
            fn visit<V: Visit>(&self, v: &mut V, key: &str, description: &'static str) {
                v.some(key, self, description)
            }

            fn set(&mut self, key: &str, value: &str) -> Result<()> {
                if !key.is_empty() {
                    return Err(DataFusionError::Configuration(format!(
                        concat!("datafusion_grad.", $key, " has no field {}"),
                        key
                    )));
                }
                *self = value.parse()?;
                Ok(())
            }
        }
    };
}

config_namespace! {
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
        /// Whether a GROUP BY of sums of products over an inner equijoin (a
        /// matrix product written as join + SUM) runs as a contraction
        /// (`ContractionExec`) instead of building the joined rows.
        pub contraction: bool, default = true
        /// Whether the parts of a recursive query's recursive term that do
        /// not read the work table (the data of a training loop) are
        /// computed in the first iteration and kept in memory for the
        /// others (`LoopInvariantExec`), instead of read every iteration.
        pub cache_loop_invariants: bool, default = true
        /// Whether the rows a recursive query's iterations pass on are dealt
        /// round-robin over `target_partitions` in every iteration, as
        /// DataFusion plans it, instead of kept in their partitions
        /// (`SerialIterations`).
        pub spread_iterations: bool, default = false
        /// Seconds a Ballista client waits for one distributed query (one
        /// iteration of a recursive query) before it fails with a
        /// `cluster_timeout` error; 0: no bound.
        pub ballista_timeout_seconds: u64, default = 600
        /// The most bytes of loop-invariant data (a training loop's decoded
        /// data) one Ballista executor keeps across the iterations of
        /// recursive queries (`KeptOnExecutorsExec`); what does not fit is
        /// read again in every iteration; 0 keeps nothing.
        pub ballista_kept_bytes: u64, default = 2 * 1024 * 1024 * 1024
        /// Set by the Ballista client on the queries it runs for the
        /// iterations of one recursive query (a key of that run), so that
        /// the executors keep their loop-invariant data; empty otherwise.
        /// Not a setting for users.
        pub ballista_loop_run: String, default = String::new()
        /// The most iterations of a recursive query that may produce rows
        /// before it fails with an `iteration_limit` error (a stop
        /// condition never met); 0: no bound.
        pub max_iterations: u64, default = 100_000
        /// How derivatives through a recursive query's iterations are taken:
        /// auto (by cost: forward mode for number variables, and for tensor
        /// variables of at most 16 elements asked for at every row; reverse
        /// mode otherwise), forward (tangent columns carried through the
        /// iterations) or reverse (the iterations replayed backwards).
        pub recursion_mode: RecursionMode, default = RecursionMode::Auto
        /// In reverse mode through a recursive query (a row-wise loop's
        /// replay, or the backward recursion of a loop whose step
        /// aggregates), every how many iterations a state is kept (the
        /// others are recomputed from the one kept before them); 0: about
        /// the square root of the iteration count, so memory grows like √T
        /// states; 1: every state.
        pub checkpoint_every: u64, default = 0
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

/// DataFusion's `extensions_options!` lists an extension's settings
/// without its prefix (`tensor_device`), so a Ballista client, which sends
/// a query's settings as these entries, sent ours under names the
/// scheduler and executors could not set; listed here by their full names
/// (`datafusion_grad.tensor_device`), as `SET` takes them.
impl ExtensionOptions for GradOptions {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }

    fn cloned(&self) -> Box<dyn ExtensionOptions> {
        Box::new(self.clone())
    }

    fn set(&mut self, key: &str, value: &str) -> Result<()> {
        ConfigField::set(self, key, value)
    }

    fn entries(&self) -> Vec<ConfigEntry> {
        struct Entries(Vec<ConfigEntry>);
        impl Visit for Entries {
            fn some<V: std::fmt::Display>(
                &mut self,
                key: &str,
                value: V,
                description: &'static str,
            ) {
                self.0.push(ConfigEntry {
                    key: key.to_string(),
                    value: Some(value.to_string()),
                    description,
                });
            }

            fn none(&mut self, key: &str, description: &'static str) {
                self.0.push(ConfigEntry {
                    key: key.to_string(),
                    value: None,
                    description,
                });
            }
        }
        let mut entries = Entries(Vec::new());
        ConfigField::visit(self, &mut entries, Self::PREFIX, "");
        entries.0
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

impl GradOptions {
    /// The setting `pick` chooses in `options`: its default where the
    /// `datafusion_grad` settings are not registered.
    pub fn setting<T>(options: &ConfigOptions, pick: impl FnOnce(&GradOptions) -> T) -> T {
        match options.extensions.get::<GradOptions>() {
            Some(registered) => pick(registered),
            None => pick(&GradOptions::default()),
        }
    }
}

impl Device {
    /// The device chosen by `options` (the default where the
    /// `datafusion_grad` settings are not registered).
    pub fn of(options: &ConfigOptions) -> Self {
        GradOptions::setting(options, |o| o.tensor_device)
    }
}

word_setting!(Device, "tensor_device", {
    Auto => "auto",
    Cpu => "cpu",
    Gpu => "gpu",
});

/// How derivatives through a recursive query's iterations are taken: the
/// value of the `datafusion_grad.recursion_mode` setting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum RecursionMode {
    /// Reverse mode where a variable flows into a tensor (or other compound)
    /// column, forward mode otherwise.
    #[default]
    Auto,
    /// Tangent columns carried through the iterations: cheap for a few
    /// float variables.
    Forward,
    /// The iterations replayed backwards from each row (checkpointed, see
    /// `checkpoint_every`): for tensor states and many variables.
    Reverse,
}

impl RecursionMode {
    /// The mode chosen by `options` (the default where the
    /// `datafusion_grad` settings are not registered).
    pub fn of(options: &ConfigOptions) -> Self {
        GradOptions::setting(options, |o| o.recursion_mode)
    }
}

word_setting!(RecursionMode, "recursion_mode", {
    Auto => "auto",
    Forward => "forward",
    Reverse => "reverse",
});

/// Adds the settings to `ctx`'s configuration unless it has them already.
pub fn register(ctx: &SessionContext) {
    let state = ctx.state_ref();
    let mut state = state.write();
    let extensions = &mut state.config_mut().options_mut().extensions;
    if extensions.get::<GradOptions>().is_none() {
        extensions.insert(GradOptions::default());
    }
}

//! Unit tests of `src/options.rs`: the `datafusion_grad.tensor_device`
//! setting.

use datafusion::common::config::ConfigOptions;
use datafusion_grad::options::{Device, GradOptions};

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
    // by the name SET takes (what a Ballista client sends)
    let entry = entries
        .iter()
        .find(|e| e.key == "datafusion_grad.tensor_device")
        .expect("listed with the other settings");
    assert_eq!(entry.value.as_deref(), Some("auto"));
}

#[test]
fn register_keeps_a_configured_device() {
    let options = GradOptions::with_device(Device::Cpu);
    let config = datafusion::prelude::SessionConfig::new().with_option_extension(options);
    let ctx = datafusion_grad::session_context_with_config(config);
    assert_eq!(Device::of(ctx.state().config_options()), Device::Cpu);
    let ctx = datafusion_grad::session_context();
    assert_eq!(Device::of(ctx.state().config_options()), Device::Auto);
}

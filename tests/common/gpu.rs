//! What the GPU tests share (cargo feature `cuda`): skipping where no CUDA
//! device can be used, and comparing the GPU's numbers with the CPU's.

use datafusion_grad::tensor::cuda;

/// Whether no CUDA device can be used: the test then prints `skipped: no
/// CUDA device` and passes, or fails where `DFGRAD_REQUIRE_GPU=1` says a
/// GPU must be there.
pub fn no_device() -> bool {
    match cuda::unavailable_reason() {
        Some(reason) if std::env::var("DFGRAD_REQUIRE_GPU").is_ok_and(|v| v == "1") => {
            panic!("DFGRAD_REQUIRE_GPU=1 but no CUDA device can be used: {reason}")
        }
        Some(reason) => {
            println!("skipped: no CUDA device ({reason})");
            true
        }
        None => false,
    }
}

/// max |gpu - cpu| ≤ 1e-12 · max(1, max |cpu|), over some values.
pub fn assert_close(what: &str, gpu: &[f64], cpu: &[f64]) {
    assert_eq!(gpu.len(), cpu.len(), "{what}: lengths");
    assert!(!cpu.is_empty(), "{what}: no values");
    let scale = cpu.iter().fold(1.0f64, |s, v| s.max(v.abs()));
    let worst = gpu
        .iter()
        .zip(cpu)
        .map(|(g, c)| (g - c).abs())
        .fold(0.0f64, f64::max);
    assert!(
        worst <= 1e-12 * scale,
        "{what}: max |gpu - cpu| = {worst:e} (scale {scale})"
    );
}

//! Unit tests of `src/tensor/linalg.rs`: when `auto` runs a product on the
//! GPU.

use datafusion_grad::tensor::linalg::gpu_worthwhile;

#[test]
fn auto_threshold() {
    // The MLP's first layer (2000 samples, 784 -> 20) qualifies, and so
    // do products of 2^22 multiply-adds or more, alone or in a batch,
    // with 7 or more multiply-adds per element moved; small products,
    // and large ones with little work per element, do not.
    assert!(gpu_worthwhile(2000, 20, 784, 1));
    assert!(gpu_worthwhile(64, 64, 4096, 1));
    assert!(!gpu_worthwhile(2000, 10, 20, 1));
    assert!(gpu_worthwhile(2048, 8, 2048, 1));
    assert!(!gpu_worthwhile(1 << 12, 1 << 12, 1, 1));
    assert!(!gpu_worthwhile(4096, 1, 4096, 1));
    assert!(!gpu_worthwhile(128, 128, 128, 1));
    assert!(gpu_worthwhile(128, 128, 256, 1));
    assert!(gpu_worthwhile(192, 192, 192, 1));
    assert!(!gpu_worthwhile(64, 64, 64, 8));
    assert!(gpu_worthwhile(64, 64, 64, 16));
    assert!(gpu_worthwhile(32, 32, 32, 256));
    assert!(!gpu_worthwhile(16, 16, 16, 1024));
}

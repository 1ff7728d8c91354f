//! The matrix products on the GPU (cuBLAS) against the CPU kernels, per
//! shape and batch size: the figures behind `auto`'s thresholds
//! (`datafusion_grad::tensor::linalg::GPU_MIN_WORK` and `GPU_MIN_INTENSITY`).
//!
//! Each case times one *batch*: `rows` products of one shape, as one
//! `matmul` call over a column of `rows` matrices computes them. `cpu` is
//! the CPU kernel on one thread, row after row (DataFusion runs one batch on
//! one core); `gpu` is [`cuda::gemm_batched`], transfers both ways included.
//! `Throughput::Elements` counts `2·m·n·k·rows` floating-point operations.
//! The cases sweep square sizes (work), outer products and matrix-vector
//! products (arithmetic per element moved), and the MLP's shapes.
//!
//! Run with `cargo bench --features cuda --bench gpu_gemm` (append e.g.
//! `-- --warm-up-time 0.3 --measurement-time 1` for a quick pass). Without a
//! CUDA device it prints why and measures nothing.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use datafusion_grad::tensor::construct::random_values;
use datafusion_grad::tensor::cuda::{self, Operand};
use datafusion_grad::tensor::gemm_form::Form;
use datafusion_grad::tensor::linalg::gpu_worthwhile;

/// One case: a name, the form and the product shape (m, n, k), `rows`
/// products in the batch.
struct Case {
    name: &'static str,
    form: Form,
    m: usize,
    n: usize,
    k: usize,
    rows: usize,
}

fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for s in [16, 32, 64, 128, 192, 256, 384, 512, 1024, 2048] {
        cases.push(Case {
            name: "square",
            form: Form::NN,
            m: s,
            n: s,
            k: s,
            rows: 1,
        });
    }
    for (s, rows) in [(16, 1024), (32, 256), (64, 64), (128, 16), (256, 4)] {
        cases.push(Case {
            name: "square_batch",
            form: Form::NN,
            m: s,
            n: s,
            k: s,
            rows,
        });
    }
    for s in [512, 2048, 4096] {
        // Outer products (k = 1) and matrix-vector products (n = 1): one or
        // two multiply-adds per element moved.
        cases.push(Case {
            name: "outer",
            form: Form::NN,
            m: s,
            n: s,
            k: 1,
            rows: 1,
        });
        cases.push(Case {
            name: "matvec",
            form: Form::NN,
            m: s,
            n: 1,
            k: s,
            rows: 1,
        });
    }
    for (m, n, k) in [(2048, 8, 2048), (2048, 32, 2048), (2048, 128, 2048)] {
        // Thin products: intensity about n multiply-adds per element moved.
        cases.push(Case {
            name: "thin",
            form: Form::NN,
            m,
            n,
            k,
            rows: 1,
        });
    }
    // The MLP (examples/mlp.sql, batch 2000): X·W1, Xᵀ·G, G·W1ᵀ, H·W2.
    for (name, form, m, n, k) in [
        ("mlp_xw", Form::NN, 2000, 20, 784),
        ("mlp_xtg", Form::TN, 784, 20, 2000),
        ("mlp_gwt", Form::NT, 2000, 784, 20),
        ("mlp_hw", Form::NN, 2000, 10, 20),
    ] {
        cases.push(Case {
            name,
            form,
            m,
            n,
            k,
            rows: 1,
        });
    }
    cases
}

fn gpu_vs_cpu(c: &mut Criterion) {
    match cuda::device_name() {
        Some(name) => eprintln!("GPU: {name}"),
        None => {
            eprintln!(
                "no CUDA device: {}",
                cuda::unavailable_reason().unwrap_or("unknown")
            );
            return;
        }
    }
    let mut group = c.benchmark_group("gpu_gemm");
    for Case {
        name,
        form,
        m,
        n,
        k,
        rows,
    } in cases()
    {
        let a = random_values(3.0, rows * m * k);
        let b = random_values(4.0, rows * k * n);
        let mut out = vec![0.0; rows * m * n];
        let work = m * n * k * rows;
        group.sample_size(if work >= 1 << 27 { 10 } else { 30 });
        group.throughput(Throughput::Elements(2 * work as u64));
        let auto = if gpu_worthwhile(m, n, k, rows) {
            "auto-gpu"
        } else {
            "auto-cpu"
        };
        let label = format!("{name}_{m}x{n}x{k}_b{rows}_{auto}");
        group.bench_function(BenchmarkId::new("cpu", &label), |bch| {
            bch.iter(|| {
                for r in 0..rows {
                    form.cpu(
                        m,
                        n,
                        k,
                        &a[r * m * k..(r + 1) * m * k],
                        &b[r * k * n..(r + 1) * k * n],
                        &mut out[r * m * n..(r + 1) * m * n],
                    );
                }
                black_box(&out);
            })
        });
        group.bench_function(BenchmarkId::new("gpu", &label), |bch| {
            bch.iter(|| {
                black_box(
                    cuda::gemm_batched(form, m, n, k, rows, Operand::Rows(&a), Operand::Rows(&b))
                        .expect("GPU product"),
                )
            })
        });
    }
    group.finish();
}

criterion_group!(benches, gpu_vs_cpu);
criterion_main!(benches);

//! Throughput of the dense tensor kernels (`datafusion_grad::tensor::kernels`).
//!
//! - `stream/*`: bytes moved per second (`Throughput::Bytes`, reads plus
//!   writes) for a plain `copy_from_slice` (the machine's copy bandwidth
//!   baseline) and `add`, `scale`, `axpy`, `dot`, `sum` at 1M and 8M `f64`;
//! - `gemm/*`: floating-point operations per second (`Throughput::Elements`
//!   counts `2·m·n·k`) for square `gemm` at 64, 256, 512 and 1024, and the
//!   MLP shapes: `gemm` 2000×784·784×20 (X·W1), `gemm_tn` 784×20 from
//!   2000×784 and 2000×20 (Xᵀ·G), `gemm_nt` 2000×784 from 2000×20 and 784×20
//!   (G·W1ᵀ).
//!
//! Run with `cargo bench --bench tensor_kernels` (append e.g.
//! `-- --warm-up-time 1 --measurement-time 2` for a quick pass).
//! `benches/compare_kernels.py` prints NumPy's numbers on the same shapes.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use datafusion_grad::tensor::construct::random_values;
use datafusion_grad::tensor::kernels;

fn streaming(c: &mut Criterion) {
    eprintln!("tensor kernels ISA: {}", kernels::isa());
    let mut group = c.benchmark_group("stream");
    for n in [1usize << 20, 8 << 20] {
        let label = format!("{}M", n >> 20);
        let a = random_values(1.0, n);
        let b = random_values(2.0, n);
        let mut out = vec![0.0; n];
        let bytes = |arrays: usize| Throughput::Bytes((arrays * n * 8) as u64);

        group.throughput(bytes(2));
        group.bench_function(BenchmarkId::new("copy", &label), |bch| {
            bch.iter(|| out.copy_from_slice(black_box(&a)))
        });
        group.throughput(bytes(3));
        group.bench_function(BenchmarkId::new("add", &label), |bch| {
            bch.iter(|| kernels::add(black_box(&a), black_box(&b), &mut out))
        });
        group.throughput(bytes(2));
        group.bench_function(BenchmarkId::new("scale", &label), |bch| {
            bch.iter(|| kernels::scale(black_box(&a), black_box(1.5), &mut out))
        });
        group.throughput(bytes(3));
        group.bench_function(BenchmarkId::new("axpy", &label), |bch| {
            // Alternating signs keep `out` bounded over many iterations.
            let mut alpha = 1e-3;
            bch.iter(|| {
                alpha = -alpha;
                kernels::axpy(black_box(alpha), black_box(&a), &mut out)
            })
        });
        group.throughput(bytes(2));
        group.bench_function(BenchmarkId::new("dot", &label), |bch| {
            bch.iter(|| kernels::dot(black_box(&a), black_box(&b)))
        });
        group.throughput(bytes(1));
        group.bench_function(BenchmarkId::new("sum", &label), |bch| {
            bch.iter(|| kernels::sum(black_box(&a)))
        });
    }
    group.finish();
}

/// A GEMM entry point: `(m, n, k, a, b, c, accumulate)`.
type GemmFn = fn(usize, usize, usize, &[f64], &[f64], &mut [f64], bool);

/// One GEMM case: its name, the kernel and the product shape (m, n, k).
struct Case {
    name: &'static str,
    f: GemmFn,
    m: usize,
    n: usize,
    k: usize,
}

fn gemm(c: &mut Criterion) {
    let mut cases: Vec<Case> = [64, 256, 512, 1024]
        .into_iter()
        .map(|s| Case {
            name: "gemm",
            f: kernels::gemm,
            m: s,
            n: s,
            k: s,
        })
        .collect();
    cases.extend([
        // X (2000×784) · W1 (784×20)
        Case {
            name: "gemm_mlp_xw",
            f: kernels::gemm,
            m: 2000,
            n: 20,
            k: 784,
        },
        // Xᵀ · G: X is 2000×784, G is 2000×20
        Case {
            name: "gemm_tn_mlp_xtg",
            f: kernels::gemm_tn,
            m: 784,
            n: 20,
            k: 2000,
        },
        // G · W1ᵀ: G is 2000×20, W1 is 784×20
        Case {
            name: "gemm_nt_mlp_gwt",
            f: kernels::gemm_nt,
            m: 2000,
            n: 784,
            k: 20,
        },
    ]);
    let mut group = c.benchmark_group("gemm");
    for case in cases {
        let Case { name, f, m, n, k } = case;
        let a = random_values(3.0, m * k);
        let b = random_values(4.0, k * n);
        let mut out = vec![0.0; m * n];
        if m * n * k >= 256 * 256 * 256 {
            group.sample_size(20);
        } else {
            group.sample_size(100);
        }
        group.throughput(Throughput::Elements((2 * m * n * k) as u64));
        group.bench_function(BenchmarkId::new(name, format!("{m}x{n}x{k}")), |bch| {
            bch.iter(|| f(m, n, k, black_box(&a), black_box(&b), &mut out, false))
        });
    }
    group.finish();
}

criterion_group!(benches, streaming, gemm);
criterion_main!(benches);

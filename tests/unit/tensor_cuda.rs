//! Unit tests of `src/tensor/cuda.rs` (cargo feature `cuda`): cuBLAS
//! against the CPU kernels. Each test prints `skipped: no CUDA device` and
//! passes where no GPU can be used, unless `DFGRAD_REQUIRE_GPU=1` says a GPU
//! must be there: then it fails.

#![cfg(feature = "cuda")]

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::StridedBatchedConfig;
use datafusion_grad::error::ErrorKind;
use datafusion_grad::tensor::construct::random_values;
use datafusion_grad::tensor::cuda::{
    available, cublas_call, device_name, gemm_batched, gemm_one, layout, unavailable_reason,
    Operand,
};
use datafusion_grad::tensor::gemm_form::Form;

use crate::common::gpu::{assert_close, no_device};

/// Values in [-1, 1) of the stream `seed`.
fn values(seed: u64, len: usize) -> Vec<f64> {
    random_values(seed as f64, len)
}

const SHAPES: &[(usize, usize, usize)] = &[
    (1, 1, 1),
    (1, 7, 5),
    (6, 1, 9),
    (5, 4, 1),
    (1, 1, 300),
    (3, 5, 7),
    (17, 33, 9),
    (64, 64, 64),
    (100, 3, 250),
    (2, 130, 70),
    (129, 65, 257),
];

/// `cublasDgemmStridedBatched` as its documentation defines it, on host
/// buffers: column-major, C_p = op(A_p)·op(B_p) with alpha 1 and beta 0,
/// X_p starting at p·strideX. Panics where cuBLAS would refuse the
/// arguments (CUBLAS_STATUS_INVALID_VALUE) or read or write outside the
/// buffers.
fn reference_dgemm_strided_batched(
    cfg: StridedBatchedConfig<f64>,
    a: &[f64],
    b: &[f64],
    c: &mut [f64],
) {
    use cublasOperation_t::{CUBLAS_OP_N as N, CUBLAS_OP_T as T};
    let g = cfg.gemm;
    assert_eq!((g.alpha, g.beta), (1.0, 0.0));
    let (m, n, k) = (g.m as usize, g.n as usize, g.k as usize);
    let (lda, ldb, ldc) = (g.lda as usize, g.ldb as usize, g.ldc as usize);
    assert!(g.m >= 0 && g.n >= 0 && g.k >= 0 && cfg.batch_size >= 0);
    let a_rows = if g.transa == N { m } else { k };
    let b_rows = if g.transb == N { k } else { n };
    assert!(lda >= a_rows.max(1), "lda {lda} < {a_rows}");
    assert!(ldb >= b_rows.max(1), "ldb {ldb} < {b_rows}");
    assert!(ldc >= m.max(1), "ldc {ldc} < {m}");
    assert!(cfg.stride_c as usize >= ldc * n || cfg.batch_size <= 1);
    for p in 0..cfg.batch_size as usize {
        let (ap, bp, cp) = (
            p * cfg.stride_a as usize,
            p * cfg.stride_b as usize,
            p * cfg.stride_c as usize,
        );
        for j in 0..n {
            for i in 0..m {
                let mut sum = 0.0;
                for l in 0..k {
                    let x = match g.transa {
                        N => a[ap + i + l * lda],
                        T => a[ap + l + i * lda],
                        _ => unreachable!("only N and T are used"),
                    };
                    let y = match g.transb {
                        N => b[bp + l + j * ldb],
                        T => b[bp + j + l * ldb],
                        _ => unreachable!("only N and T are used"),
                    };
                    sum += x * y;
                }
                c[cp + i + j * ldc] = sum;
            }
        }
    }
}

/// The configuration `Gpu::run` hands cuBLAS, run through the reference
/// GEMM: the row-major layout derivation, the operand order and the batch
/// strides, checked against the CPU kernels without a GPU.
#[test]
fn cublas_arguments_give_the_cpu_products() {
    for (i, &(m, n, k)) in SHAPES.iter().enumerate() {
        for rows in [1, 3] {
            let a_rows = values(30 + i as u64, rows * m * k);
            let b_rows = values(40 + i as u64, rows * k * n);
            for form in [Form::NN, Form::TN, Form::NT] {
                let cfg = layout(form, m as i32, n as i32, k as i32);
                for (a_every, b_every) in [(false, false), (false, true), (true, false)] {
                    let a = if a_every {
                        &a_rows[..m * k]
                    } else {
                        &a_rows[..]
                    };
                    let b = if b_every {
                        &b_rows[..k * n]
                    } else {
                        &b_rows[..]
                    };
                    let a_stride = if a_every { 0 } else { m * k };
                    let b_stride = if b_every { 0 } else { k * n };
                    let (batched, first, second) =
                        cublas_call(cfg, rows, (a, a_stride), (b, b_stride), m * n);
                    let mut gpu = vec![f64::NAN; rows * m * n];
                    reference_dgemm_strided_batched(batched, first, second, &mut gpu);
                    let mut cpu = vec![0.0; rows * m * n];
                    for (r, out) in cpu.chunks_exact_mut(m * n).enumerate() {
                        let a = &a[r * a_stride..r * a_stride + m * k];
                        let b = &b[r * b_stride..r * b_stride + k * n];
                        form.cpu(m, n, k, a, b, out);
                    }
                    assert_close(
                        &format!("{form:?} {m}x{n}x{k}, {rows} rows, every {a_every}/{b_every}"),
                        &gpu,
                        &cpu,
                    );
                }
            }
        }
    }
    // The derivation by hand for one case: row-major NN uses no transposes.
    let cfg = layout(Form::NN, 2, 5, 3);
    assert_eq!(
        (cfg.m, cfg.n, cfg.k, cfg.lda, cfg.ldb, cfg.ldc),
        (5, 2, 3, 5, 3, 5)
    );
}

#[test]
fn single_products_match_the_cpu() {
    if no_device() {
        return;
    }
    for (i, &(m, n, k)) in SHAPES.iter().enumerate() {
        let a = values(2 * i as u64, m * k);
        let b = values(2 * i as u64 + 1, k * n);
        for form in [Form::NN, Form::TN, Form::NT] {
            let gpu = gemm_one(form, m, n, k, &a, &b).unwrap();
            let mut cpu = vec![0.0; m * n];
            form.cpu(m, n, k, &a, &b, &mut cpu);
            assert_close(&format!("{form:?} {m}x{n}x{k}"), &gpu, &cpu);
        }
    }
}

#[test]
fn a_known_product() {
    if no_device() {
        return;
    }
    // [[1,2,3],[4,5,6]] · [[1,0],[2,1],[0,3]] = [[5,11],[14,23]]
    let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let b = [1.0, 0.0, 2.0, 1.0, 0.0, 3.0];
    assert_eq!(
        gemm_one(Form::NN, 2, 2, 3, &a, &b).unwrap(),
        [5.0, 11.0, 14.0, 23.0]
    );
    // aᵀ·a (a as 2×3) and a·aᵀ
    assert_eq!(
        gemm_one(Form::TN, 3, 3, 2, &a, &a).unwrap(),
        [17.0, 22.0, 27.0, 22.0, 29.0, 36.0, 27.0, 36.0, 45.0]
    );
    assert_eq!(
        gemm_one(Form::NT, 2, 2, 3, &a, &a).unwrap(),
        [14.0, 32.0, 32.0, 77.0]
    );
}

#[test]
fn batches_with_constant_operands_match_the_cpu() {
    if no_device() {
        return;
    }
    for (i, &(m, n, k)) in SHAPES.iter().enumerate() {
        for rows in [1, 3, 8] {
            let a_rows = values(10 + i as u64, rows * m * k);
            let b_rows = values(20 + i as u64, rows * k * n);
            let a_one = &a_rows[..m * k];
            let b_one = &b_rows[..k * n];
            for form in [Form::NN, Form::TN, Form::NT] {
                let cases = [
                    ("rows×rows", Operand::Rows(&a_rows), Operand::Rows(&b_rows)),
                    ("rows×every", Operand::Rows(&a_rows), Operand::Every(b_one)),
                    ("every×rows", Operand::Every(a_one), Operand::Rows(&b_rows)),
                    ("every×every", Operand::Every(a_one), Operand::Every(b_one)),
                ];
                for (what, a, b) in cases {
                    let gpu = gemm_batched(form, m, n, k, rows, a, b).unwrap();
                    let mut cpu = vec![0.0; rows * m * n];
                    fn row(o: Operand<'_>, r: usize, size: usize) -> &[f64] {
                        match o {
                            Operand::Rows(v) => &v[r * size..(r + 1) * size],
                            Operand::Every(v) => v,
                        }
                    }
                    for (r, out) in cpu.chunks_exact_mut(m * n).enumerate() {
                        form.cpu(m, n, k, row(a, r, m * k), row(b, r, k * n), out);
                    }
                    assert_close(
                        &format!("{form:?} {what} {rows} rows of {m}x{n}x{k}"),
                        &gpu,
                        &cpu,
                    );
                }
            }
        }
    }
}

#[test]
fn empty_dimensions() {
    if no_device() {
        return;
    }
    assert_eq!(gemm_one(Form::NN, 2, 3, 0, &[], &[]).unwrap(), [0.0; 6]);
    assert!(gemm_one(Form::NN, 0, 3, 2, &[], &[0.0; 6])
        .unwrap()
        .is_empty());
    let none = gemm_batched(
        Form::TN,
        2,
        2,
        2,
        0,
        Operand::Rows(&[]),
        Operand::Every(&[1.0; 4]),
    );
    assert!(none.unwrap().is_empty());
}

#[test]
fn unavailable_is_a_typed_error() {
    let Some(reason) = unavailable_reason() else {
        println!("skipped: a CUDA device is present ({:?})", device_name());
        return;
    };
    assert!(!available());
    let err = gemm_one(Form::NN, 1, 1, 1, &[1.0], &[1.0]).unwrap_err();
    let grad = datafusion_grad::error::GradError::find(&err).expect("a GradError");
    assert_eq!(grad.kind(), ErrorKind::DeviceUnavailable);
    assert!(
        err.to_string().contains("no CUDA device/driver was found"),
        "{err}"
    );
    assert!(err.to_string().contains(reason), "{err}");
}

//! cuBLAS matrix products for `matmul`, `matmul_tn` and `matmul_nt` (cargo
//! feature `cuda`).
//!
//! The CUDA driver (`libcuda`) and cuBLAS (`libcublas`) are loaded when the
//! first product asks for the GPU (cudarc's `dynamic-loading`), so the crate
//! builds and runs without a CUDA toolkit; where either library or a device is
//! missing the GPU is recorded as unavailable, once per process, with the
//! reason ([`unavailable_reason`]). All GPU work goes through one context on
//! device 0, one stream and one cuBLAS handle, behind a mutex: DataFusion's
//! partitions take turns on the GPU.
//!
//! A batch of rows is one `cublasDgemmStridedBatched` call per chunk of rows
//! (one product per row; a constant argument is uploaded once and read with
//! batch stride 0), in `f64` like the CPU kernels.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, StridedBatchedConfig};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use datafusion::error::{DataFusionError, Result};

use super::gemm_form::Form;
use crate::error::{fail, ErrorKind};

/// One operand of a batch of matrix products.
#[derive(Debug, Clone, Copy)]
pub enum Operand<'a> {
    /// One matrix per row, back to back (`rows × size` values).
    Rows(&'a [f64]),
    /// One matrix that every row reads (a constant argument).
    Every(&'a [f64]),
}

impl<'a> Operand<'a> {
    fn values(self) -> &'a [f64] {
        match self {
            Operand::Rows(v) | Operand::Every(v) => v,
        }
    }
}

/// The most rows one cuBLAS call takes: batched routines have launched one
/// grid z-slice per matrix in some cuBLAS versions, where gridDim.z ≤ 65,535.
const MAX_BATCH: usize = 65_535;

/// The most device memory (bytes) one chunk of rows uploads and computes
/// into, so a large batch does not need its operands and result on the GPU
/// at once.
const MAX_CHUNK_BYTES: usize = 1 << 30;

/// The GPU: device 0's primary context, a stream and a cuBLAS handle on it.
struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    name: String,
}

/// The GPU, or why there is none; opened on first use.
static GPU: OnceLock<std::result::Result<Mutex<Gpu>, String>> = OnceLock::new();

fn gpu() -> std::result::Result<&'static Mutex<Gpu>, &'static str> {
    GPU.get_or_init(|| open().map(Mutex::new))
        .as_ref()
        .map_err(String::as_str)
}

/// Whether a CUDA device with cuBLAS can be used (tries once per process).
pub fn available() -> bool {
    gpu().is_ok()
}

/// The GPU's name, e.g. `NVIDIA H100 80GB HBM3`, when one can be used.
pub fn device_name() -> Option<String> {
    let gpu = gpu().ok()?;
    let gpu = gpu.lock().unwrap_or_else(PoisonError::into_inner);
    Some(gpu.name.clone())
}

/// Why no GPU can be used (e.g. the CUDA driver library is missing), or
/// `None` when one can.
pub fn unavailable_reason() -> Option<&'static str> {
    gpu().err()
}

/// Opens device 0 and a cuBLAS handle, or says why that is impossible.
fn open() -> std::result::Result<Gpu, String> {
    // cudarc panics when a library it needs cannot be loaded (or lacks a
    // symbol); the presence checks below avoid that where they can, and
    // catch_unwind turns any other panic into "unavailable".
    let opened = catch_unwind(|| {
        // SAFETY: only tries to dlopen the driver library under its usual names.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err("the CUDA driver library (libcuda.so) could not be loaded".to_string());
        }
        let count = CudaContext::device_count().map_err(|e| {
            let hint = if format!("{e:?}").contains("STUB_LIBRARY") {
                ": the libcuda.so loaded is the CUDA toolkit's stub; take the toolkit's \
                 lib/stubs folder off LD_LIBRARY_PATH"
            } else {
                ""
            };
            format!("the CUDA driver could not be initialised ({e:?}){hint}")
        })?;
        if count < 1 {
            return Err("the CUDA driver reports no device".to_string());
        }
        let ctx =
            CudaContext::new(0).map_err(|e| format!("CUDA device 0 could not be opened ({e})"))?;
        let name = ctx.name().unwrap_or_else(|_| "CUDA device 0".to_string());
        // SAFETY: only tries to dlopen cuBLAS under its usual names.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(format!(
                "found {name}, but the cuBLAS library (libcublas.so) could not be loaded \
                 (is it on LD_LIBRARY_PATH?)"
            ));
        }
        let stream = ctx.default_stream();
        let blas = CudaBlas::new(Arc::clone(&stream))
            .map_err(|e| format!("cuBLAS could not be initialised on {name} ({e})"))?;
        Ok(Gpu {
            ctx,
            stream,
            blas,
            name,
        })
    });
    opened.unwrap_or_else(|panic| Err(format!("loading CUDA failed: {}", panic_text(&*panic))))
}

fn panic_text(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("a panic")
}

/// The `device_unavailable` error of a product forced onto the GPU.
fn unavailable<T>(reason: &str) -> Result<T> {
    fail(
        ErrorKind::DeviceUnavailable,
        format!(
            "datafusion_grad.tensor_device is 'gpu', but no CUDA device/driver was found: \
             {reason} (SET datafusion_grad.tensor_device = 'auto' to use the CPU)"
        ),
    )
}

/// The cuBLAS call computing one row-major product of `form`.
///
/// cuBLAS is column-major, and a row-major r×c matrix X in memory *is* the
/// column-major c×r matrix Xᵀ with leading dimension c. So instead of the
/// row-major C = op(A)·op(B) we ask cuBLAS for the column-major
/// Cᵀ = op(B)ᵀ·op(A)ᵀ (m' = n, n' = m, k' = k, ldc = n), passing B's buffer as
/// cuBLAS's first operand and A's as its second. For each form:
///
/// - NN, C = A·B (A m×k, B k×n): Cᵀ = Bᵀ·Aᵀ. B's buffer read column-major is
///   Bᵀ (n×k, ld n): op N, lda = n. A's buffer is Aᵀ (k×m, ld k): op N,
///   ldb = k.
/// - TN, C = Aᵀ·B (A stored k×m, B k×n): Cᵀ = Bᵀ·A. B's buffer is Bᵀ (n×k,
///   ld n): op N, lda = n. A's buffer read column-major is Aᵀ (m×k, ld m),
///   and we need A (k×m): op T, ldb = m.
/// - NT, C = A·Bᵀ (A m×k, B stored n×k): Cᵀ = B·Aᵀ. B's buffer read
///   column-major is Bᵀ (k×n, ld k), and we need B (n×k): op T, lda = k.
///   A's buffer is Aᵀ (k×m, ld k): op N, ldb = k.
///
/// cuBLAS's checks then hold: with op N its first operand is m'×k' stored
/// with lda ≥ m' (n), with op T it is k'×m' stored with lda ≥ k'; likewise
/// its second is k'×n' (ldb ≥ k') or n'×k' (ldb ≥ n' = m). Leading
/// dimensions are at least 1 (cuBLAS refuses 0); callers pass no empty
/// dimension.
fn layout(form: Form, m: i32, n: i32, k: i32) -> GemmConfig<f64> {
    use cublasOperation_t::{CUBLAS_OP_N as N, CUBLAS_OP_T as T};
    let (transa, lda, transb, ldb) = match form {
        Form::NN => (N, n, N, k),
        Form::TN => (N, n, T, m),
        Form::NT => (T, k, N, k),
    };
    GemmConfig {
        transa,
        transb,
        m: n,
        n: m,
        k,
        alpha: 1.0,
        lda: lda.max(1),
        ldb: ldb.max(1),
        beta: 0.0,
        ldc: n.max(1),
    }
}

/// The `cublas<t>gemmStridedBatched` call for `count` products of a
/// [`layout`] (`cfg`): its configuration and its first and second operands.
/// cuBLAS's first operand is our B and its second our A (see [`layout`]), so
/// their batch strides swap too; a stride is the operand's size, or 0 for a
/// constant operand read by every product (cuBLAS allows a zero stride for
/// A and B, not for C).
fn cublas_call<'x, T: ?Sized>(
    cfg: GemmConfig<f64>,
    count: usize,
    (a, a_stride): (&'x T, usize),
    (b, b_stride): (&'x T, usize),
    c_size: usize,
) -> (StridedBatchedConfig<f64>, &'x T, &'x T) {
    let batched = StridedBatchedConfig {
        gemm: cfg,
        batch_size: count as i32,
        stride_a: b_stride as i64,
        stride_b: a_stride as i64,
        stride_c: c_size as i64,
    };
    (batched, b, a)
}

fn dim(name: &str, value: usize) -> Result<i32> {
    i32::try_from(value).map_err(|_| {
        DataFusionError::Execution(format!(
            "GPU matrix product: {name} = {value} is too large for cuBLAS"
        ))
    })
}

/// The `rows` products C = op(A)·op(B) of `form` (A and B as for
/// [`Form::cpu`]: m×k or k×m, k×n or n×k, row-major) on the GPU, row after
/// row: `rows × m × n` values. A `device_unavailable` error where no GPU can
/// be used (whatever the size of the problem).
pub fn gemm_batched(
    form: Form,
    m: usize,
    n: usize,
    k: usize,
    rows: usize,
    a: Operand<'_>,
    b: Operand<'_>,
) -> Result<Vec<f64>> {
    let gpu = match gpu() {
        Ok(gpu) => gpu,
        Err(reason) => return unavailable(reason),
    };
    for (name, operand, size) in [("A", a, m * k), ("B", b, k * n)] {
        let expected = match operand {
            Operand::Rows(_) => rows * size,
            Operand::Every(_) => size,
        };
        if operand.values().len() != expected {
            return Err(DataFusionError::Internal(format!(
                "GPU matrix product: {name} has {} values, expected {expected}",
                operand.values().len()
            )));
        }
    }
    let mut out = vec![0.0; rows * m * n];
    if out.is_empty() || k == 0 {
        // No product, or empty sums (zeros): nothing for the GPU to do.
        return Ok(out);
    }
    let cfg = layout(form, dim("m", m)?, dim("n", n)?, dim("k", k)?);
    let gpu = gpu.lock().unwrap_or_else(PoisonError::into_inner);
    let dims = Dims { m, n, k, cfg };
    let run = catch_unwind(AssertUnwindSafe(|| gpu.run(dims, rows, a, b, &mut out)));
    match run {
        Ok(Ok(())) => Ok(out),
        Ok(Err(e)) => Err(DataFusionError::Execution(format!(
            "GPU matrix product on {} failed: {e}",
            gpu.name
        ))),
        Err(panic) => Err(DataFusionError::Execution(format!(
            "GPU matrix product on {} panicked: {}",
            gpu.name,
            panic_text(&*panic)
        ))),
    }
}

/// C = op(A)·op(B) for one A (m×k or k×m) and B (k×n or n×k) on the GPU.
pub fn gemm_one(
    form: Form,
    m: usize,
    n: usize,
    k: usize,
    a: &[f64],
    b: &[f64],
) -> Result<Vec<f64>> {
    gemm_batched(form, m, n, k, 1, Operand::Rows(a), Operand::Rows(b))
}

/// The sizes of one product and its cuBLAS configuration.
#[derive(Clone, Copy)]
struct Dims {
    m: usize,
    n: usize,
    k: usize,
    cfg: GemmConfig<f64>,
}

impl Gpu {
    /// Computes the `rows` products into `out` (`rows × m × n`, nonempty, k > 0).
    fn run(
        &self,
        dims: Dims,
        rows: usize,
        a: Operand<'_>,
        b: Operand<'_>,
        out: &mut [f64],
    ) -> std::result::Result<(), String> {
        let Dims { m, n, k, cfg } = dims;
        let (a_size, b_size, c_size) = (m * k, k * n, m * n);
        debug_assert_eq!(out.len(), rows * c_size);
        self.ctx.bind_to_thread().map_err(|e| e.to_string())?;
        // Two constants: every row has the same product; compute it once.
        let (computed, copies) = match (a, b) {
            (Operand::Every(_), Operand::Every(_)) => out.split_at_mut(c_size),
            _ => (&mut out[..], &mut [][..]),
        };
        let computed_rows = computed.len() / c_size;
        // A constant operand is uploaded once and read with batch stride 0
        // (cuBLAS allows a zero stride for its input matrices, not for C).
        let every = |operand: Operand<'_>| match operand {
            Operand::Every(v) => self.upload(v).map(Some),
            Operand::Rows(_) => Ok(None),
        };
        let (a_every, b_every) = (every(a)?, every(b)?);
        let per_row = 8
            * (c_size
                + if a_every.is_none() { a_size } else { 0 }
                + if b_every.is_none() { b_size } else { 0 });
        let chunk = (MAX_CHUNK_BYTES / per_row).clamp(1, MAX_BATCH);
        let mut start = 0;
        while start < computed_rows {
            let count = chunk.min(computed_rows - start);
            let part = |operand: Operand<'_>, size: usize| match operand {
                Operand::Rows(v) => self
                    .upload(&v[start * size..(start + count) * size])
                    .map(Some),
                Operand::Every(_) => Ok(None),
            };
            let (a_part, b_part) = (part(a, a_size)?, part(b, b_size)?);
            let (a_dev, a_stride) = match (&a_part, &a_every) {
                (Some(part), _) => (part, a_size),
                (None, Some(every)) => (every, 0),
                (None, None) => unreachable!("an operand is rows or every"),
            };
            let (b_dev, b_stride) = match (&b_part, &b_every) {
                (Some(part), _) => (part, b_size),
                (None, Some(every)) => (every, 0),
                (None, None) => unreachable!("an operand is rows or every"),
            };
            let mut c_dev = self
                .stream
                .alloc_zeros::<f64>(count * c_size)
                .map_err(|e| e.to_string())?;
            let (batched, first, second) =
                cublas_call(cfg, count, (a_dev, a_stride), (b_dev, b_stride), c_size);
            // SAFETY: `layout` gives dimensions and leading dimensions that
            // match the buffers: B's device buffer holds `count` (or, at
            // stride 0, one) k·n values, A's m·k per product, C's m·n — the
            // lengths uploaded and allocated above. (The tests run the same
            // configuration through a reference column-major GEMM.)
            unsafe {
                self.blas
                    .gemm_strided_batched(batched, first, second, &mut c_dev)
            }
            .map_err(|e| e.to_string())?;
            self.stream
                .memcpy_dtoh(
                    &c_dev,
                    &mut computed[start * c_size..(start + count) * c_size],
                )
                .map_err(|e| e.to_string())?;
            start += count;
        }
        self.stream.synchronize().map_err(|e| e.to_string())?;
        let (first, _) = computed.split_at(c_size);
        for row in copies.chunks_exact_mut(c_size) {
            row.copy_from_slice(first);
        }
        Ok(())
    }

    fn upload(&self, values: &[f64]) -> std::result::Result<CudaSlice<f64>, String> {
        self.stream.clone_htod(values).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    //! cuBLAS against the CPU kernels. Each test prints `skipped: no CUDA
    //! device` and passes where no GPU can be used, unless
    //! `DFGRAD_REQUIRE_GPU=1` says a GPU must be there: then it fails.

    use super::*;

    fn gpu_or_skip() -> bool {
        match unavailable_reason() {
            None => true,
            Some(reason) if std::env::var("DFGRAD_REQUIRE_GPU").is_ok_and(|v| v == "1") => {
                panic!("DFGRAD_REQUIRE_GPU=1 but no CUDA device can be used: {reason}")
            }
            Some(reason) => {
                println!("skipped: no CUDA device ({reason})");
                false
            }
        }
    }

    /// Deterministic values in [-1, 1) (an LCG; no dependency needed).
    fn values(seed: u64, len: usize) -> Vec<f64> {
        let mut state = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..len)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
            })
            .collect()
    }

    /// max |gpu - cpu| / max(1, max |cpu|) ≤ 1e-12.
    fn assert_close(what: &str, gpu: &[f64], cpu: &[f64]) {
        assert_eq!(gpu.len(), cpu.len(), "{what}: lengths");
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
                            &format!(
                                "{form:?} {m}x{n}x{k}, {rows} rows, every {a_every}/{b_every}"
                            ),
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
        if !gpu_or_skip() {
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
        if !gpu_or_skip() {
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
        if !gpu_or_skip() {
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
        if !gpu_or_skip() {
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
        let grad = crate::error::GradError::find(&err).expect("a GradError");
        assert_eq!(grad.kind(), ErrorKind::DeviceUnavailable);
        assert!(
            err.to_string().contains("no CUDA device/driver was found"),
            "{err}"
        );
        assert!(err.to_string().contains(reason), "{err}");
    }
}

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
// pub for the tests in tests/unit/tensor_cuda.rs
#[doc(hidden)]
pub fn layout(form: Form, m: i32, n: i32, k: i32) -> GemmConfig<f64> {
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
// pub for the tests in tests/unit/tensor_cuda.rs
#[doc(hidden)]
pub fn cublas_call<'x, T: ?Sized>(
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

//! Linear algebra: `matvec`, `vecmat`, `matmul` (and its transposed forms
//! `matmul_tn`, `matmul_nt`, used by its derivative), `transpose`, `outer`.
//! Matrix products run on the blocked GEMM of [`super::kernels`], or on
//! cuBLAS ([`super::cuda`], cargo feature `cuda`) as the session's
//! `datafusion_grad.tensor_device` setting chooses ([`products`]). The
//! product's [`Form`] is defined in [`super::gemm_form`], which both this
//! module and `cuda` import, so `cuda` imports nothing from here.

use datafusion::error::Result;

use super::function::{mismatch, Batch, Spec};
use super::gemm_form::Form;
use super::kernels;
use super::shape::Shape;
use crate::options::Device;

/// The linear-algebra functions.
pub static SPECS: &[Spec] = &[
    Spec {
        name: "matvec",
        description: "The matrix-vector product m·v (m is r×c, v has c elements; the result r).",
        syntax: "matvec(m, v)",
        example: "SELECT matvec(tensor([1.0, 2.0, 3.0, 4.0], 2, 2), tensor([1.0, 1.0], 2)); -- [3.0, 7.0]",
        arity: 2..=2,
        shape: |s, _| match s {
            [Shape::Matrix(r, c), Shape::Vector(n)] if c == n => Ok(Shape::Vector(*r)),
            [a, b] => mismatch("matvec", format!("needs an r×c matrix and a vector of c, got {a} and {b}")),
            _ => unreachable!("arity checked"),
        },
        eval: |b| {
            let (r, c) = b.args[0].shape.rows_cols();
            Ok(b.per_row(|i, out| kernels::matvec(r, c, b.args[0].row(i), b.args[1].row(i), out)))
        },
    },
    Spec {
        name: "vecmat",
        description: "The vector-matrix product uᵀ·m (u has r elements, m is r×c; the result c) — matvec(transpose(m), u) without the transpose.",
        syntax: "vecmat(u, m)",
        example: "SELECT vecmat(tensor([1.0, 1.0], 2), tensor([1.0, 2.0, 3.0, 4.0], 2, 2)); -- [4.0, 6.0]",
        arity: 2..=2,
        shape: |s, _| match s {
            [Shape::Vector(n), Shape::Matrix(r, c)] if r == n => Ok(Shape::Vector(*c)),
            [a, b] => mismatch("vecmat", format!("needs a vector of r and an r×c matrix, got {a} and {b}")),
            _ => unreachable!("arity checked"),
        },
        eval: |b| {
            let (r, c) = b.args[1].shape.rows_cols();
            Ok(b.per_row(|i, out| kernels::gemm(1, c, r, b.args[0].row(i), b.args[1].row(i), out, false)))
        },
    },
    Spec {
        name: "matmul",
        description: "The matrix product a·b (a is m×k, b is k×n; the result m×n).",
        syntax: "matmul(a, b)",
        example: "SELECT matmul(tensor([1.0, 2.0, 3.0, 4.0], 2, 2), tensor([1.0, 0.0, 0.0, 1.0], 2, 2)); -- [[1.0, 2.0], [3.0, 4.0]]",
        arity: 2..=2,
        shape: |s, _| match s {
            [Shape::Matrix(m, k), Shape::Matrix(k2, n)] if k == k2 => Ok(Shape::Matrix(*m, *n)),
            [a, b] => mismatch("matmul", format!("needs m×k and k×n matrices, got {a} and {b} (use matvec for a vector)")),
            _ => unreachable!("arity checked"),
        },
        eval: |b| {
            let (m, k) = b.args[0].shape.rows_cols();
            let (_, n) = b.args[1].shape.rows_cols();
            products(b, Form::NN, m, n, k)
        },
    },
    Spec {
        name: "matmul_tn",
        description: "aᵀ·b (a is k×m, b is k×n; the result m×n) — matmul(transpose(a), b) without the transpose.",
        syntax: "matmul_tn(a, b)",
        example: "SELECT matmul_tn(tensor([1.0, 2.0], 1, 2), tensor([3.0, 4.0], 1, 2)); -- [[3.0, 4.0], [6.0, 8.0]]",
        arity: 2..=2,
        shape: |s, _| match s {
            [Shape::Matrix(k, m), Shape::Matrix(k2, n)] if k == k2 => Ok(Shape::Matrix(*m, *n)),
            [a, b] => mismatch("matmul_tn", format!("needs k×m and k×n matrices, got {a} and {b}")),
            _ => unreachable!("arity checked"),
        },
        eval: |b| {
            let (k, m) = b.args[0].shape.rows_cols();
            let (_, n) = b.args[1].shape.rows_cols();
            products(b, Form::TN, m, n, k)
        },
    },
    Spec {
        name: "matmul_nt",
        description: "a·bᵀ (a is m×k, b is n×k; the result m×n) — matmul(a, transpose(b)) without the transpose.",
        syntax: "matmul_nt(a, b)",
        example: "SELECT matmul_nt(tensor([1.0, 2.0], 1, 2), tensor([3.0, 4.0], 1, 2)); -- [[11.0]]",
        arity: 2..=2,
        shape: |s, _| match s {
            [Shape::Matrix(m, k), Shape::Matrix(n, k2)] if k == k2 => Ok(Shape::Matrix(*m, *n)),
            [a, b] => mismatch("matmul_nt", format!("needs m×k and n×k matrices, got {a} and {b}")),
            _ => unreachable!("arity checked"),
        },
        eval: |b| {
            let (m, k) = b.args[0].shape.rows_cols();
            let (n, _) = b.args[1].shape.rows_cols();
            products(b, Form::NT, m, n, k)
        },
    },
    Spec {
        name: "transpose",
        description: "The transpose of a matrix.",
        syntax: "transpose(m)",
        example: "SELECT transpose(tensor([1.0, 2.0, 3.0, 4.0], 2, 2)); -- [[1.0, 3.0], [2.0, 4.0]]",
        arity: 1..=1,
        shape: |s, _| match s[0] {
            Shape::Matrix(r, c) => Ok(Shape::Matrix(c, r)),
            a => mismatch("transpose", format!("needs a matrix, got {a}")),
        },
        eval: |b| {
            let (r, c) = b.args[0].shape.rows_cols();
            Ok(b.per_row(|i, out| kernels::transpose(r, c, b.args[0].row(i), out)))
        },
    },
    Spec {
        name: "outer",
        description: "The outer product a·bᵀ of two vectors (a has n elements, b m; the result n×m).",
        syntax: "outer(a, b)",
        example: "SELECT outer(tensor([1.0, 2.0], 2), tensor([3.0, 4.0], 2)); -- [[3.0, 4.0], [6.0, 8.0]]",
        arity: 2..=2,
        shape: |s, _| match s {
            [Shape::Vector(n), Shape::Vector(m)] => Ok(Shape::Matrix(*n, *m)),
            [a, b] => mismatch("outer", format!("needs two vectors, got {a} and {b}")),
            _ => unreachable!("arity checked"),
        },
        eval: |b| Ok(b.per_row(|i, out| kernels::outer(b.args[0].row(i), b.args[1].row(i), out))),
    },
];

/// The least multiply-adds (over the whole batch: rows·m·n·k) that `auto`
/// sends to the GPU. Measured (docs/benchmarks.md, `benches/gpu_gemm.rs`, an
/// H200 over PCIe 5 against one core of its host's Xeon): a GPU call costs
/// ~150 µs however small, about what the CPU kernel takes for 2^20-2^21
/// multiply-adds (64³: CPU 27 µs, GPU 176 µs; 192³: CPU 1.07 ms, GPU
/// 0.28 ms). 128³ = 2^21 is the crossover: 1.2x faster on the GPU in the
/// first run, 0.92x and 0.90x in the next two, so the bar is 2^22.
pub const GPU_MIN_WORK: usize = 1 << 22;

/// The least multiply-adds per matrix element moved to or from the GPU that
/// `auto` asks for: operands and result cross PCIe on every call, so a
/// product with little arithmetic per element is bound by the copies.
/// Measured as above: outer products (≈1 per element) run 2-3x faster on
/// the CPU, matrix-vector products (≈1) and 2048×8·2048 (≈8) about even,
/// 2048×32·2048 (≈31) 4.5x faster on the GPU, a batch of 1,024 16³ products
/// (≈5) even and of 256 32³ products (≈11) 1.9x faster on the GPU. The MLP's
/// 2000×784 by 784×20 product (≈19) runs 2.9x faster on the GPU. A second
/// run gave 2048×8·2048 (just under 8 per element) 1.84x on the GPU, the
/// first 1.1x: the bar is 7.
pub const GPU_MIN_INTENSITY: usize = 7;

/// Whether `auto` would run `rows` products of an m×k by k×n product on the
/// GPU (when one is present): enough work in the batch, and enough
/// arithmetic per element copied (each row's operands counted, as when
/// neither is constant).
pub fn gpu_worthwhile(m: usize, n: usize, k: usize, rows: usize) -> bool {
    let work = m.saturating_mul(n).saturating_mul(k);
    let moved = m
        .saturating_mul(k)
        .saturating_add(k.saturating_mul(n))
        .saturating_add(m.saturating_mul(n));
    work.saturating_mul(rows) >= GPU_MIN_WORK && work / GPU_MIN_INTENSITY >= moved
}

/// The products of every row of `b` (the two arguments of `matmul`,
/// `matmul_tn` or `matmul_nt`, in `form`), on the device that
/// `b.device` chooses.
fn products(b: &Batch, form: Form, m: usize, n: usize, k: usize) -> Result<Vec<f64>> {
    match b.device {
        Device::Cpu => {}
        Device::Gpu => return gpu_products(b, form, m, n, k),
        Device::Auto => {
            #[cfg(feature = "cuda")]
            if gpu_worthwhile(m, n, k, b.rows) && super::cuda::available() {
                // A GPU failure here (e.g. out of device memory) falls back
                // to the CPU: `auto` promises a result, not a device.
                if let Ok(values) = gpu_products(b, form, m, n, k) {
                    return Ok(values);
                }
            }
        }
    }
    let (a, x) = (&b.args[0], &b.args[1]);
    Ok(b.per_row(|i, out| form.cpu(m, n, k, a.row(i), x.row(i), out)))
}

/// The products of every row of `b` on the GPU (batched cuBLAS calls).
#[cfg(feature = "cuda")]
fn gpu_products(b: &Batch, form: Form, m: usize, n: usize, k: usize) -> Result<Vec<f64>> {
    use super::cuda::Operand;
    fn operand(arg: &super::batch::TensorArg, rows: usize) -> Operand<'_> {
        match arg.column() {
            Some(values) => Operand::Rows(&values[..rows * arg.shape.size()]),
            None => Operand::Every(arg.row(0)),
        }
    }
    let (a, x) = (operand(&b.args[0], b.rows), operand(&b.args[1], b.rows));
    super::cuda::gemm_batched(form, m, n, k, b.rows, a, x)
}

/// Without the `cuda` feature there is no GPU: `gpu` is refused.
#[cfg(not(feature = "cuda"))]
fn gpu_products(_: &Batch, _: Form, _: usize, _: usize, _: usize) -> Result<Vec<f64>> {
    crate::error::fail(
        crate::error::ErrorKind::DeviceUnavailable,
        "datafusion_grad.tensor_device is 'gpu', but datafusion-grad was built without the cuda \
         feature (rebuild with `--features cuda`, or SET datafusion_grad.tensor_device = 'auto')",
    )
}

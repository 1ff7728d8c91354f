//! Linear algebra: `matvec`, `vecmat`, `matmul` (and its transposed forms
//! `matmul_tn`, `matmul_nt`, used by its derivative), `transpose`, `outer`.
//! Matrix products run on the blocked GEMM of [`super::kernels`].

use super::function::{mismatch, Spec};
use super::kernels;
use super::shape::Shape;

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
            Ok(b.per_row(|i, out| kernels::gemm(m, n, k, b.args[0].row(i), b.args[1].row(i), out, false)))
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
            Ok(b.per_row(|i, out| kernels::gemm_tn(m, n, k, b.args[0].row(i), b.args[1].row(i), out, false)))
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
            Ok(b.per_row(|i, out| kernels::gemm_nt(m, n, k, b.args[0].row(i), b.args[1].row(i), out, false)))
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

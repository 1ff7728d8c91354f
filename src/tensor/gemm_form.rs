//! The form of a matrix product: which operand is stored transposed.
//!
//! `matmul`, `matmul_tn` and `matmul_nt` are one product C = op(A)·op(B) in
//! three [`Form`]s. [`super::linalg`] (the SQL functions, which choose the
//! device) and `cuda` (the cuBLAS path it calls) both need the form, so it
//! lives below both of them here, with its CPU evaluation: `linalg` imports
//! `cuda` and this module, `cuda` only this module, and this module only
//! [`super::kernels`] — no circle between the two.

use super::kernels;

/// Which operand of a matrix product C (m×n) = op(A)·op(B) is stored
/// transposed; every matrix is row-major.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Form {
    /// `matmul`: C = A·B, A stored m×k, B stored k×n.
    NN,
    /// `matmul_tn`: C = Aᵀ·B, A stored k×m, B stored k×n.
    TN,
    /// `matmul_nt`: C = A·Bᵀ, A stored m×k, B stored n×k.
    NT,
}

impl Form {
    /// C = op(A)·op(B) on the CPU kernels (overwriting `c`).
    pub fn cpu(self, m: usize, n: usize, k: usize, a: &[f64], b: &[f64], c: &mut [f64]) {
        match self {
            Form::NN => kernels::gemm(m, n, k, a, b, c, false),
            Form::TN => kernels::gemm_tn(m, n, k, a, b, c, false),
            Form::NT => kernels::gemm_nt(m, n, k, a, b, c, false),
        }
    }
}

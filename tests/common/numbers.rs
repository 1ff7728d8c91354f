//! Comparing numbers: relative closeness and central finite differences.

/// The step of the finite differences.
pub const H: f64 = 1e-4;

/// Whether `a` and `b` agree to `tol`, relative to the larger (absolute
/// near 0).
pub fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * (1.0 + a.abs().max(b.abs()))
}

/// The central difference of the values at `+H`, `-H`, `+2H` and `-2H`,
/// trusted only when the estimates with steps `H` and `2H` agree to `agree`
/// (which excludes kinks, where they differ by O(H)) and it is finite and
/// below 1e6.
pub fn central(plus: f64, minus: f64, plus2: f64, minus2: f64, agree: f64) -> Option<f64> {
    let d1 = (plus - minus) / (2.0 * H);
    let d2 = (plus2 - minus2) / (4.0 * H);
    (d1.is_finite() && d2.is_finite() && close(d1, d2, agree) && d1.abs() < 1e6).then_some(d1)
}

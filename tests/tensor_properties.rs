//! Every tensor derivative rule against central finite differences.
//!
//! For each function `f` and random arguments, the scalar `L = dot(f(args), R)`
//! (or `f · r` for a number-valued `f`) with a fixed random `R` is
//! differentiated with `grad` with respect to each argument, and each element
//! of the gradient is compared with `(L(x + h·e) - L(x - h·e)) / 2h`, all
//! evaluated in SQL. `jvp` along a random tangent must equal the gradient's
//! inner product with it, and `vjp(f, x, R)` must equal `grad(L, x)`.

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::datatypes::{DataType, Float64Type};
use datafusion::prelude::SessionContext;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::common::numbers::close;

/// An argument: its shape and the range its elements are drawn from; a
/// `Label` is a constant class-index argument (not differentiated).
#[derive(Clone, Copy, Debug)]
enum Arg {
    Num(f64, f64),
    Vec(usize, f64, f64),
    Mat(usize, usize, f64, f64),
    Label(&'static str),
}

/// Functions (with `{0}`, `{1}`, … for the arguments) and their arguments.
fn cases() -> Vec<(&'static str, Vec<Arg>)> {
    use Arg::*;
    let v = Vec(4, -2.0, 2.0);
    let m = Mat(3, 4, -2.0, 2.0);
    vec![
        ("tensor_add({0}, {1})", vec![v, v]),
        ("tensor_add({0}, {1})", vec![v, Num(-2.0, 2.0)]),
        ("tensor_add({1}, {0})", vec![m, Num(-2.0, 2.0)]),
        ("tensor_sub({0}, {1})", vec![m, m]),
        ("tensor_add({0}, {1})", vec![m, Vec(4, -2.0, 2.0)]),
        ("tensor_sub({1}, {0})", vec![m, Vec(4, -2.0, 2.0)]),
        ("tensor_mul({0}, {1})", vec![m, Vec(4, -2.0, 2.0)]),
        ("tensor_div({0}, {1})", vec![m, Vec(4, 0.5, 2.0)]),
        (
            "tensor_div({1}, {0})",
            vec![Mat(3, 4, 0.5, 2.0), Vec(4, -2.0, 2.0)],
        ),
        ("col_sum({0})", vec![m]),
        ("tensor_sub({1}, {0})", vec![v, Num(-2.0, 2.0)]),
        ("tensor_mul({0}, {1})", vec![v, v]),
        ("tensor_mul({1}, {0})", vec![m, Num(-2.0, 2.0)]),
        ("tensor_div({0}, {1})", vec![v, Vec(4, 0.5, 2.0)]),
        (
            "tensor_div({0}, {1})",
            vec![Num(-2.0, 2.0), Vec(4, 0.5, 2.0)],
        ),
        ("tensor_div({0}, {1})", vec![m, Num(0.5, 2.0)]),
        ("scale({0}, {1})", vec![m, Num(-2.0, 2.0)]),
        ("tensor_exp({0})", vec![v]),
        ("tensor_ln({0})", vec![Vec(4, 0.5, 3.0)]),
        ("tensor_sqrt({0})", vec![Mat(2, 3, 0.5, 3.0)]),
        ("tensor_tanh({0})", vec![v]),
        ("sigmoid({0})", vec![m]),
        ("relu({0})", vec![m]),
        ("fill_like({0}, {1})", vec![v, Num(-2.0, 2.0)]),
        ("tensor_total({0})", vec![m]),
        ("tensor_mean({0})", vec![m]),
        ("norm({0})", vec![v]),
        ("dot({0}, {1})", vec![m, m]),
        ("matvec({0}, {1})", vec![m, Vec(4, -2.0, 2.0)]),
        ("vecmat({0}, {1})", vec![Vec(3, -2.0, 2.0), m]),
        ("matmul({0}, {1})", vec![m, Mat(4, 2, -2.0, 2.0)]),
        ("matmul_tn({0}, {1})", vec![m, Mat(3, 2, -2.0, 2.0)]),
        ("matmul_nt({0}, {1})", vec![m, Mat(2, 4, -2.0, 2.0)]),
        ("transpose({0})", vec![m]),
        ("outer({0}, {1})", vec![Vec(3, -2.0, 2.0), v]),
        ("reshape({0}, 12)", vec![m]),
        ("reshape({0}, 2, 2)", vec![v]),
        ("softmax({0})", vec![v]),
        ("softmax({0})", vec![m]),
        ("log_softmax({0})", vec![m]),
        ("softmax_vjp({0}, {1})", vec![v, v]),
        ("softmax_vjp({0}, {1})", vec![m, m]),
        ("log_softmax_vjp({0}, {1})", vec![v, v]),
        ("log_softmax_vjp({0}, {1})", vec![m, m]),
        ("log_softmax_jvp({0}, {1})", vec![v, v]),
        ("log_softmax_jvp({0}, {1})", vec![m, m]),
        ("logsumexp({0})", vec![v]),
        ("logsumexp({0})", vec![m]),
        ("row_dot({0}, {1})", vec![m, m]),
        ("row_scale({0}, {1})", vec![m, Vec(3, -2.0, 2.0)]),
        ("row_scale({0}, {1})", vec![v, Num(-2.0, 2.0)]),
        (
            "cross_entropy({0}, {1})",
            vec![m, Label("tensor([2.0, 0.0, 3.0], 3)")],
        ),
        ("cross_entropy({0}, {1})", vec![v, Label("1")]),
        (
            "cross_entropy_grad({0}, {1})",
            vec![m, Label("tensor([2.0, 0.0, 3.0], 3)")],
        ),
        ("cross_entropy_grad({0}, {1})", vec![v, Label("1")]),
        // compositions: a two-layer network's loss, and scalar SQL around tensors
        (
            "cross_entropy(matmul(tensor_tanh(matmul({0}, {1})), {2}), {3})",
            vec![
                Mat(3, 4, -1.0, 1.0),
                Mat(4, 5, -1.0, 1.0),
                Mat(5, 2, -1.0, 1.0),
                Label("tensor([1.0, 0.0, 1.0], 3)"),
            ],
        ),
        (
            "sin(dot({0}, {1})) * {2} + power(norm({0}), 3)",
            vec![v, v, Num(-2.0, 2.0)],
        ),
        (
            "tensor_total(tensor_mul(sigmoid(matvec({0}, {1})), softmax(matvec({0}, {1}))))",
            vec![m, v],
        ),
        // piecewise constant and constant functions: derivative 0
        ("tensor_mul(tensor_step({0}), {1})", vec![v, v]),
        ("scale({1}, argmax({0}))", vec![v, v]),
        ("tensor_add(zeros_like({0}), {1})", vec![v, v]),
        ("tensor_mul(random_tensor(3, 4), {0})", vec![v]),
        (
            "matmul(one_hot(tensor([0.0, 2.0, 1.0], 3), 4), {0})",
            vec![Mat(4, 2, -2.0, 2.0)],
        ),
    ]
}

#[test]
fn every_tensor_rule_is_exercised() {
    let cases = cases();
    let calls = |name: &str| {
        cases.iter().any(|(f, _)| {
            f.match_indices(&format!("{name}(")).any(|(i, _)| {
                i == 0
                    || !f.as_bytes()[i - 1].is_ascii_alphanumeric() && f.as_bytes()[i - 1] != b'_'
            })
        })
    };
    let rules = datafusion_grad::Rules::builtin();
    let missing: Vec<&str> = rules
        .names()
        .filter(|n| datafusion_grad::tensor::is_tensor_function(n) && !calls(n))
        .collect();
    assert!(
        missing.is_empty(),
        "tensor rules without a finite-difference case: {missing:?}"
    );
}

/// Random elements for `arg`.
fn draw(rng: &mut StdRng, arg: Arg) -> Vec<f64> {
    let (n, lo, hi) = match arg {
        Arg::Num(lo, hi) => (1, lo, hi),
        Arg::Vec(n, lo, hi) => (n, lo, hi),
        Arg::Mat(r, c, lo, hi) => (r * c, lo, hi),
        Arg::Label(_) => (0, 0.0, 0.0),
    };
    (0..n).map(|_| rng.random_range(lo..hi)).collect()
}

/// SQL for `values` of the shape of `arg`.
fn literal(arg: Arg, values: &[f64]) -> String {
    let list = values
        .iter()
        .map(|v| format!("{v:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    match arg {
        Arg::Num(..) => format!("{:?}", values[0]),
        Arg::Vec(n, ..) => format!("tensor([{list}], {n})"),
        Arg::Mat(r, c, ..) => format!("tensor([{list}], {r}, {c})"),
        Arg::Label(sql) => sql.to_string(),
    }
}

/// Every element of a Float64, tensor or NULL cell, flattened.
fn elements(col: &ArrayRef, row: usize) -> Vec<f64> {
    match col.data_type() {
        DataType::Float64 => vec![col.as_primitive::<Float64Type>().value(row)],
        DataType::FixedSizeList(..) => {
            let inner = col.as_fixed_size_list().value(row);
            (0..inner.len()).flat_map(|i| elements(&inner, i)).collect()
        }
        t => panic!("unexpected type {t}"),
    }
}

async fn rows(ctx: &SessionContext, sql: &str) -> Vec<Vec<Vec<f64>>> {
    let batches = ctx
        .sql(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}\n{e}"))
        .collect()
        .await
        .unwrap_or_else(|e| panic!("{sql}\n{e}"));
    let mut out = Vec::new();
    for b in batches {
        for r in 0..b.num_rows() {
            out.push(b.columns().iter().map(|c| elements(c, r)).collect());
        }
    }
    out
}

#[tokio::test]
async fn tensor_rules_match_finite_differences() {
    let ctx = datafusion_grad::session_context();
    let mut rng = StdRng::seed_from_u64(7);
    let h = 1e-6;
    for (template, args) in cases() {
        for _point in 0..2 {
            let values: Vec<Vec<f64>> = args.iter().map(|&a| draw(&mut rng, a)).collect();
            let mut f = template.to_string();
            for (i, a) in args.iter().enumerate() {
                let name = match a {
                    Arg::Label(sql) => sql.to_string(),
                    _ => format!("x{i}"),
                };
                f = f.replace(&format!("{{{i}}}"), &name);
            }
            // The output's shape decides the weights R.
            let columns: Vec<String> = (0..args.len()).map(|i| format!("x{i}")).collect();
            let point = |vals: &[Vec<f64>]| {
                args.iter()
                    .zip(vals)
                    .zip(&columns)
                    .filter(|((a, _), _)| !matches!(a, Arg::Label(_)))
                    .map(|((&a, v), c)| format!("{} AS {c}", literal(a, v)))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let base = point(&values);
            let out = rows(&ctx, &format!("SELECT {f} FROM (SELECT {base})")).await;
            let n_out = out[0][0].len();
            let weights: Vec<f64> = (0..n_out).map(|_| rng.random_range(-1.0..1.0)).collect();
            let loss = if n_out == 1 && !out_is_tensor(&ctx, &f, &base).await {
                format!("({f}) * {:?}", weights[0])
            } else {
                let shape = out_shape(&ctx, &f, &base).await;
                format!("dot({f}, {})", literal(shape, &weights))
            };
            for (i, &a) in args.iter().enumerate() {
                if matches!(a, Arg::Label(_)) {
                    continue;
                }
                let x = &columns[i];
                let sql = format!("SELECT grad({loss}, {x}) FROM (SELECT {base})");
                let grad = rows(&ctx, &sql).await[0][0].clone();
                // L at x ± h·e_j for every element j, in one query.
                let mut perturbed = Vec::new();
                for j in 0..values[i].len() {
                    for sign in [1.0, -1.0] {
                        let mut vals = values.clone();
                        vals[i][j] += sign * h;
                        perturbed.push(format!(
                            "SELECT {} AS k, {}",
                            perturbed.len(),
                            point(&vals)
                        ));
                    }
                }
                let sql = format!(
                    "SELECT {loss} FROM ({}) ORDER BY k",
                    perturbed.join(" UNION ALL ")
                );
                let losses: Vec<f64> = rows(&ctx, &sql)
                    .await
                    .into_iter()
                    .map(|r| r[0][0])
                    .collect();
                for j in 0..values[i].len() {
                    let fd = (losses[2 * j] - losses[2 * j + 1]) / (2.0 * h);
                    assert!(
                        close(grad[j], fd, 1e-5),
                        "{f}: d/d{x}[{j}] = {} but finite differences give {fd}",
                        grad[j]
                    );
                }
                // jvp along a random tangent = <grad, t>; vjp with R = grad.
                let t: Vec<f64> = draw(&mut rng, a);
                let sql = format!(
                    "SELECT jvp({loss}, {x}, {}) FROM (SELECT {base})",
                    literal(a, &t)
                );
                let jvp = rows(&ctx, &sql).await[0][0][0];
                let expected: f64 = grad.iter().zip(&t).map(|(g, t)| g * t).sum();
                assert!(
                    close(jvp, expected, 1e-9),
                    "{f}: jvp along {x} = {jvp}, <grad, t> = {expected}"
                );
                if n_out > 1 || out_is_tensor(&ctx, &f, &base).await {
                    let shape = out_shape(&ctx, &f, &base).await;
                    let sql = format!(
                        "SELECT vjp({f}, {x}, {}) FROM (SELECT {base})",
                        literal(shape, &weights)
                    );
                    let vjp = rows(&ctx, &sql).await[0][0].clone();
                    for (v, g) in vjp.iter().zip(&grad) {
                        assert!(
                            close(*v, *g, 1e-9),
                            "{f}: vjp wrt {x} = {vjp:?}, grad = {grad:?}"
                        );
                    }
                }
            }
        }
    }
}

/// Whether `f` is a tensor over the point `base`.
async fn out_is_tensor(ctx: &SessionContext, f: &str, base: &str) -> bool {
    let df = ctx
        .sql(&format!("SELECT {f} FROM (SELECT {base})"))
        .await
        .unwrap();
    matches!(
        df.schema().field(0).data_type(),
        DataType::FixedSizeList(..)
    )
}

/// The shape of `f` over the point `base`, as an [`Arg`].
async fn out_shape(ctx: &SessionContext, f: &str, base: &str) -> Arg {
    let df = ctx
        .sql(&format!("SELECT {f} FROM (SELECT {base})"))
        .await
        .unwrap();
    match datafusion_grad::tensor::Shape::of(df.schema().field(0).data_type()) {
        Some(datafusion_grad::tensor::Shape::Vector(n)) => Arg::Vec(n, 0.0, 0.0),
        Some(datafusion_grad::tensor::Shape::Matrix(r, c)) => Arg::Mat(r, c, 0.0, 0.0),
        _ => Arg::Num(0.0, 0.0),
    }
}

#[tokio::test]
async fn tensor_columns_from_arrow_and_lists_agree() {
    // A Float32 FixedSizeList column and a List column made into tensors give
    // the same derivative as a Float64 tensor.
    let ctx = datafusion_grad::session_context();
    let sql = "SELECT grad(dot(w, w), w) AS a, \
                      grad(dot(w32, w32), w32) AS b \
               FROM (SELECT tensor([1.5, -2.0], 2) AS w, \
                            arrow_cast(tensor([1.5, -2.0], 2), 'FixedSizeList(2, Float32)') AS w32)";
    let r = rows(&ctx, sql).await;
    assert_eq!(r[0][0], vec![3.0, -4.0]);
    assert_eq!(r[0][1], vec![3.0, -4.0]);
}

/// The gradient of a small two-layer network's loss,
/// `cross_entropy(relu(x·w1)·w2, y)`, against backpropagation written here by
/// hand (softmax minus one-hot, transposed products, relu mask).
#[tokio::test]
async fn mlp_gradient_matches_hand_backprop() {
    let ctx = datafusion_grad::session_context();
    let (b, d, h, k) = (6, 5, 4, 3);
    let sql = format!(
        "SELECT x, w1, w2, y, grad(l, w1) AS g1, grad(l, w2) AS g2 FROM (
           SELECT *, cross_entropy(matmul(relu(matmul(x, w1)), w2), y) AS l FROM (
             SELECT scale(random_tensor(11, {b}, {d}), 2.0) AS x,
                    random_tensor(12, {d}, {h}) AS w1,
                    random_tensor(13, {h}, {k}) AS w2,
                    tensor([0.0, 2.0, 1.0, 1.0, 0.0, 2.0], {b}) AS y))"
    );
    let r = rows(&ctx, &sql).await.remove(0);
    let (x, w1, w2, y) = (&r[0], &r[1], &r[2], &r[3]);
    // forward
    let mut a = vec![0.0; b * h];
    for i in 0..b {
        for j in 0..h {
            a[i * h + j] = (0..d).map(|p| x[i * d + p] * w1[p * h + j]).sum();
        }
    }
    let act: Vec<f64> = a.iter().map(|v| v.max(0.0)).collect();
    let mut gz = vec![0.0; b * k];
    for i in 0..b {
        let z: Vec<f64> = (0..k)
            .map(|c| (0..h).map(|j| act[i * h + j] * w2[j * k + c]).sum())
            .collect();
        let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = z.iter().map(|v| (v - m).exp()).sum();
        for c in 0..k {
            let p = (z[c] - m).exp() / s;
            gz[i * k + c] = (p - f64::from(u8::from(y[i] as usize == c))) / b as f64;
        }
    }
    // backward
    let mut g2 = vec![0.0; h * k];
    for j in 0..h {
        for c in 0..k {
            g2[j * k + c] = (0..b).map(|i| act[i * h + j] * gz[i * k + c]).sum();
        }
    }
    let mut ga = vec![0.0; b * h];
    for i in 0..b {
        for j in 0..h {
            let back: f64 = (0..k).map(|c| gz[i * k + c] * w2[j * k + c]).sum();
            ga[i * h + j] = if a[i * h + j] > 0.0 { back } else { 0.0 };
        }
    }
    let mut g1 = vec![0.0; d * h];
    for p in 0..d {
        for j in 0..h {
            g1[p * h + j] = (0..b).map(|i| x[i * d + p] * ga[i * h + j]).sum();
        }
    }
    for (name, ours, want) in [("w1", &r[4], &g1), ("w2", &r[5], &g2)] {
        assert_eq!(ours.len(), want.len());
        for (o, w) in ours.iter().zip(want.iter()) {
            assert!(
                close(*o, *w, 1e-12),
                "d loss / d {name}: {ours:?} vs hand {want:?}"
            );
        }
    }
}

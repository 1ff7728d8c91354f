//! Training loops written in SQL (the `examples/*.sql` files and a training
//! step as `INSERT`), each checked against an independent computation done
//! here in plain Rust on data regenerated exactly as the SQL generates it.

use crate::common::dfgrad_ok;

/// The path of an example file.
fn example(name: &str) -> String {
    format!("{}/examples/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A numeric CSV result: column names and rows.
struct Table {
    columns: Vec<String>,
    rows: Vec<Vec<f64>>,
}

impl Table {
    /// The block of `out` (CSV output of several statements) that starts with
    /// the header line `header`: the numeric lines that follow it.
    fn after_header(out: &str, header: &str) -> Table {
        let mut lines = out.lines().skip_while(|line| *line != header);
        assert_eq!(lines.next(), Some(header), "no header {header}: {out}");
        let rows = lines
            .map_while(|line| {
                line.split(',')
                    .map(|v| v.parse::<f64>().ok())
                    .collect::<Option<Vec<f64>>>()
            })
            .collect();
        Table {
            columns: header.split(',').map(str::to_string).collect(),
            rows,
        }
    }

    /// The output of a file whose only result is the last statement's.
    fn only(out: &str) -> Table {
        let header = out.lines().next().expect("no output");
        Table::after_header(out, header)
    }

    fn last(&self) -> &[f64] {
        self.rows.last().expect("no rows")
    }

    /// The index of column `name`.
    fn col(&self, name: &str) -> usize {
        self.columns
            .iter()
            .position(|c| c == name)
            .unwrap_or_else(|| panic!("no column {name} in {:?}", self.columns))
    }

    /// The values of columns `names` in the last row.
    fn last_values(&self, names: &[&str]) -> Vec<f64> {
        names.iter().map(|n| self.last()[self.col(n)]).collect()
    }
}

/// Solves `a x = b` by Gaussian elimination with partial pivoting.
fn solve(mut a: Vec<Vec<f64>>, mut b: Vec<f64>) -> Vec<f64> {
    let n = b.len();
    for k in 0..n {
        let pivot = (k..n)
            .max_by(|&i, &j| a[i][k].abs().total_cmp(&a[j][k].abs()))
            .unwrap();
        a.swap(k, pivot);
        b.swap(k, pivot);
        assert!(a[k][k].abs() > 1e-12, "singular system");
        for i in k + 1..n {
            let f = a[i][k] / a[k][k];
            let (top, bottom) = a.split_at_mut(i);
            for (x, y) in bottom[0][k..].iter_mut().zip(&top[k][k..]) {
                *x -= f * y;
            }
            b[i] -= f * b[k];
        }
    }
    let mut x = vec![0.0; n];
    for k in (0..n).rev() {
        let s: f64 = (k + 1..n).map(|j| a[k][j] * x[j]).sum();
        x[k] = (b[k] - s) / a[k][k];
    }
    x
}

fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// Asserts that the reported loss never increases (up to rounding).
fn assert_decreasing(table: &Table, column: &str) {
    let c = table.col(column);
    for pair in table.rows.windows(2) {
        assert!(
            pair[1][c] <= pair[0][c] + 1e-12,
            "{column} increased from {} (step {}) to {} (step {})",
            pair[0][c],
            pair[0][0],
            pair[1][c],
            pair[1][0]
        );
    }
}

/// examples/linear_regression_10.sql: 10 parameters reach the least-squares
/// solution, computed here from the normal equations.
#[test]
fn linear_regression_10_reaches_least_squares() {
    let out = dfgrad_ok(&[
        "--format",
        "csv",
        "-q",
        "-f",
        &example("linear_regression_10.sql"),
    ]);
    let table = Table::only(&out);
    assert_eq!(table.last()[0], 100.0, "{out}");
    let names = ["b", "w1", "w2", "w3", "w4", "w5", "w6", "w7", "w8", "w9"];
    let fitted = table.last_values(&names);

    // The data, as the SQL generates it: a row is (1, x1, ..., x9), y.
    let freqs = [0.48, 0.85, 1.22, 1.59, 1.96, 2.33, 2.70, 3.07, 3.44];
    let truth = [1.5, -2.0, 0.5, 3.0, -1.0, 0.25, 2.0, -0.75, 1.0];
    let data: Vec<([f64; 10], f64)> = (1..=10_000)
        .map(|i| {
            let i = i as f64;
            let s: Vec<f64> = (0..9)
                .map(|k| (i * freqs[k] + (k + 1) as f64).sin())
                .collect();
            let mut row = [1.0; 10];
            row[1] = s[0];
            for k in 1..9 {
                row[k + 1] = s[k] + 0.4 * s[k - 1];
            }
            let mut y = 0.5;
            for k in 0..9 {
                y += truth[k] * row[k + 1];
            }
            y += 0.1 * (i * 12.9898).sin();
            (row, y)
        })
        .collect();

    // Normal equations AᵀA β = Aᵀy.
    let mut ata = vec![vec![0.0; 10]; 10];
    let mut aty = vec![0.0; 10];
    for (row, y) in &data {
        for j in 0..10 {
            aty[j] += row[j] * y;
            for k in 0..10 {
                ata[j][k] += row[j] * row[k];
            }
        }
    }
    let beta = solve(ata, aty);
    let err = max_abs_diff(&fitted, &beta);
    assert!(
        err < 1e-6,
        "max |fitted - least squares| = {err:e}\nfitted {fitted:?}\nexact  {beta:?}"
    );

    // The reported mse is the mse of the reported parameters.
    let mse = data
        .iter()
        .map(|(row, y)| {
            let pred: f64 = row.iter().zip(&fitted).map(|(x, w)| x * w).sum();
            (pred - y).powi(2)
        })
        .sum::<f64>()
        / data.len() as f64;
    let reported = table.last()[table.col("mse")];
    assert!((reported - mse).abs() < 1e-12, "mse {reported} vs {mse}");
    assert_decreasing(&table, "mse");
}

/// The samples of examples/softmax_regression.sql: (x1, x2, label).
fn softmax_samples() -> Vec<(f64, f64, usize)> {
    (1..=3000)
        .map(|i| {
            let i = i as f64;
            let x1 = 2.0 * (i * 1.7 + 0.3).sin();
            let x2 = 2.0 * (i * 2.3 + 0.1).cos();
            let t0 = x1 + (i * 12.9898).sin();
            let t1 = -0.5 * x1 + 0.9 * x2 + (i * 78.233).sin();
            let t2 = -0.5 * x1 - 0.9 * x2 + (i * 37.719).sin();
            let label = if t0 >= t1 && t0 >= t2 {
                0
            } else if t1 >= t2 {
                1
            } else {
                2
            };
            (x1, x2, label)
        })
        .collect()
}

/// The arg max of three logits, ties to the lowest index (as the SQL does).
fn argmax3(z: [f64; 3]) -> usize {
    if z[0] >= z[1] && z[0] >= z[2] {
        0
    } else if z[1] >= z[2] {
        1
    } else {
        2
    }
}

/// examples/softmax_regression.sql reaches the optimum that Newton's method
/// finds here (on the identifiable differences of the class parameters).
#[test]
fn softmax_regression_reaches_newton_optimum() {
    let out = dfgrad_ok(&[
        "--format",
        "csv",
        "-q",
        "-f",
        &example("softmax_regression.sql"),
    ]);
    let table = Table::only(&out);
    assert_eq!(table.last()[0], 300.0, "{out}");
    let p = table.last_values(&[
        "w0_1", "w0_2", "b0", "w1_1", "w1_2", "b1", "w2_1", "w2_2", "b2",
    ]);
    let class = |k: usize| [p[3 * k], p[3 * k + 1], p[3 * k + 2]];
    let data = softmax_samples();
    let n = data.len() as f64;

    // Newton's method with class 2 as the reference (its logit fixed at 0):
    // theta = (class 0 - class 2, class 1 - class 2), each (x1, x2, bias).
    let mut theta = [0.0f64; 6];
    let mut grad_norm = f64::INFINITY;
    for _ in 0..30 {
        let mut g = vec![0.0; 6];
        let mut h = vec![vec![0.0; 6]; 6];
        for &(x1, x2, label) in &data {
            let x = [x1, x2, 1.0];
            let z0: f64 = (0..3).map(|f| theta[f] * x[f]).sum();
            let z1: f64 = (0..3).map(|f| theta[3 + f] * x[f]).sum();
            let m = z0.max(z1).max(0.0);
            let e = [(z0 - m).exp(), (z1 - m).exp(), (-m).exp()];
            let s = e[0] + e[1] + e[2];
            let prob = [e[0] / s, e[1] / s];
            for k in 0..2 {
                let y = if label == k { 1.0 } else { 0.0 };
                for f in 0..3 {
                    g[3 * k + f] += (prob[k] - y) * x[f] / n;
                    for l in 0..2 {
                        let d = if k == l { 1.0 } else { 0.0 };
                        for q in 0..3 {
                            h[3 * k + f][3 * l + q] += prob[k] * (d - prob[l]) * x[f] * x[q] / n;
                        }
                    }
                }
            }
        }
        grad_norm = g.iter().map(|v| v * v).sum::<f64>().sqrt();
        let step = solve(h, g);
        for (t, s) in theta.iter_mut().zip(step) {
            *t -= s;
        }
    }
    assert!(grad_norm < 1e-12, "Newton did not converge: {grad_norm:e}");

    let (c0, c1, c2) = (class(0), class(1), class(2));
    let diffs: Vec<f64> = (0..3)
        .map(|f| c0[f] - c2[f])
        .chain((0..3).map(|f| c1[f] - c2[f]))
        .collect();
    let err = max_abs_diff(&diffs, &theta);
    assert!(
        err < 1e-6,
        "max |fitted - Newton| = {err:e}\nfitted {diffs:?}\nNewton {theta:?}"
    );
    // Gradient descent from 0 keeps the class parameters summing to 0, which
    // fixes the otherwise free shift.
    for f in 0..3 {
        let sum = c0[f] + c1[f] + c2[f];
        assert!(sum.abs() < 1e-9, "parameter {f} sums to {sum}");
    }

    // Loss, accuracy and gradient norm of the reported parameters, here.
    let (mut loss, mut correct) = (0.0, 0usize);
    let mut grad = [0.0; 9];
    for &(x1, x2, label) in &data {
        let x = [x1, x2, 1.0];
        let z = [c0, c1, c2].map(|c| c[0] * x1 + c[1] * x2 + c[2]);
        let m = z[0].max(z[1]).max(z[2]);
        let lse = m + z.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
        loss += (lse - z[label]) / n;
        for k in 0..3 {
            let y = if label == k { 1.0 } else { 0.0 };
            for f in 0..3 {
                grad[3 * k + f] += ((z[k] - lse).exp() - y) * x[f] / n;
            }
        }
        if argmax3(z) == label {
            correct += 1;
        }
    }
    let accuracy = correct as f64 / n;
    let norm = grad.iter().map(|v| v * v).sum::<f64>().sqrt();
    let last = table.last();
    assert!((last[table.col("loss")] - loss).abs() < 1e-12);
    assert!((last[table.col("accuracy")] - accuracy).abs() < 1e-12);
    let reported_norm = last[table.col("grad_norm")];
    assert!(
        (reported_norm - norm).abs() < 1e-3 * norm + 1e-15,
        "gradient norm {reported_norm:e} vs {norm:e}"
    );
    assert!(norm < 1e-6, "gradient norm {norm:e}");
    assert!(accuracy >= 0.85, "training accuracy {accuracy}");
    assert_decreasing(&table, "loss");
}

/// The parameters of the 2-4-1 network of examples/xor_network.sql.
#[derive(Clone, Debug)]
struct Net {
    /// Hidden unit j: (weight of x1, weight of x2, bias).
    hidden: [[f64; 3]; 4],
    /// Output weights of the hidden units.
    u: [f64; 4],
    /// Output bias.
    c: f64,
}

impl Net {
    /// The order of the SQL columns.
    const COLUMNS: [&'static str; 17] = [
        "w1_1", "w1_2", "b1", "w2_1", "w2_2", "b2", "w3_1", "w3_2", "b3", "w4_1", "w4_2", "b4",
        "u1", "u2", "u3", "u4", "c",
    ];

    fn flat(&self) -> Vec<f64> {
        let mut v: Vec<f64> = self.hidden.iter().flatten().copied().collect();
        v.extend(self.u);
        v.push(self.c);
        v
    }

    fn from_flat(v: &[f64]) -> Net {
        let mut hidden = [[0.0; 3]; 4];
        for (j, unit) in hidden.iter_mut().enumerate() {
            unit.copy_from_slice(&v[3 * j..3 * j + 3]);
        }
        Net {
            hidden,
            u: [v[12], v[13], v[14], v[15]],
            c: v[16],
        }
    }

    /// Hidden activations and output logit at (x1, x2).
    fn forward(&self, x1: f64, x2: f64) -> ([f64; 4], f64) {
        let h = self.hidden.map(|[a, b, d]| (a * x1 + b * x2 + d).tanh());
        let o = (0..4).map(|j| self.u[j] * h[j]).sum::<f64>() + self.c;
        (h, o)
    }
}

/// examples/xor_network.sql: the network reaches >= 95% training accuracy,
/// and its parameters are those of the same gradient descent run here with
/// hand-written backpropagation.
#[test]
fn xor_network_learns_xor() {
    let out = dfgrad_ok(&["--format", "csv", "-q", "-f", &example("xor_network.sql")]);
    let table = Table::only(&out);
    assert_eq!(table.last()[0], 500.0, "{out}");
    let trained = Net::from_flat(&table.last_values(&Net::COLUMNS));

    let data: Vec<(f64, f64, f64)> = (1..=500)
        .map(|i| {
            let i = i as f64;
            let x1 = (i * 1.7 + 0.3).sin();
            let x2 = (i * 2.3 + 0.1).cos();
            (x1, x2, if x1 * x2 > 0.0 { 1.0 } else { 0.0 })
        })
        .collect();
    let n = data.len() as f64;

    // The same initialization and 500 steps of gradient descent, rate 2.
    let mut net = Net {
        hidden: [
            [1.3f64.sin(), 2.1f64.cos(), 0.0],
            [2.6f64.sin(), 4.2f64.cos(), 0.0],
            [3.9f64.sin(), 6.3f64.cos(), 0.0],
            [5.2f64.sin(), 8.4f64.cos(), 0.0],
        ],
        u: [
            0.5 * 3.7f64.sin(),
            0.5 * 7.4f64.sin(),
            0.5 * 11.1f64.sin(),
            0.5 * 14.8f64.sin(),
        ],
        c: 0.0,
    };
    for _ in 0..500 {
        let mut g = Net {
            hidden: [[0.0; 3]; 4],
            u: [0.0; 4],
            c: 0.0,
        };
        for &(x1, x2, label) in &data {
            let (h, o) = net.forward(x1, x2);
            // d(log-loss)/d(logit) = sigmoid(o) - label.
            let r = (1.0 / (1.0 + (-o).exp()) - label) / n;
            g.c += r;
            for (j, hj) in h.iter().enumerate() {
                g.u[j] += r * hj;
                let dz = r * net.u[j] * (1.0 - hj * hj);
                g.hidden[j][0] += dz * x1;
                g.hidden[j][1] += dz * x2;
                g.hidden[j][2] += dz;
            }
        }
        let stepped: Vec<f64> = net
            .flat()
            .iter()
            .zip(g.flat())
            .map(|(p, d)| p - 2.0 * d)
            .collect();
        net = Net::from_flat(&stepped);
    }
    let err = max_abs_diff(&trained.flat(), &net.flat());
    assert!(
        err < 1e-6,
        "max |SQL - Rust| = {err:e}\nSQL  {trained:?}\nRust {net:?}"
    );

    // Accuracy and loss of the SQL-trained parameters, computed here.
    let (mut loss, mut correct) = (0.0, 0usize);
    for &(x1, x2, label) in &data {
        let (_, o) = trained.forward(x1, x2);
        loss += (o.max(0.0) - o * label + (1.0 + (-o.abs()).exp()).ln()) / n;
        if (o > 0.0) == (label > 0.0) {
            correct += 1;
        }
    }
    let accuracy = correct as f64 / n;
    let last = table.last();
    assert!((last[table.col("loss")] - loss).abs() < 1e-12);
    assert!((last[table.col("accuracy")] - accuracy).abs() < 1e-12);
    assert!(accuracy >= 0.95, "training accuracy {accuracy}");
    assert_decreasing(&table, "loss");
}

/// A training step as DML: `INSERT INTO params SELECT <one step> FROM <the
/// latest params> CROSS JOIN points` repeated 200 times in one session
/// reaches the parameters of the recursive query of
/// examples/linear_regression.sql at every reported step.
#[test]
fn insert_training_step_matches_recursive_query() {
    let file = example("linear_regression.sql");
    let recursive = Table::only(&dfgrad_ok(&["--format", "csv", "-q", "-f", &file]));
    assert_eq!(recursive.last()[0], 200.0);

    // The example's `points` table, then the parameters table and the steps.
    let source = std::fs::read_to_string(&file).unwrap();
    let start = source.find("CREATE TABLE points").expect("points table");
    let end = start + source[start..].find(';').unwrap() + 1;
    let mut script = source[start..end].to_string();
    script.push_str(
        "\nCREATE TABLE params AS \
         SELECT 0 AS step, CAST(0.0 AS DOUBLE) AS w, CAST(0.0 AS DOUBLE) AS b;\n",
    );
    let step = "INSERT INTO params
        SELECT step + 1,
               w - 0.5 * grad(avg(power(w * x + b - y, 2)), w),
               b - 0.5 * grad(avg(power(w * x + b - y, 2)), b)
        FROM (SELECT * FROM params ORDER BY step DESC LIMIT 1) p CROSS JOIN points
        GROUP BY step, w, b;\n";
    script.push_str(&step.repeat(200));
    script.push_str(
        "SELECT count(*) AS n, max(step) AS last_step FROM params;\n\
         SELECT step, w, b FROM params WHERE step % 25 = 0 ORDER BY step;\n",
    );
    let out = dfgrad_ok(&["--format", "csv", "-q", "-c", &script]);

    let count = Table::after_header(&out, "n,last_step");
    assert_eq!(count.rows, vec![vec![201.0, 200.0]], "{out}");
    let dml = Table::after_header(&out, "step,w,b");
    assert_eq!(dml.rows.len(), recursive.rows.len(), "{out}");
    for (d, r) in dml.rows.iter().zip(&recursive.rows) {
        assert_eq!(d[0], r[0]);
        let err = max_abs_diff(&d[1..3], &r[1..3]);
        assert!(err < 1e-12, "step {}: DML {d:?} vs recursive {r:?}", d[0]);
    }
}

/// examples/mlp.sql: a 784-20-10 network trained in one recursive query on
/// tensor columns learns the synthetic task (held-out accuracy), and its
/// training loss falls at every reported step.
#[test]
fn mlp_learns_held_out_samples() {
    let table = Table::only(&dfgrad_ok(&[
        "--format",
        "csv",
        "-q",
        "-f",
        &example("mlp.sql"),
    ]));
    assert_eq!(table.rows.len(), 11, "steps 0, 10, …, 100");
    assert_decreasing(&table, "loss");
    let first = table.rows[0][table.col("test_accuracy")];
    let last = table.last_values(&["test_accuracy", "loss"]);
    assert!(
        first < 0.3,
        "untrained accuracy {first} should be near chance"
    );
    assert!(
        last[0] >= 0.95,
        "held-out accuracy after 100 steps: {}",
        last[0]
    );
    assert!(last[1] < 0.05, "training loss after 100 steps: {}", last[1]);
}

/// examples/fit_simulation.sql: Gauss–Newton on a simulation written as a
/// recursive query, its sensitivities taken through the recursion, gives
/// the same parameters as the same six steps computed here, with the
/// sensitivities propagated by hand (dx'/da = x(1−x)·dt + (1 + dt·a(1−2x))·dx/da).
#[test]
fn fit_simulation_through_its_recursion_matches_gauss_newton() {
    let out = dfgrad_ok(&[
        "--format",
        "csv",
        "-q",
        "-f",
        &example("fit_simulation.sql"),
    ]);
    let table = Table::only(&out);
    let fitted = table.last_values(&["a", "x0", "rmse"]);

    let dt = 0.1;
    let observed: Vec<(usize, f64)> = {
        let mut x = 0.05f64;
        let mut all = Vec::new();
        for step in 0..=60usize {
            if step % 5 == 0 {
                all.push((step, x + 0.004 * (step as f64 * 12.9898).sin()));
            }
            x += dt * 1.8 * x * (1.0 - x);
        }
        all
    };
    // x, dx/da, dx/dx0 at every step
    let simulate = |a: f64, x0: f64| {
        let (mut x, mut ja, mut jx) = (x0, 0.0f64, 1.0f64);
        let mut states = Vec::new();
        for _ in 0..=60 {
            states.push((x, ja, jx));
            let growth = 1.0 + dt * a * (1.0 - 2.0 * x);
            ja = dt * x * (1.0 - x) + growth * ja;
            jx *= growth;
            x += dt * a * x * (1.0 - x);
        }
        states
    };
    let (mut a, mut x0) = (1.0f64, 0.2f64);
    for _ in 0..6 {
        let states = simulate(a, x0);
        let (mut saa, mut sax, mut sxx, mut sar, mut sxr) = (0.0, 0.0, 0.0, 0.0, 0.0);
        for &(step, obs) in &observed {
            let (x, ja, jx) = states[step];
            let r = x - obs;
            saa += ja * ja;
            sax += ja * jx;
            sxx += jx * jx;
            sar += ja * r;
            sxr += jx * r;
        }
        let det = saa * sxx - sax * sax;
        (a, x0) = (
            a - (sxx * sar - sax * sxr) / det,
            x0 - (saa * sxr - sax * sar) / det,
        );
    }
    let states = simulate(a, x0);
    let mse = observed
        .iter()
        .map(|&(step, obs)| (states[step].0 - obs).powi(2))
        .sum::<f64>()
        / observed.len() as f64;
    for (got, want) in fitted.iter().zip([a, x0, mse.sqrt()]) {
        assert!(
            (got - want).abs() <= 1e-9 * want.abs().max(1e-3),
            "SQL {fitted:?}, Rust ({a}, {x0}, {})",
            mse.sqrt()
        );
    }
    assert!(
        (a - 1.8).abs() < 0.05 && (x0 - 0.05).abs() < 0.01,
        "{a} {x0}"
    );
}

/// examples/recover_initial_state.sql: gradient descent on a 16-element
/// initial state through 20 residual steps (reverse mode through the
/// recursion) gives the same loss and error as the same 15 descent steps
/// computed here, the gradient propagated by hand (the step is elementwise:
/// dv_T/dv0 = Π (1 + 0.1 (1 − tanh² v_t))).
#[test]
fn recover_initial_state_through_its_recursion_matches_gradient_descent() {
    let out = dfgrad_ok(&[
        "--format",
        "csv",
        "-q",
        "-f",
        &example("recover_initial_state.sql"),
    ]);
    let got = Table::only(&out).last_values(&["loss", "error"]);

    let (steps, n) = (20, 16);
    let truth: Vec<f64> = (1..=n).map(|i| 0.5 * (i as f64 * 12.9898).sin()).collect();
    // The final state and its derivative with respect to the initial one.
    let run = |v0: &[f64]| -> (Vec<f64>, Vec<f64>) {
        let (mut v, mut d) = (v0.to_vec(), vec![1.0; v0.len()]);
        for _ in 0..steps {
            for (v, d) in v.iter_mut().zip(d.iter_mut()) {
                let t = v.tanh();
                *d *= 1.0 + 0.1 * (1.0 - t * t);
                *v += 0.1 * t;
            }
        }
        (v, d)
    };
    let observed = run(&truth).0;
    let mut guess = vec![0.0; n];
    for _ in 0..15 {
        let (v, d) = run(&guess);
        for i in 0..n {
            guess[i] -= 0.01 * 2.0 * (v[i] - observed[i]) * d[i];
        }
    }
    let v = run(&guess).0;
    let loss: f64 = v.iter().zip(&observed).map(|(a, b)| (a - b).powi(2)).sum();
    let error: f64 = guess.iter().zip(&truth).map(|(a, b)| (a - b).powi(2)).sum();
    for (got, want) in got.iter().zip([loss, error]) {
        assert!(
            (got - want).abs() <= 1e-9 * want.abs(),
            "SQL {got}, Rust {want}"
        );
    }
    assert!(loss < 0.05 && error < 0.01, "{loss} {error}");
}

/// examples/learning_rates.sql: three hyper-steps of descent on 24
/// per-weight log learning rates, each through the 15 aggregating steps of
/// a training loop (reverse mode through the recursion), give the
/// validation losses of the same descent computed here, its hypergradients
/// by central differences of the training loop run in plain Rust.
#[test]
fn learning_rates_through_a_training_loop_match_finite_differences() {
    let out = dfgrad_ok(&[
        "--format",
        "csv",
        "-q",
        "-f",
        &example("learning_rates.sql"),
    ]);
    let got = Table::after_header(&out, "hyper_step,validation_loss");
    let (n, steps) = (24, 15);
    let x: Vec<Vec<f64>> = (1..=600)
        .map(|i| {
            (0..n)
                .map(|k| (i as f64 * (k + 1) as f64 * 0.37 + k as f64).sin())
                .collect()
        })
        .collect();
    let truth: Vec<f64> = (0..n).map(|k| 0.3 * (k as f64 * 1.7).cos()).collect();
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(a, b)| a * b).sum::<f64>();
    let y: Vec<f64> = x.iter().map(|x| dot(x, &truth).tanh()).collect();
    let (train, valid) = (0..400, 400..600);
    let loss = |w: &[f64], rows: std::ops::Range<usize>| {
        let count = rows.len() as f64;
        rows.map(|i| (dot(w, &x[i]).tanh() - y[i]).powi(2))
            .sum::<f64>()
            / count
    };
    let validation = |log_lr: &[f64]| {
        let mut w = vec![0.0; n];
        for _ in 0..steps {
            let mut g = vec![0.0; n];
            for i in train.clone() {
                let t = dot(&w, &x[i]).tanh();
                let d = 2.0 * (t - y[i]) * (1.0 - t * t) / train.len() as f64;
                for k in 0..n {
                    g[k] += d * x[i][k];
                }
            }
            for k in 0..n {
                w[k] -= log_lr[k].exp() * g[k];
            }
        }
        loss(&w, valid.clone())
    };
    let mut log_lr = vec![0.1f64.ln(); n];
    let mut want = Vec::new();
    for _ in 0..3 {
        want.push(validation(&log_lr));
        let h = 1e-5;
        let grad: Vec<f64> = (0..n)
            .map(|k| {
                let (mut up, mut down) = (log_lr.clone(), log_lr.clone());
                up[k] += h;
                down[k] -= h;
                (validation(&up) - validation(&down)) / (2.0 * h)
            })
            .collect();
        for k in 0..n {
            log_lr[k] -= 20.0 * grad[k];
        }
    }
    let got: Vec<f64> = got.rows.iter().map(|r| r[1]).collect();
    assert_eq!(got.len(), 3, "{out}");
    for (got, want) in got.iter().zip(&want) {
        assert!(
            (got - want).abs() <= 1e-7 * want.abs(),
            "SQL {got}, Rust {want}"
        );
    }
    assert!(want[2] < 0.85 * want[0], "{want:?}");
}

/// examples/data_valuation.sql: the derivative of the validation loss after
/// 30 steps of weighted descent with respect to each training row's weight
/// (relational reverse mode through the loop) gives the central
/// differences of the same descent run here, for the ten rows it ranks
/// first, and those begin with the eight rows whose labels were flipped.
#[test]
fn data_valuation_through_a_training_loop_matches_finite_differences() {
    let out = dfgrad_ok(&[
        "--format",
        "csv",
        "-q",
        "-f",
        &example("data_valuation.sql"),
    ]);
    let got = Table::after_header(&out, "i,harm");
    let x = |i: usize| {
        let v = i as f64;
        [(v * 0.37).sin(), (v * 0.91).cos(), (v * 1.3 + 1.0).sin()]
    };
    let dot = |a: &[f64; 3], b: &[f64; 3]| a.iter().zip(b).map(|(a, b)| a * b).sum::<f64>();
    let truth = [0.8, -0.5, 0.3];
    let train: Vec<([f64; 3], f64)> = (1..=200)
        .map(|i| {
            let sign = if i % 25 == 0 { -1.0 } else { 1.0 };
            (x(i), sign * dot(&x(i), &truth).tanh())
        })
        .collect();
    let valid: Vec<([f64; 3], f64)> = (201..=300)
        .map(|i| (x(i), dot(&x(i), &truth).tanh()))
        .collect();
    let validation = |wt: &[f64]| {
        let mut w = [0.0; 3];
        let total: f64 = wt.iter().sum();
        for _ in 0..30 {
            let mut g = [0.0; 3];
            for ((x, y), wt) in train.iter().zip(wt) {
                let t = dot(&w, x).tanh();
                let d = wt * 2.0 * (t - y) * (1.0 - t * t);
                for k in 0..3 {
                    g[k] += d * x[k];
                }
            }
            for k in 0..3 {
                w[k] -= 0.5 * g[k] / total;
            }
        }
        valid
            .iter()
            .map(|(x, y)| (dot(&w, x).tanh() - y).powi(2))
            .sum::<f64>()
            / valid.len() as f64
    };
    assert_eq!(got.rows.len(), 10, "{out}");
    let h = 1e-5;
    for row in &got.rows {
        let i = row[0] as usize;
        let (mut up, mut down) = (vec![1.0; 200], vec![1.0; 200]);
        up[i - 1] += h;
        down[i - 1] -= h;
        let want = (validation(&up) - validation(&down)) / (2.0 * h);
        assert!(
            (row[1] - want).abs() <= 1e-6 * want.abs() + 1e-12,
            "row {i}: SQL {}, Rust {want}",
            row[1]
        );
    }
    let mut first: Vec<usize> = got.rows[..8].iter().map(|r| r[0] as usize).collect();
    first.sort_unstable();
    assert_eq!(first, (1..=8).map(|k| 25 * k).collect::<Vec<_>>(), "{out}");
}

//! Random expressions over `x` and `y` and their derivatives up to third
//! order, planned in a datafusion-grad session and, exported as SQL text
//! ([`rewrite_sql`]), in a stock DataFusion session: shared by
//! `benches/planning.rs` and the tests of `tests/planning.rs`.

use std::time::{Duration, Instant};

use datafusion::error::Result;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_grad::export::{rewrite_sql, SqlDialect};
use rand::rngs::StdRng;
use rand::Rng;

/// The one-row table every query reads.
pub const FROM: &str = "FROM (VALUES (0.3, 0.7)) AS t(x, y)";

/// A random expression over `x` and `y` and its number of expression nodes
/// (columns, literals, operators, function calls, `CASE`s), at most
/// `max_nodes`. The productions are those of `tests/properties.rs`, with
/// `asinh`, plain division and `power` with a variable exponent added.
pub fn random_expression(rng: &mut StdRng, max_nodes: usize) -> (String, usize) {
    loop {
        let (text, nodes) = grow(rng, 5);
        if nodes <= max_nodes && text.contains('x') && text.contains('y') {
            return (text, nodes);
        }
    }
}

/// A random expression of depth ≤ `depth` and its node count.
fn grow(rng: &mut StdRng, depth: u32) -> (String, usize) {
    if depth == 0 || rng.random_bool(0.2) {
        return match rng.random_range(0..4) {
            0 => ("x".into(), 1),
            1 => ("y".into(), 1),
            _ => (format!("{:.2}", rng.random_range(-2.0..2.0)), 1),
        };
    }
    let ((a, na), (b, nb)) = (grow(rng, depth - 1), grow(rng, depth - 1));
    match rng.random_range(0..24) {
        0 => (format!("({a} + {b})"), 1 + na + nb),
        1 => (format!("({a} - {b})"), 1 + na + nb),
        2 | 3 => (format!("({a} * {b})"), 1 + na + nb),
        4 => (format!("({a} / (1.5 + {b} * {b}))"), 4 + na + 2 * nb),
        5 => (format!("sin({a})"), 1 + na),
        6 => (format!("cos({a})"), 1 + na),
        7 => (format!("exp(0.3 * {a})"), 3 + na),
        8 => (format!("ln(1.0 + {a} * {a})"), 4 + 2 * na),
        9 => (format!("sqrt(0.5 + {a} * {a})"), 4 + 2 * na),
        10 => (format!("power({a}, 2)"), 2 + na),
        11 => (
            format!("power(1.2 + {a} * {a}, 0.5 * {b})"),
            6 + 2 * na + nb,
        ),
        12 => (format!("tanh({a})"), 1 + na),
        13 => (format!("atan({a})"), 1 + na),
        14 => (format!("atan2({a}, 1.0 + {b} * {b})"), 4 + na + 2 * nb),
        15 => (format!("abs({a})"), 1 + na),
        16 => (format!("greatest({a}, {b})"), 1 + na + nb),
        17 => (format!("least({a}, {b})"), 1 + na + nb),
        18 => (
            format!("CASE WHEN {a} > 0.1 THEN {b} ELSE {a} * {b} END"),
            5 + 2 * na + 2 * nb,
        ),
        19 => (format!("coalesce({a}, {b})"), 1 + na + nb),
        20 => (format!("-({a})"), 1 + na),
        21 => (format!("asinh({a})"), 1 + na),
        22 => (format!("({a} / {b})"), 1 + na + nb),
        _ => (format!("power(1.0 + {a} * {a}, {b})"), 5 + 2 * na + nb),
    }
}

/// The derivative of `f` with respect to `wrt[0]`, then of that with
/// respect to `wrt[1]`, …: nested `grad` calls.
pub fn nested_grad(f: &str, wrt: &[&str]) -> String {
    wrt.iter()
        .fold(f.to_string(), |e, v| format!("grad({e}, {v})"))
}

/// Times planning `sql` in `ctx`, from the SQL text to the physical plan
/// (parsing, analysis, optimization, physical planning).
pub async fn plan(ctx: &SessionContext, sql: &str) -> Result<Duration> {
    let start = Instant::now();
    ctx.sql(sql).await?.create_physical_plan().await?;
    Ok(start.elapsed())
}

/// What planning one query took.
#[derive(Debug, Clone)]
pub struct Timing {
    /// Planning the query in a datafusion-grad session.
    pub dfgrad: Duration,
    /// Rewriting it into SQL text without markers.
    pub export: Duration,
    /// Planning that text in a stock DataFusion session.
    pub stock: Duration,
    /// Characters of that text.
    pub text_len: usize,
}

/// Plans `sql` in `ctx` (a datafusion-grad session), exports it as
/// DataFusion SQL and plans the text in a stock DataFusion session. That
/// session's SQL parser allows deeper nesting than its default of 50
/// (`datafusion.sql_parser.recursion_limit`): a third derivative's text
/// nests deeper.
pub async fn time_query(ctx: &SessionContext, sql: &str) -> Result<Timing> {
    let dfgrad = plan(ctx, sql).await?;
    let start = Instant::now();
    let text = rewrite_sql(ctx, sql, SqlDialect::DataFusion).await?;
    let export = start.elapsed();
    let config = SessionConfig::new().set_usize("datafusion.sql_parser.recursion_limit", 10_000);
    let stock = plan(&SessionContext::new_with_config(config), &text).await?;
    Ok(Timing {
        dfgrad,
        export,
        stock,
        text_len: text.len(),
    })
}

//! The differentiation engine, shared by the markers' `simplify`, the analyzer
//! rule and the text export.
//!
//! `f` is interned into a hash-consed DAG ([`graph`]); nodes that depend on a
//! variable are *active*. Reverse mode (`grad`, `vjp`) walks the active nodes
//! in reverse topological order, summing adjoint contributions
//! `adjoint(out) · ∂out/∂arg` from the rule table ([`crate::rules`]); forward
//! mode (`jvp`) walks them in order, summing `∂out/∂arg · tangent(arg)`. Each
//! partial is interned into the same DAG, so shared subexpressions stay shared
//! and the derivative of an `n`-node expression is `O(n)` nodes.
//!
//! Semantics fixed here:
//! - Integer and decimal variables are promoted to Float64 (`f` is treated as
//!   a real function: over an integer `x`, `x * x` has derivative `2x`), but
//!   integer `/` and `%` stay the step functions the query evaluates
//!   (truncating division): over an integer `x`, `x / 2` has derivative 0.
//! - A derivative is SQL NULL exactly when `f` (or a tangent/cotangent) is NULL.
//! - A path through an unselected branch (`CASE`, `coalesce`, `greatest`, …)
//!   contributes nothing, even where that branch is NaN or NULL.

pub mod call;
mod columns;
pub mod graph;
mod guard;
mod nulls;
pub mod primitive;
pub mod share;
// pub for the tests in tests/unit/engine_sign.rs
#[doc(hidden)]
pub mod sign;
mod sweep;
mod template;
pub mod workspace;

use datafusion::common::{Column, DFSchema};
use datafusion::error::Result;
use datafusion::logical_expr::Expr;

use crate::error::{fail, ErrorKind};
use crate::rules::Rules;
pub use share::{share, Layer, Shared};
pub use workspace::Workspace;

/// What to differentiate and how to seed it.
#[derive(Debug, Clone)]
pub enum Seed {
    /// Reverse mode with cotangent 1: one derivative per variable.
    Grad,
    /// Forward mode with one tangent per variable: one directional derivative.
    Jvp(Vec<Expr>),
    /// Reverse mode with this cotangent: one derivative per variable.
    Vjp(Expr),
}

/// A derivative and its size.
#[derive(Debug, Clone)]
pub struct Derivative {
    /// The derivative expressions: one per variable (`grad`, `vjp`) or one (`jvp`).
    pub exprs: Vec<Expr>,
    /// Distinct nodes of `f`.
    pub forward_nodes: usize,
    /// Distinct nodes of all derivative expressions together, as a DAG.
    pub derivative_nodes: usize,
}

/// Largest derivative (in expression-tree nodes) that [`differentiate`]
/// emits as plain expression trees; beyond it, shared subexpressions must be
/// bound to columns ([`share`]), as the analyzer rule does.
pub const MAX_TREE_NODES: u64 = 50_000;

/// Differentiates `f` with respect to the columns `wrt`, as seeded by `seed`,
/// into self-contained expression trees.
///
/// `schema` is the schema `f` is evaluated against; the result expressions are
/// Float64 and need no further type coercion. A derivative whose trees would
/// exceed [`MAX_TREE_NODES`] is refused ([`ErrorKind::DerivativeTooLarge`]).
pub fn differentiate(
    f: &Expr,
    wrt: &[Column],
    seed: Seed,
    schema: &DFSchema,
    rules: &Rules,
) -> Result<Derivative> {
    differentiate_with_hints(f, wrt, seed, schema, rules, vec![])
}

/// [`differentiate`], declaring for each `(t, v)` of `nulls_like` that the
/// tangent `t` is SQL NULL exactly where `v` is (see
/// [`Workspace::nulls_like`]).
pub(crate) fn differentiate_with_hints(
    f: &Expr,
    wrt: &[Column],
    seed: Seed,
    schema: &DFSchema,
    rules: &Rules,
    nulls_like: Vec<(Expr, Expr)>,
) -> Result<Derivative> {
    let mut ws = Workspace::new(schema, rules);
    let forward = ws.intern(f)?;
    for (t, v) in nulls_like {
        ws.nulls_like(t, v);
    }
    let roots = ws.derivative(f, wrt, seed)?;
    let g = ws.graph();
    let tree = g.tree_size(&roots);
    if tree > MAX_TREE_NODES {
        return fail(
            ErrorKind::DerivativeTooLarge,
            format!(
                "the derivative of `{}` has {tree} expression nodes when written out without \
                 sharing (limit {MAX_TREE_NODES}); use the marker in a SELECT list, WHERE, \
                 GROUP BY, ORDER BY or aggregate of a context with datafusion_grad's analyzer \
                 rule installed, which computes shared parts once",
                truncated(f)
            ),
        );
    }
    Ok(Derivative {
        exprs: g.emit(&roots),
        forward_nodes: g.size(&[forward]),
        derivative_nodes: g.size(&roots),
    })
}

/// Differentiates `f` into [`Shared`] form: shared subexpressions bound to
/// columns `{prefix}{node}` computed by projections below the expressions.
pub fn differentiate_shared(
    f: &Expr,
    wrt: &[Column],
    seed: Seed,
    schema: &DFSchema,
    rules: &Rules,
    prefix: &str,
) -> Result<(Shared, Derivative)> {
    let mut ws = Workspace::new(schema, rules);
    let forward = ws.intern(f)?;
    let forward_nodes = ws.graph().size(&[forward]);
    let roots = ws.derivative(f, wrt, seed)?;
    let derivative_nodes = ws.graph().size(&roots);
    let shared = share(&mut ws, &roots, &vec![true; roots.len()], prefix)?;
    let sizes = Derivative {
        exprs: shared.exprs.clone(),
        forward_nodes,
        derivative_nodes,
    };
    Ok((shared, sizes))
}

/// `f` for an error message, cut to a readable length.
fn truncated(f: &Expr) -> String {
    let s = f.to_string();
    match s.char_indices().nth(120) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s,
    }
}

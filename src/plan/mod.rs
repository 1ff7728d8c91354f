//! The plan-level rewrites: what differentiating a query needs beyond one
//! expression, built on the engine ([`crate::engine`]).
//!
//! - [`analyzer`]: the analyzer rule installed with the markers, and its
//!   rewrites through aggregates and scalar subqueries (child modules);
//! - [`lineage`]: where a column a marker reads comes from (derived columns
//!   inlined, re-reads of the variable's rows refused);
//! - [`reverse`]: relational reverse mode, the gradient of a loss query
//!   with respect to every row of a parameter relation (a backward pass
//!   over the loss's plan, one transpose per relational operator);
//! - [`free_variables`]: variables from outside the rows (outer references,
//!   `PREPARE` parameters) localized as columns;
//! - [`expand`]: one marker call as self-contained expressions (what
//!   `simplify` returns);
//! - [`bindings`]: the projections that bind shared parts, written back
//!   inline for the text export and DML;
//! - [`dml`]: `UPDATE`/`DELETE` over computed columns;
//! - [`broadcast`]: the physical rule that broadcasts a global aggregate;
//! - [`shared`]: subplans read several times (the forward aggregates a
//!   backward pass reads again) computed once per query;
//! - [`iterate`]: recursive queries whose recursive term reads the work
//!   table more than once (a training step's loss over its parameters);
//! - [`iterations`]: the bound on a recursive query's iterations, and their
//!   progress;
//! - [`invariant`]: the parts of a recursive term that do not read the work
//!   table (a training loop's data), computed once for all iterations.
//!
//! ```sql
//! -- through an aggregate: d/dw avg((w·x − y)²), one value per group
//! SELECT g, grad(avg(power(w * x - y, 2)), w) FROM t GROUP BY g, w;
//! ```

pub mod analyzer;
pub mod bindings;
pub mod broadcast;
pub mod dml;
pub mod expand;
pub mod free_variables;
pub mod invariant;
pub mod iterate;
pub mod iterations;
pub mod lineage;
pub mod reverse;
pub mod shared;

use datafusion::logical_expr::Expr;

/// `e` without its top-level aliases.
pub(crate) fn unalias(e: &Expr) -> &Expr {
    match e {
        Expr::Alias(a) => unalias(&a.expr),
        e => e,
    }
}

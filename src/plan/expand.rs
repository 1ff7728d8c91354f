//! A marker call rewritten into its derivative as self-contained
//! expressions: what the markers' `simplify` returns, and what the analyzer
//! rule does for markers it has no plan context for (see
//! [`crate::engine::differentiate`]).
//!
//! ```sql
//! SELECT grad(x * x * y, x, y) FROM t;   -- named_struct('x', 2·x·y, 'y', x·x)
//! ```

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::DFSchema;
use datafusion::error::Result;
use datafusion::functions::core::expr_fn::named_struct;
use datafusion::logical_expr::{lit, Expr};

use super::free_variables::localize;
use crate::engine::call::{as_marker, MarkerCall};
use crate::engine::differentiate_with_hints;

/// The derivative `call` stands for, over `schema`. A variable that is an
/// outer reference (a marker inside a subquery) or a prepared statement's
/// parameter is localized first (see [`super::free_variables`]).
pub fn expand_call(call: MarkerCall<'_>, schema: &DFSchema) -> Result<Expr> {
    let kind = call.kind();
    if let Some(local) = localize(kind, call.args, schema)? {
        let inner = MarkerCall {
            marker: call.marker,
            args: &local.args,
        };
        return local.restore(expand_call(inner, &local.schema)?);
    }
    let args = call.args;
    let (wrt, seed) = kind.request(args)?;
    let rules = call.marker.rules().read().expect("rule table lock");
    let hints = call
        .marker
        .nulls_like()
        .iter()
        .filter_map(|&(t, v)| Some((args.get(t)?.clone(), args.get(v)?.clone())))
        .collect();
    let mut exprs = differentiate_with_hints(&args[0], &wrt, seed, schema, &rules, hints)?.exprs;
    if exprs.len() == 1 {
        return Ok(exprs.remove(0));
    }
    let fields = kind.struct_names(wrt.iter().map(|c| c.name.as_str()))?;
    Ok(named_struct(
        fields
            .into_iter()
            .zip(exprs)
            .flat_map(|(name, e)| [lit(name), e])
            .collect(),
    ))
}

/// Rewrites every marker call in `expr` (innermost first) into its derivative.
pub fn expand_markers(expr: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    expr.transform_up(|e| match as_marker(&e) {
        Some(call) => Ok(Transformed::yes(expand_call(call, schema)?)),
        None => Ok(Transformed::no(e)),
    })
}

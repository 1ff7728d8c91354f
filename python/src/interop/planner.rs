//! The query planner installed into a stock session: it differentiates the
//! plans the session hands over and plans them in a session of ours.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::execution::context::QueryPlanner;
use datafusion::execution::FunctionRegistry;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{Expr, LogicalPlan, WindowFunctionDefinition};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;

use super::session_over;
use crate::handoff::Handoff;

/// Differentiates and plans the plans a stock session hands over.
#[derive(Debug)]
pub struct GradPlanner;

#[async_trait]
impl QueryPlanner for GradPlanner {
    async fn create_physical_plan(
        &self,
        plan: &LogicalPlan,
        session: &dyn Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let ctx = session_over(session);
        // The caller optimized the plan before handing it over: its common
        // subexpressions hide base columns the derivative may need, and its
        // scans of one table, narrowed differently, hide that they read the
        // same rows (relational reverse mode matches a loss's reads of the
        // parameter rows by their scan).
        let plan = adopt_functions(plan.clone(), &ctx)?;
        let plan =
            datafusion_grad::widen_scans(datafusion_grad::inline_common_subexpressions(plan)?)?;
        let physical = ctx.state().create_physical_plan(&plan).await?;
        Ok(Arc::new(Handoff::new(physical)))
    }
}

/// `plan` with every function call bound to `ctx`'s own implementation of
/// that name where it has one: the markers (which the decoded plan names,
/// possibly as foreign UDFs), and DataFusion's built-ins, which then run
/// natively instead of through FFI (whose scalar UDF does not pass literal
/// arguments to `return_field_from_args`, which `get_field` needs). The
/// caller's own functions (e.g. Python UDFs) stay foreign.
fn adopt_functions(plan: LogicalPlan, ctx: &SessionContext) -> Result<LogicalPlan> {
    plan.transform_up_with_subqueries(|node| {
        node.map_expressions(|e| {
            e.transform_up(|e| match e {
                Expr::ScalarFunction(f) => match ctx.udf(f.name()) {
                    Ok(ours) if *ours != *f.func => Ok(Transformed::yes(Expr::ScalarFunction(
                        ScalarFunction::new_udf(ours, f.args),
                    ))),
                    _ => Ok(Transformed::no(Expr::ScalarFunction(f))),
                },
                Expr::AggregateFunction(mut f) => match ctx.udaf(f.func.name()) {
                    Ok(ours) if *ours != *f.func => {
                        f.func = ours;
                        Ok(Transformed::yes(Expr::AggregateFunction(f)))
                    }
                    _ => Ok(Transformed::no(Expr::AggregateFunction(f))),
                },
                Expr::WindowFunction(mut w) => {
                    let ours = match &w.fun {
                        WindowFunctionDefinition::AggregateUDF(f) => ctx
                            .udaf(f.name())
                            .ok()
                            .filter(|ours| **ours != **f)
                            .map(WindowFunctionDefinition::AggregateUDF),
                        WindowFunctionDefinition::WindowUDF(f) => ctx
                            .udwf(f.name())
                            .ok()
                            .filter(|ours| **ours != **f)
                            .map(WindowFunctionDefinition::WindowUDF),
                    };
                    match ours {
                        Some(fun) => {
                            w.fun = fun;
                            Ok(Transformed::yes(Expr::WindowFunction(w)))
                        }
                        None => Ok(Transformed::no(Expr::WindowFunction(w))),
                    }
                }
                e => Ok(Transformed::no(e)),
            })
        })
    })
    .map(|t| t.data)
}

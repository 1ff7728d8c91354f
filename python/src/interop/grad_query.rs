//! The table function `grad_query('<SQL>')`: a whole query — recursive CTEs
//! included — planned and run by datafusion-grad over the caller's catalogs;
//! only its execution plan crosses the FFI boundary.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{plan_err, ScalarValue};
use datafusion::error::Result;
use datafusion::execution::session_state::SessionState;
use datafusion::logical_expr::{Expr, LogicalPlan, TableType};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::ExecutionPlan;

use super::session_over;
use crate::runtime::block_on_detached;

/// `grad_query('<SQL>')`: the query's result, computed by datafusion-grad.
#[derive(Debug)]
pub struct GradQuery;

impl TableFunctionImpl for GradQuery {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let sql = match args.exprs() {
            [Expr::Literal(
                ScalarValue::Utf8(Some(sql))
                | ScalarValue::LargeUtf8(Some(sql))
                | ScalarValue::Utf8View(Some(sql)),
                _,
            )] => sql.clone(),
            _ => return plan_err!("grad_query takes one string literal: the SQL query to run"),
        };
        let ctx = session_over(args.session());
        let state = ctx.state();
        let plan = block_on_detached(state.create_logical_plan(&sql))?;
        if let Some(kind) = not_a_query(&plan) {
            return plan_err!(
                "grad_query runs queries; {kind} must be run by the session itself \
                 (INSERT INTO t SELECT * FROM grad_query('...') works)"
            );
        }
        let plan = state.optimize(&plan)?;
        Ok(Arc::new(QueryTable { state, plan }))
    }
}

/// The kind of statement `plan` is, if it is not a query.
fn not_a_query(plan: &LogicalPlan) -> Option<&'static str> {
    match plan {
        LogicalPlan::Dml(_) => Some("INSERT/UPDATE/DELETE"),
        LogicalPlan::Ddl(_) => Some("CREATE/DROP"),
        LogicalPlan::Statement(_) => Some("a statement (SET, PREPARE, transaction)"),
        LogicalPlan::Copy(_) => Some("COPY"),
        _ => None,
    }
}

/// The optimized plan of a `grad_query`, planned and run in our session.
#[derive(Debug)]
struct QueryTable {
    state: SessionState,
    plan: LogicalPlan,
}

#[async_trait]
impl TableProvider for QueryTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(self.plan.schema().inner())
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let plan = self.state.create_physical_plan(&self.plan).await?;
        let Some(projection) = projection else {
            return Ok(plan);
        };
        let schema = plan.schema();
        let columns: Vec<(Arc<dyn datafusion::physical_expr::PhysicalExpr>, String)> = projection
            .iter()
            .map(|&i| {
                let name = schema.field(i).name().clone();
                (Arc::new(Column::new(&name, i)) as _, name)
            })
            .collect();
        Ok(Arc::new(ProjectionExec::try_new(columns, plan)?))
    }
}

//! The check that a parameter relation's rows are told apart by their
//! identity columns: a gradient table row that stands for several
//! parameter rows fails when it is computed.
//!
//! In-process it is a UDF with a typed error; for engines that do not have
//! the UDF (exported SQL text, Ballista's executors) [`plain_checks`]
//! writes it as a cast of its message to a number, which fails there with
//! the message in the rows it is evaluated for.

use datafusion::arrow::array::{new_null_array, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::common::tree_node::Transformed;
use datafusion::error::Result;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    self as logical, lit, BinaryExpr, ColumnarValue, Expr, Operator, ScalarFunctionArgs,
    ScalarUDFImpl, Signature, Volatility,
};

use crate::error::{fail, ErrorKind};
use crate::reserved::DUPLICATE_ROWS;

/// `__dfgrad_duplicate_rows(n)`: fails with a typed `invalid_wrt` error
/// where some `n` (the parameter rows a gradient table row stands for) is
/// above 1; NULL elsewhere.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct DuplicateRows {
    relation: String,
    identity: Vec<String>,
    signature: Signature,
}

impl DuplicateRows {
    /// The check for the parameter relation named `relation` (in messages),
    /// whose rows the columns `identity` tell apart.
    pub fn new(relation: &str, identity: &[String]) -> Self {
        Self {
            relation: relation.to_string(),
            identity: identity.to_vec(),
            signature: Signature::any(1, Volatility::Volatile),
        }
    }

    /// The error's message: which relation, and which columns failed to
    /// tell its rows apart.
    pub(crate) fn message(&self) -> String {
        let rows = match self.identity.is_empty() {
            true => "several rows and no other column".to_string(),
            false => format!(
                "several rows with the same other columns (`{}`)",
                self.identity.join("`, `")
            ),
        };
        format!(
            "the variable's relation `{}` has {rows}, so a derivative with respect to one \
             row's value cannot be told from another's; give the relation a column that \
             identifies its rows (a key)",
            self.relation
        )
    }
}

impl ScalarUDFImpl for DuplicateRows {
    fn name(&self) -> &str {
        DUPLICATE_ROWS
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.args[0].to_array(args.number_rows)?;
        let n = cast(&n, &DataType::Int64)?;
        if !n
            .as_primitive::<Int64Type>()
            .iter()
            .any(|n| n.unwrap_or(0) > 1)
        {
            return Ok(ColumnarValue::Array(new_null_array(
                &DataType::Float64,
                args.number_rows,
            )));
        }
        fail(ErrorKind::InvalidWrt, self.message())
    }
}

/// `plan` (with its subqueries) with every duplicate-rows check written as
/// plain SQL: `CAST('<message>; parameter rows: ' || CAST(n AS VARCHAR) AS
/// DOUBLE)` where its `CASE` picks it, for an engine without the UDF.
#[cfg(feature = "ballista")]
pub(crate) fn plain_checks(
    plan: datafusion::logical_expr::LogicalPlan,
) -> Result<datafusion::logical_expr::LogicalPlan> {
    use datafusion::common::tree_node::TreeNode;
    plan.transform_up_with_subqueries(|node| node.map_expressions(|e| e.transform_up(plain_check)))
        .map(|t| t.data)
}

/// `e` written as plain SQL if it is a duplicate-rows check.
pub(crate) fn plain_check(e: Expr) -> Result<Transformed<Expr>> {
    let Expr::ScalarFunction(ScalarFunction { func, args }) = &e else {
        return Ok(Transformed::no(e));
    };
    let Some(check) = func.inner().downcast_ref::<DuplicateRows>() else {
        return Ok(Transformed::no(e));
    };
    let text = Expr::BinaryExpr(BinaryExpr::new(
        Box::new(lit(format!("{}; parameter rows: ", check.message()))),
        Operator::StringConcat,
        Box::new(logical::cast(args[0].clone(), DataType::Utf8)),
    ));
    Ok(Transformed::yes(logical::cast(text, DataType::Float64)))
}

//! The checks that rows the backward pass counts on being one are one,
//! failing when they are computed: a parameter relation's rows told apart
//! by their identity columns (a gradient table row that stands for several
//! parameter rows), and a loss query's single row (a loss is a scalar,
//! never an implicit sum of several rows).
//!
//! In-process each is a UDF with a typed error; for engines that do not
//! have the UDF (exported SQL text, Ballista's executors) [`plain_checks`]
//! writes it as a cast of its message to a number, which fails there with
//! the message in the rows it is evaluated for.

use datafusion::arrow::array::{new_null_array, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::common::tree_node::Transformed;
use datafusion::error::Result;
use datafusion::functions_aggregate::expr_fn::count;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    self as logical, lit, when, BinaryExpr, ColumnarValue, Expr, ExprSchemable, LogicalPlan,
    LogicalPlanBuilder, Operator, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};

use crate::error::{fail, ErrorKind};
use crate::reserved::{DUPLICATE_ROWS, LOSS_ROWS};

/// What a [`RowCheck`] guards.
#[derive(Debug, PartialEq, Eq, Hash)]
enum Guarded {
    /// The rows of the parameter relation `relation`, told apart by the
    /// columns `identity`.
    Identity {
        relation: String,
        identity: Vec<String>,
    },
    /// The rows of a loss query whose loss column is `column`.
    Loss { column: String },
}

/// `__dfgrad_duplicate_rows(n)` / `__dfgrad_loss_rows(n)`: fails with a
/// typed error where some `n` (the parameter rows a gradient table row
/// stands for; the rows of a loss query) is above 1; NULL elsewhere.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct RowCheck {
    guarded: Guarded,
    signature: Signature,
}

impl RowCheck {
    /// The check for the parameter relation named `relation` (in messages),
    /// whose rows the columns `identity` tell apart (`invalid_wrt`).
    pub fn identity(relation: &str, identity: &[String]) -> Self {
        Self::new(Guarded::Identity {
            relation: relation.to_string(),
            identity: identity.to_vec(),
        })
    }

    /// The check that a loss query, whose loss is its column `column`,
    /// returns one row (`shape_mismatch`).
    pub fn loss(column: &str) -> Self {
        Self::new(Guarded::Loss {
            column: column.to_string(),
        })
    }

    fn new(guarded: Guarded) -> Self {
        Self {
            guarded,
            signature: Signature::any(1, Volatility::Volatile),
        }
    }

    /// `CASE WHEN n > 1 THEN check(n) ELSE value END`: `value` (of type
    /// `value_type`), or this check's error where the count `n` is above 1.
    pub fn guard(self, n: Expr, value: Expr, value_type: &DataType) -> Result<Expr> {
        let check = ScalarUDF::new_from_impl(self).call(vec![n.clone()]);
        when(n.gt(lit(1i64)), logical::cast(check, value_type.clone())).otherwise(value)
    }

    /// The query `loss` (its loss is its first column) as one row, whose
    /// column `name` is `value`, an aggregate of the loss's rows (1, the
    /// seed of a backward pass, or the sum of one row's value): where the
    /// query returns several rows, this check's error when it is computed.
    pub fn one_loss_row(loss: LogicalPlan, value: Expr, name: &str) -> Result<LogicalPlan> {
        let value_type = value.get_type(loss.schema())?;
        let check = Self::loss(loss.schema().field(0).name());
        let value = check.guard(count(lit(1)), value, &value_type)?;
        LogicalPlanBuilder::from(loss)
            .aggregate(Vec::<Expr>::new(), vec![value.alias(name)])?
            .build()
    }

    /// The error's kind.
    pub(crate) fn kind(&self) -> ErrorKind {
        match self.guarded {
            Guarded::Identity { .. } => ErrorKind::InvalidWrt,
            Guarded::Loss { .. } => ErrorKind::ShapeMismatch,
        }
    }

    /// The error's message: what is not one row, and how to write it.
    pub(crate) fn message(&self) -> String {
        match &self.guarded {
            Guarded::Identity { relation, identity } => {
                let rows = match identity.is_empty() {
                    true => "several rows and no other column".to_string(),
                    false => format!(
                        "several rows with the same other columns (`{}`)",
                        identity.join("`, `")
                    ),
                };
                format!(
                    "the variable's relation `{relation}` has {rows}, so a derivative with \
                     respect to one row's value cannot be told from another's; give the \
                     relation a column that identifies its rows (a key)"
                )
            }
            Guarded::Loss { column } => format!(
                "the loss query returned more than one row; a loss is a scalar (one row of \
                 `{column}`), as a scalar subquery is: aggregate the rows you mean in the loss \
                 itself, e.g. write (SELECT sum({column}) FROM s) as the loss"
            ),
        }
    }

    /// The number counted, as the plain form's message ends.
    fn counted(&self) -> &'static str {
        match self.guarded {
            Guarded::Identity { .. } => "parameter rows",
            Guarded::Loss { .. } => "loss rows",
        }
    }
}

impl ScalarUDFImpl for RowCheck {
    fn name(&self) -> &str {
        match self.guarded {
            Guarded::Identity { .. } => DUPLICATE_ROWS,
            Guarded::Loss { .. } => LOSS_ROWS,
        }
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
        fail(self.kind(), self.message())
    }
}

/// `plan` (with its subqueries) with every row check written as plain
/// SQL: `CAST('<message>; <what> rows: ' || CAST(n AS VARCHAR) AS DOUBLE)`
/// where its `CASE` picks it, for an engine without the UDF.
#[cfg(feature = "ballista")]
pub(crate) fn plain_checks(
    plan: datafusion::logical_expr::LogicalPlan,
) -> Result<datafusion::logical_expr::LogicalPlan> {
    use datafusion::common::tree_node::TreeNode;
    plan.transform_up_with_subqueries(|node| node.map_expressions(|e| e.transform_up(plain_check)))
        .map(|t| t.data)
}

/// `e` written as plain SQL if it is a row check.
pub(crate) fn plain_check(e: Expr) -> Result<Transformed<Expr>> {
    let Expr::ScalarFunction(ScalarFunction { func, args }) = &e else {
        return Ok(Transformed::no(e));
    };
    let Some(check) = func.inner().downcast_ref::<RowCheck>() else {
        return Ok(Transformed::no(e));
    };
    let text = Expr::BinaryExpr(BinaryExpr::new(
        Box::new(lit(format!("{}; {}: ", check.message(), check.counted()))),
        Operator::StringConcat,
        Box::new(logical::cast(args[0].clone(), DataType::Utf8)),
    ));
    Ok(Transformed::yes(logical::cast(text, DataType::Float64)))
}

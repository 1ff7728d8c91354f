//! One left row's pass over the right batches, its values written in as
//! literals.
//!
//! Joining a left row (a training loop's parameters) with a right batch (its
//! data) repeats each of the row's values over the batch, and the operators
//! above then read those copies: a scalar broadcast as an array, once per
//! batch and per column, and array-by-array arithmetic where a scalar would
//! do. A [`RowPass`] is the pass's operators, the aggregate's arguments and
//! its filters with the row's plain values substituted as literals (and
//! whatever is computed from them alone computed once): a right batch is
//! read as it is, with no copy, and `w * x` runs as scalar times array.
//! Nested values (tensors) stay columns, repeated as the join would, which
//! keeps every tensor function on the arrays it is written for.
//!
//! The values are the same as the join's: each expression is evaluated on
//! the same values, a literal standing for a column all of whose rows hold
//! it.

use std::sync::Arc;

use datafusion::arrow::array::{RecordBatch, RecordBatchOptions};
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::common::ScalarValue;
use datafusion::error::Result;
use datafusion::logical_expr::ColumnarValue;
use datafusion::physical_expr::expressions::{Column, Literal};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr_common::physical_expr::is_volatile;

use super::{batch_of, Pass, Step};

/// One left row's operators, arguments and filters (see the [module
/// docs](self)).
#[derive(Debug)]
pub(super) struct RowPass {
    /// The row's values still repeated over each right batch (nested ones).
    repeated: Vec<ScalarValue>,
    /// Their fields, then the right side's.
    schema: SchemaRef,
    pub(super) steps: Vec<Step>,
    pub(super) arguments: Vec<Vec<Arc<dyn PhysicalExpr>>>,
    pub(super) filters: Vec<Option<Arc<dyn PhysicalExpr>>>,
}

/// Where a column of the join or of an operator above it is in a left
/// row's pass.
#[derive(Debug, Clone)]
enum Slot {
    /// The same value on every row: a literal.
    Value(ScalarValue),
    /// A column of the batch the pass computes, at this index.
    Column(usize),
}

impl RowPass {
    /// `pass` for row `row` of the left side `left`; `None` when a filter
    /// of the pass drops every joined row of it.
    pub(super) fn new(pass: &Pass, left: &RecordBatch, row: usize) -> Result<Option<Self>> {
        let mut slots = vec![];
        let mut fields: Vec<Field> = vec![];
        let mut repeated = vec![];
        for (i, column) in left.columns().iter().enumerate() {
            let value = ScalarValue::try_from_array(column, row)?;
            if column.data_type().is_nested() {
                slots.push(Slot::Column(fields.len()));
                fields.push(pass.join_schema.field(i).clone());
                repeated.push(value);
            } else {
                slots.push(Slot::Value(value));
            }
        }
        for field in pass.join_schema.fields().iter().skip(left.num_columns()) {
            slots.push(Slot::Column(fields.len()));
            fields.push(field.as_ref().clone());
        }
        let mut steps = vec![];
        for step in &pass.steps {
            match step {
                Step::Project(exprs, schema) => {
                    let mut kept = vec![];
                    let mut kept_fields = vec![];
                    let mut next = vec![];
                    for (k, e) in exprs.iter().enumerate() {
                        let e = substitute(e, &slots)?;
                        match constant(&e) {
                            Some(v) => next.push(Slot::Value(v)),
                            None => {
                                next.push(Slot::Column(kept.len()));
                                kept.push(e);
                                kept_fields.push(schema.field(k).clone());
                            }
                        }
                    }
                    steps.push(Step::Project(kept, Arc::new(Schema::new(kept_fields))));
                    slots = next;
                }
                Step::Filter(predicate) => {
                    let predicate = substitute(predicate, &slots)?;
                    match constant(&predicate) {
                        Some(ScalarValue::Boolean(Some(true))) => {}
                        Some(_) => return Ok(None),
                        None => steps.push(Step::Filter(predicate)),
                    }
                }
            }
        }
        let arguments = pass
            .arguments
            .iter()
            .map(|a| a.iter().map(|e| substitute(e, &slots)).collect())
            .collect::<Result<_>>()?;
        let filters = pass
            .aggregate
            .filter_expr()
            .iter()
            .map(|f| f.as_ref().map(|f| substitute(f, &slots)).transpose())
            .collect::<Result<_>>()?;
        Ok(Some(Self {
            repeated,
            schema: Arc::new(Schema::new(fields)),
            steps,
            arguments,
            filters,
        }))
    }

    /// The batch the pass's first operator reads for `right`: the repeated
    /// left columns, then `right`'s own.
    pub(super) fn joined(&self, right: &RecordBatch) -> Result<RecordBatch> {
        let rows = right.num_rows();
        let mut columns = Vec::with_capacity(self.schema.fields().len());
        for value in &self.repeated {
            columns.push(value.to_array_of_size(rows)?);
        }
        columns.extend(right.columns().iter().cloned());
        batch_of(Arc::clone(&self.schema), columns, rows)
    }
}

/// `e` reading `slots`: literals for values, columns at their new index.
fn substitute(e: &Arc<dyn PhysicalExpr>, slots: &[Slot]) -> Result<Arc<dyn PhysicalExpr>> {
    Arc::clone(e)
        .transform(|node| {
            let Some(c) = node.downcast_ref::<Column>() else {
                return Ok(Transformed::no(node));
            };
            let replaced: Arc<dyn PhysicalExpr> = match &slots[c.index()] {
                Slot::Value(v) => Arc::new(Literal::new(v.clone())),
                Slot::Column(i) => Arc::new(Column::new(c.name(), *i)),
            };
            Ok(Transformed::yes(replaced))
        })
        .data()
}

/// The value of `e` where it reads no column and is not volatile (and its
/// evaluation succeeds: one that fails is left to fail, or not, on the rows
/// as before).
fn constant(e: &Arc<dyn PhysicalExpr>) -> Option<ScalarValue> {
    let reads_columns = e
        .exists(|n| Ok(n.downcast_ref::<Column>().is_some()))
        .expect("the visit does not fail");
    if reads_columns || is_volatile(e) {
        return None;
    }
    let one_row = RecordBatchOptions::new().with_row_count(Some(1));
    let batch =
        RecordBatch::try_new_with_options(Arc::new(Schema::empty()), vec![], &one_row).ok()?;
    match e.evaluate(&batch).ok()? {
        ColumnarValue::Scalar(v) => Some(v),
        ColumnarValue::Array(a) => ScalarValue::try_from_array(&a, 0).ok(),
    }
}

//! The Acero profile: Substrait plans that Apache Arrow's Acero (the engine
//! behind pyarrow's `pyarrow.substrait.run_query`, Arrow 26) runs with the
//! same results as DataFusion.
//!
//! Acero reads an older Substrait and departs from DataFusion in places, some
//! of them silently. The profile is a [`SubstraitProducer`] that wraps
//! `datafusion-substrait`'s default one and, with the DataFusion plan in view:
//!
//! - writes a scan's column selection as an emit (Acero rejects
//!   `ReadRel.projection`), and drops filters the table only applies
//!   inexactly (the plan filters again above the scan); a filter the table
//!   applies exactly is refused, since Acero would ignore it;
//! - writes aggregates as Acero wants them: phase `INITIAL_TO_RESULT`, an
//!   output type, `count(*)` without arguments, and arguments and grouping
//!   keys that are not plain columns computed by a projection below;
//! - writes `LIMIT`/`OFFSET` in the legacy integer fields (Acero returns no
//!   rows for the expression form);
//! - writes `CASE` in searched form with an explicit typed `ELSE NULL`,
//!   `coalesce(condition, false)` for conditions that may be NULL (Acero
//!   returns NULL instead of falling through), and one `WHEN` per `IfThen`
//!   (nested in the `ELSE`s: Acero 26 crashes on some plans with a
//!   multi-clause `IfThen`);
//! - renames `signum` to `sign`, `isnan` to `is_nan`, one-argument `log` to
//!   `log10`, and writes `round(x)` as `round(x, 0)` with ties rounded away
//!   from zero, as DataFusion does.
//!
//! Everything else outside a checked list is refused with an
//! [`ErrorKind::Unexportable`](crate::ErrorKind::Unexportable) error that
//! names it: joins, unions, windows, `DISTINCT`, `VALUES`, subqueries,
//! `%`, `IS [NOT] DISTINCT FROM`, `IS TRUE` and friends, `TRY_CAST`, casts
//! other than between numbers and booleans, `LIKE`, `IN` lists, aggregates
//! other than `sum`/`avg`/`count`/`min`/`max` (and any `FILTER`, `DISTINCT`
//! or `ORDER BY` in them), `GROUPING SETS`/`ROLLUP`/`CUBE`, `round` to other
//! than 0 digits, non-constant `LIMIT`, and functions Acero lacks (`cbrt`,
//! `trunc`, `degrees`, `radians`, `cot`, `pi`, `nanvl`, `greatest`, …).
//!
//! Known data-dependent differences that no plan shape can avoid: DataFusion
//! orders `NaN` above every number and equal to itself (`NaN > 0` is true),
//! Acero compares as IEEE 754 does (false), so `>`, `>=`, `=` and `<>` with a
//! `NaN` operand may differ, and `min`/`max` over a `NaN` (DataFusion's `max`
//! is `NaN`, Acero skips it); `sqrt` of a negative number is an error in
//! DataFusion and `NaN` in Acero.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> datafusion::error::Result<()> {
//! use datafusion_grad::substrait::{to_substrait, Profile};
//!
//! let ctx = datafusion_grad::session_context();
//! ctx.sql("CREATE TABLE t(x DOUBLE, y DOUBLE) AS VALUES (1.0, 2.0)").await?.collect().await?;
//! // runs in Acero: abs' is a CASE, written in searched form with ELSE NULL
//! to_substrait(&ctx, "SELECT grad(abs(x) * y, x) AS d FROM t", Profile::Acero).await?;
//! // Acero has no modulus
//! let err = to_substrait(&ctx, "SELECT grad(x % y, x) + x % y AS d FROM t", Profile::Acero).await;
//! assert!(err.unwrap_err().to_string().contains("[unexportable]"));
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field};
use datafusion::common::{internal_err, DFSchemaRef, ScalarValue};
use datafusion::error::Result;
use datafusion::execution::SessionState;
use datafusion::functions::core::expr_fn::coalesce;
use datafusion::logical_expr::expr::{
    self, Exists, InList, InSubquery, Lambda, LambdaVariable, Placeholder, SetComparison,
    WindowFunction,
};
use datafusion::logical_expr::{
    lit, Aggregate, BinaryExpr, Case, Cast, Expr, ExprSchemable, Like, Limit, LogicalPlan,
    Operator, Projection, Sort, Subquery, TableProviderFilterPushDown, TableScan, TryCast,
};
use datafusion_substrait::extensions::Extensions;
use datafusion_substrait::logical_plan::producer::{
    from_aggregate, from_binary_expr, from_case, from_cast, from_limit, from_literal, from_sort,
    from_table_scan, from_unary_expr, to_substrait_rel, DefaultSubstraitProducer,
    SubstraitProducer,
};
use datafusion_substrait::substrait::proto::expression::literal::LiteralType;
use datafusion_substrait::substrait::proto::expression::{Literal, RexType, ScalarFunction};
use datafusion_substrait::substrait::proto::fetch_rel::{CountMode, OffsetMode};
use datafusion_substrait::substrait::proto::function_argument::ArgType;
use datafusion_substrait::substrait::proto::rel::RelType;
use datafusion_substrait::substrait::proto::rel_common::{Emit, EmitKind};
use datafusion_substrait::substrait::proto::{
    plan_rel, AggregateFunction, AggregationPhase, Expression, FunctionArgument, FunctionOption,
    Plan, PlanRel, Rel, RelCommon, RelRoot, Type,
};
use datafusion_substrait::substrait::version;

use super::unexportable;
use crate::plan::unalias;
use crate::reserved;

/// DataFusion scalar functions that Acero knows by the same name and
/// computes the same way.
const SAME_NAME_FUNCTIONS: &[&str] = &[
    "abs", "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "ceil", "coalesce", "cos",
    "cosh", "exp", "floor", "ln", "log10", "log2", "power", "sin", "sinh", "sqrt", "tan", "tanh",
];

/// Aggregate functions that Acero computes the same way.
const AGGREGATES: &[&str] = &["sum", "avg", "count", "min", "max"];

/// The Substrait plan of the optimized `plan` in the Acero profile.
pub(super) fn to_acero_plan(plan: &LogicalPlan, state: &SessionState) -> Result<Box<Plan>> {
    let mut producer = AceroProducer {
        inner: DefaultSubstraitProducer::new(state),
    };
    let input = producer.handle_plan(plan)?;
    let mut names = Vec::with_capacity(plan.schema().fields().len());
    for field in plan.schema().fields() {
        flatten_names(field, false, &mut names);
    }
    let extensions = producer.get_extensions();
    Ok(Box::new(Plan {
        version: Some(version::version_with_producer("datafusion-grad")),
        extensions: extensions.into(),
        relations: vec![PlanRel {
            rel_type: Some(plan_rel::RelType::Root(RelRoot {
                input: Some(*input),
                names,
            })),
        }],
        ..Default::default()
    }))
}

/// Substrait's flat list of output names: each field, then the fields of
/// structs inside it, depth first.
fn flatten_names(field: &Field, skip_self: bool, names: &mut Vec<String>) {
    if !skip_self {
        names.push(field.name().clone());
    }
    match field.data_type() {
        DataType::Struct(fields) => {
            for f in fields {
                flatten_names(f, false, names);
            }
        }
        DataType::List(f) | DataType::LargeList(f) => flatten_names(f, true, names),
        _ => {}
    }
}

/// The refusal of `what`, which Acero cannot run faithfully.
fn refuse<T>(what: impl std::fmt::Display) -> Result<T> {
    Err(unexportable(format!(
        "{what} cannot be exported for Acero (Substrait profile `acero`)"
    )))
}

/// `datafusion-substrait`'s producer with Acero's fixes and refusals.
struct AceroProducer<'a> {
    inner: DefaultSubstraitProducer<'a>,
}

impl AceroProducer<'_> {
    /// The Substrait type of `data_type` (nullable), as the producer writes it.
    fn substrait_type(&mut self, data_type: &DataType) -> Result<Type> {
        let null = ScalarValue::try_from(data_type)?;
        match from_literal(self, &null)?.rex_type {
            Some(RexType::Literal(Literal {
                literal_type: Some(LiteralType::Null(t)),
                ..
            })) => Ok(t),
            _ => internal_err!("a NULL literal of {data_type} is not a typed null"),
        }
    }
}

/// `agg` with every grouping key and aggregate argument a plain column:
/// the others are computed by a projection inserted below it (Acero wants
/// direct references). `count`'s literal arguments stay (they are dropped
/// from the measure).
fn direct_reference_aggregate(agg: &Aggregate) -> Result<Aggregate> {
    let mut computed: Vec<Expr> = Vec::new();
    let mut reference = |e: &Expr| -> Expr {
        let i = match computed.iter().position(|c| c == e) {
            Some(i) => i,
            None => {
                computed.push(e.clone());
                computed.len() - 1
            }
        };
        reserved::Placeholder::Acero.column(i)
    };
    let mut groups = Vec::with_capacity(agg.group_expr.len());
    for g in &agg.group_expr {
        let inner = unalias(g);
        if matches!(inner, Expr::Column(_)) {
            groups.push(g.clone());
        } else {
            let (qualifier, name) = g.qualified_name();
            groups.push(reference(inner).alias_qualified(qualifier, name));
        }
    }
    let mut aggregates = Vec::with_capacity(agg.aggr_expr.len());
    for a in &agg.aggr_expr {
        let (qualifier, name) = a.qualified_name();
        let mut inner = unalias(a).clone();
        if let Expr::AggregateFunction(f) = &mut inner {
            let count = f.func.name() == "count";
            for arg in f.params.args.iter_mut() {
                let keep = matches!(arg, Expr::Column(_))
                    || (count && matches!(arg, Expr::Literal(v, _) if !v.is_null()));
                if !keep {
                    *arg = reference(arg);
                }
            }
        }
        aggregates.push(inner.alias_qualified(qualifier, name));
    }
    if computed.is_empty() {
        return Ok(agg.clone());
    }
    let mut exprs: Vec<Expr> = agg
        .input
        .schema()
        .columns()
        .into_iter()
        .map(Expr::Column)
        .collect();
    exprs.extend(
        computed
            .into_iter()
            .enumerate()
            .map(|(i, e)| e.alias(reserved::Placeholder::Acero.name(i))),
    );
    let projection = Projection::try_new(exprs, Arc::clone(&agg.input))?;
    Aggregate::try_new(
        Arc::new(LogicalPlan::Projection(projection)),
        groups,
        aggregates,
    )
}

/// Rewrites a `FetchRel` with literal `count_expr`/`offset_expr` into the
/// legacy integer fields that Acero reads.
#[allow(deprecated)]
fn legacy_fetch(rel: &mut Rel) -> Result<()> {
    let Some(RelType::Fetch(fetch)) = rel.rel_type.as_mut() else {
        return Ok(());
    };
    fetch.count_mode = match fetch.count_mode.take() {
        Some(CountMode::CountExpr(e)) => match literal_i64(&e) {
            Some(Some(n)) => Some(CountMode::Count(n)),
            Some(None) => None,
            None => return refuse("LIMIT with a non-constant count"),
        },
        other => other,
    };
    fetch.offset_mode = match fetch.offset_mode.take() {
        Some(OffsetMode::OffsetExpr(e)) => match literal_i64(&e) {
            Some(Some(n)) => Some(OffsetMode::Offset(n)),
            Some(None) => None,
            None => return refuse("OFFSET with a non-constant count"),
        },
        other => other,
    };
    if fetch.count_mode.is_none() {
        // All rows: Acero reads an unset count as 0 and refuses -1.
        fetch.count_mode = Some(CountMode::Count(i64::MAX));
    }
    Ok(())
}

/// The value of an integer literal expression (`Some(None)` for a NULL).
fn literal_i64(e: &Expression) -> Option<Option<i64>> {
    match &e.rex_type {
        Some(RexType::Literal(l)) => match &l.literal_type {
            Some(LiteralType::I64(n)) => Some(Some(*n)),
            Some(LiteralType::I32(n)) => Some(Some(i64::from(*n))),
            Some(LiteralType::Null(_)) => Some(None),
            _ => None,
        },
        _ => None,
    }
}

/// Whether Acero casts between these types as DataFusion does.
fn castable(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Boolean
            | DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::Float32
            | DataType::Float64
    )
}

/// Whether `e` is the integer literal 0.
fn is_zero(e: &Expr) -> bool {
    match unalias(e) {
        Expr::Literal(v, _) => matches!(
            v,
            ScalarValue::Int8(Some(0))
                | ScalarValue::Int16(Some(0))
                | ScalarValue::Int32(Some(0))
                | ScalarValue::Int64(Some(0))
        ),
        _ => false,
    }
}

/// The name of aggregate `f` if Acero computes it as DataFusion does (no
/// `DISTINCT`, `FILTER` or `ORDER BY`); a refusal otherwise.
fn check_aggregate(f: &expr::AggregateFunction) -> Result<&'static str> {
    let name = f.func.name();
    let params = &f.params;
    if params.distinct {
        return refuse(format!("the aggregate {name}(DISTINCT …)"));
    }
    if params.filter.is_some() {
        return refuse(format!("the aggregate {name}(…) FILTER (WHERE …)"));
    }
    if !params.order_by.is_empty() {
        return refuse(format!("the ordered aggregate {name}(… ORDER BY …)"));
    }
    match AGGREGATES.iter().find(|a| **a == name) {
        Some(a) => Ok(a),
        None => refuse(format!("the aggregate function `{name}`")),
    }
}

/// An aggregate call as Acero wants it: phase `INITIAL_TO_RESULT`, an
/// output type, `count()` for `count(*)`, and only column arguments.
fn acero_measure(f: &mut AggregateFunction, name: &str, output_type: Type) -> Result<()> {
    f.phase = AggregationPhase::InitialToResult as i32;
    f.output_type = Some(output_type);
    let literal = |a: &FunctionArgument| {
        matches!(&a.arg_type, Some(ArgType::Value(Expression { rex_type: Some(RexType::Literal(l)) }))
            if !matches!(l.literal_type, Some(LiteralType::Null(_))))
    };
    if name == "count" && f.arguments.iter().all(literal) {
        // count(*) is count(1) in DataFusion; Acero wants count().
        f.arguments.clear();
    }
    let direct = |a: &FunctionArgument| {
        matches!(
            &a.arg_type,
            Some(ArgType::Value(Expression {
                rex_type: Some(RexType::Selection(_))
            }))
        )
    };
    if !f.arguments.iter().all(direct) {
        return refuse(format!("the aggregate {name} of a constant"));
    }
    Ok(())
}

impl SubstraitProducer for AceroProducer<'_> {
    fn register_function(&mut self, signature: String) -> u32 {
        self.inner.register_function(signature)
    }

    fn register_type(&mut self, name: String) -> u32 {
        self.inner.register_type(name)
    }

    fn get_extensions(self) -> Extensions {
        self.inner.get_extensions()
    }

    fn handle_plan(&mut self, plan: &LogicalPlan) -> Result<Box<Rel>> {
        match plan {
            LogicalPlan::Projection(_)
            | LogicalPlan::Filter(_)
            | LogicalPlan::Aggregate(_)
            | LogicalPlan::Sort(_)
            | LogicalPlan::Limit(_)
            | LogicalPlan::TableScan(_)
            | LogicalPlan::SubqueryAlias(_) => to_substrait_rel(self, plan),
            LogicalPlan::Window(_) => refuse("a window function (OVER …)"),
            LogicalPlan::Join(_) => refuse("a join"),
            LogicalPlan::Union(_) => refuse("UNION"),
            LogicalPlan::Distinct(_) => refuse("SELECT DISTINCT"),
            LogicalPlan::Values(_) => refuse("VALUES (a Substrait virtual table)"),
            LogicalPlan::EmptyRelation(_) => {
                refuse("a query without FROM (a Substrait virtual table)")
            }
            LogicalPlan::Subquery(_) => refuse("a subquery"),
            other => refuse(format!("the plan node {}", other.display())),
        }
    }

    fn handle_table_scan(&mut self, scan: &TableScan) -> Result<Box<Rel>> {
        let mut scan = scan.clone();
        if !scan.filters.is_empty() {
            let filters: Vec<&Expr> = scan.filters.iter().collect();
            let support = scan.source.supports_filters_pushdown(&filters)?;
            for (filter, support) in filters.iter().zip(support) {
                if support != TableProviderFilterPushDown::Inexact {
                    return refuse(format!(
                        "the filter `{filter}` applied by table `{}` itself (Acero ignores \
                         filters in a ReadRel)",
                        scan.table_name
                    ));
                }
            }
            // Inexact filters are applied again by the Filter above the scan.
            scan.filters.clear();
        }
        let mut rel = from_table_scan(self, &scan)?;
        if let Some(RelType::Read(read)) = rel.rel_type.as_mut() {
            if let Some(mask) = read.projection.take() {
                let output_mapping = mask
                    .select
                    .map(|s| s.struct_items.iter().map(|i| i.field).collect())
                    .unwrap_or_default();
                read.common = Some(RelCommon {
                    emit_kind: Some(EmitKind::Emit(Emit { output_mapping })),
                    ..Default::default()
                });
            }
        }
        Ok(rel)
    }

    fn handle_aggregate(&mut self, agg: &Aggregate) -> Result<Box<Rel>> {
        if agg
            .group_expr
            .iter()
            .any(|e| matches!(e, Expr::GroupingSet(_)))
        {
            return refuse("GROUPING SETS, ROLLUP or CUBE");
        }
        let agg = direct_reference_aggregate(agg)?;
        let mut names = Vec::with_capacity(agg.aggr_expr.len());
        for e in &agg.aggr_expr {
            match unalias(e) {
                Expr::AggregateFunction(f) => names.push(check_aggregate(f)?),
                other => return refuse(format!("the aggregate expression `{other}`")),
            }
        }
        let mut types = Vec::with_capacity(names.len());
        for field in &agg.schema.fields()[agg.group_expr.len()..] {
            types.push(self.substrait_type(field.data_type())?);
        }
        let mut rel = from_aggregate(self, &agg)?;
        let Some(RelType::Aggregate(aggregate)) = rel.rel_type.as_mut() else {
            return internal_err!("an Aggregate was not produced as an AggregateRel");
        };
        for ((measure, output_type), name) in aggregate.measures.iter_mut().zip(types).zip(names) {
            if let Some(f) = measure.measure.as_mut() {
                acero_measure(f, name, output_type)?;
            }
        }
        Ok(rel)
    }

    fn handle_limit(&mut self, limit: &Limit) -> Result<Box<Rel>> {
        let mut rel = from_limit(self, limit)?;
        legacy_fetch(&mut rel)?;
        Ok(rel)
    }

    fn handle_sort(&mut self, sort: &Sort) -> Result<Box<Rel>> {
        let mut rel = from_sort(self, sort)?;
        legacy_fetch(&mut rel)?;
        Ok(rel)
    }

    fn handle_case(&mut self, case: &Case, schema: &DFSchemaRef) -> Result<Expression> {
        let data_type = Expr::Case(case.clone()).get_type(schema.as_ref())?;
        let mut when_then_expr = Vec::with_capacity(case.when_then_expr.len());
        for (when, then) in &case.when_then_expr {
            let condition = match &case.expr {
                Some(operand) => {
                    Expr::BinaryExpr(BinaryExpr::new(operand.clone(), Operator::Eq, when.clone()))
                }
                None => (**when).clone(),
            };
            // SQL skips a branch whose condition is NULL; Acero returns NULL.
            let condition = if condition.nullable(schema.as_ref())? {
                coalesce(vec![condition, lit(false)])
            } else {
                condition
            };
            when_then_expr.push((Box::new(condition), then.clone()));
        }
        let else_expr = match &case.else_expr {
            Some(e) => e.clone(),
            None => Box::new(Expr::Literal(ScalarValue::try_from(&data_type)?, None)),
        };
        // One clause per IfThen: Acero 26 crashes (SIGSEGV) when the result
        // of a CASE with several clauses is projected as a column and used by
        // a function in a later projection; nested single clauses are safe.
        let nested =
            when_then_expr
                .into_iter()
                .rev()
                .fold(*else_expr, |otherwise, (when, then)| {
                    Expr::Case(Case {
                        expr: None,
                        when_then_expr: vec![(when, then)],
                        else_expr: Some(Box::new(otherwise)),
                    })
                });
        match nested {
            Expr::Case(searched) => from_case(self, &searched, schema),
            other => self.handle_expr(&other, schema),
        }
    }

    fn handle_scalar_function(
        &mut self,
        fun: &expr::ScalarFunction,
        schema: &DFSchemaRef,
    ) -> Result<Expression> {
        let name = fun.name();
        let mut args = fun.args.clone();
        let mut options = Vec::new();
        let acero_name = match (name, args.len()) {
            ("signum", 1) => "sign",
            ("isnan", 1) => "is_nan",
            ("log", 1) => "log10",
            ("log", 2) => {
                // DataFusion's log(base, x) is Substrait's logb(x, base).
                args.swap(0, 1);
                "logb"
            }
            ("round", 1 | 2) => {
                if args.len() == 2 && !is_zero(&args[1]) {
                    return refuse("round to a number of digits other than 0");
                }
                args.truncate(1);
                args.push(lit(0i32));
                // DataFusion rounds half away from zero; Acero to even by default.
                options.push(FunctionOption {
                    name: "rounding".to_string(),
                    preference: vec!["TIE_AWAY_FROM_ZERO".to_string()],
                });
                "round"
            }
            (name, _) if SAME_NAME_FUNCTIONS.contains(&name) => name,
            (name, _) => return refuse(format!("the function `{name}`")),
        };
        let arguments = args
            .iter()
            .map(|a| {
                Ok(FunctionArgument {
                    arg_type: Some(ArgType::Value(self.handle_expr(a, schema)?)),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let (_, field) = Expr::ScalarFunction(fun.clone()).to_field(schema)?;
        let output_type = self.substrait_type(field.data_type())?;
        let function_reference = self.register_function(acero_name.to_string());
        #[allow(deprecated)]
        Ok(Expression {
            rex_type: Some(RexType::ScalarFunction(ScalarFunction {
                function_reference,
                arguments,
                options,
                output_type: Some(output_type),
                args: vec![],
            })),
        })
    }

    fn handle_binary_expr(&mut self, e: &BinaryExpr, schema: &DFSchemaRef) -> Result<Expression> {
        use Operator::*;
        match e.op {
            Plus | Minus | Multiply | Divide | Eq | NotEq | Lt | LtEq | Gt | GtEq | And | Or => {
                from_binary_expr(self, e, schema)
            }
            Modulo => refuse("the operator `%` (modulo)"),
            op => refuse(format!("the operator `{op}`")),
        }
    }

    fn handle_unary_expr(&mut self, e: &Expr, schema: &DFSchemaRef) -> Result<Expression> {
        match e {
            Expr::Not(_) | Expr::IsNull(_) | Expr::IsNotNull(_) | Expr::Negative(_) => {
                from_unary_expr(self, e, schema)
            }
            Expr::IsTrue(_) => refuse("IS TRUE"),
            Expr::IsFalse(_) => refuse("IS FALSE"),
            Expr::IsUnknown(_) => refuse("IS UNKNOWN"),
            Expr::IsNotTrue(_) => refuse("IS NOT TRUE"),
            Expr::IsNotFalse(_) => refuse("IS NOT FALSE"),
            Expr::IsNotUnknown(_) => refuse("IS NOT UNKNOWN"),
            other => refuse(format!("the expression `{other}`")),
        }
    }

    fn handle_cast(&mut self, cast: &Cast, schema: &DFSchemaRef) -> Result<Expression> {
        let from = cast.expr.get_type(schema.as_ref())?;
        let to = cast.field.data_type();
        if &from != to && !(castable(&from) && castable(to)) {
            return refuse(format!("CAST from {from} to {to}"));
        }
        from_cast(self, cast, schema)
    }

    fn handle_try_cast(&mut self, _cast: &TryCast, _schema: &DFSchemaRef) -> Result<Expression> {
        refuse("TRY_CAST")
    }

    fn handle_literal(&mut self, value: &ScalarValue) -> Result<Expression> {
        if !castable(&value.data_type()) {
            return refuse(format!("a literal of type {}", value.data_type()));
        }
        from_literal(self, value)
    }

    fn handle_like(&mut self, _like: &Like, _schema: &DFSchemaRef) -> Result<Expression> {
        refuse("LIKE")
    }

    fn handle_in_list(&mut self, _in_list: &InList, _schema: &DFSchemaRef) -> Result<Expression> {
        refuse("IN (list)")
    }

    fn handle_window_function(
        &mut self,
        _window_fn: &WindowFunction,
        _schema: &DFSchemaRef,
    ) -> Result<Expression> {
        refuse("a window function (OVER …)")
    }

    fn handle_in_subquery(
        &mut self,
        _in_subquery: &InSubquery,
        _schema: &DFSchemaRef,
    ) -> Result<Expression> {
        refuse("IN (subquery)")
    }

    fn handle_set_comparison(
        &mut self,
        _set_comparison: &SetComparison,
        _schema: &DFSchemaRef,
    ) -> Result<Expression> {
        refuse("a comparison with ANY/ALL (subquery)")
    }

    fn handle_scalar_subquery(
        &mut self,
        _subquery: &Subquery,
        _schema: &DFSchemaRef,
    ) -> Result<Expression> {
        refuse("a scalar subquery")
    }

    fn handle_exists(&mut self, _exists: &Exists, _schema: &DFSchemaRef) -> Result<Expression> {
        refuse("EXISTS (subquery)")
    }

    fn handle_placeholder(
        &mut self,
        placeholder: &Placeholder,
        _schema: &DFSchemaRef,
    ) -> Result<Expression> {
        refuse(format!("the parameter {}", placeholder.id))
    }

    fn handle_higher_order_function(
        &mut self,
        fun: &expr::HigherOrderFunction,
        _schema: &DFSchemaRef,
    ) -> Result<Expression> {
        refuse(format!("the higher-order function `{}`", fun.name()))
    }

    fn handle_lambda(&mut self, _lambda: &Lambda, _schema: &DFSchemaRef) -> Result<Expression> {
        refuse("a lambda")
    }

    fn handle_lambda_variable(
        &mut self,
        _variable: &LambdaVariable,
        _schema: &DFSchemaRef,
    ) -> Result<Expression> {
        refuse("a lambda variable")
    }
}

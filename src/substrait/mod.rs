//! Substrait: differentiated plans exported as [Substrait](https://substrait.io)
//! plans for other engines, and Substrait plans that call `grad`, `jvp` or
//! `vjp` imported and differentiated here.
//!
//! - [`to_substrait`]: plans one SQL query, lets the analyzer rule replace
//!   every marker by its derivative, optimizes, and produces a Substrait
//!   [`Plan`] for a [`Profile`]: [`Profile::DataFusion`] (what
//!   `datafusion-substrait` produces; read back by DataFusion) or
//!   [`Profile::Acero`] (rewritten so that Apache Arrow's Acero, as shipped by
//!   pyarrow, runs it with the same numbers — see [`acero`]).
//! - [`logical_to_substrait`]: the same for a [`LogicalPlan`] (e.g. one made
//!   with the DataFrame API or imported with [`from_substrait`]).
//! - [`from_substrait`]: a [`DataFrame`] for a Substrait plan; markers are
//!   resolved by name, so a producer elsewhere can ask for derivatives.
//! - [`plan_to_bytes`], [`plan_to_json`], [`plan_from_bytes_or_json`]: the
//!   protobuf and JSON encodings.
//!
//! What Substrait cannot carry — recursive CTEs, DML, DDL (`CREATE TABLE AS`,
//! views), `EXPLAIN`, prepared statements, `COPY` — is refused before the
//! producer runs, and any producer failure is reported, with the producer's
//! message, as an [`ErrorKind::Unexportable`] error.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> datafusion::error::Result<()> {
//! use datafusion_grad::substrait::{from_substrait, to_substrait, Profile};
//!
//! let ctx = datafusion_grad::session_context();
//! ctx.sql("CREATE TABLE t(x DOUBLE) AS VALUES (1.0), (2.0)").await?.collect().await?;
//! let plan = to_substrait(&ctx, "SELECT grad(x * x, x) AS d FROM t", Profile::DataFusion).await?;
//! let batches = from_substrait(&ctx, &plan).await?.collect().await?;
//! assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 2);
//! # Ok(())
//! # }
//! ```

pub mod acero;

use std::fmt;
use std::str::FromStr;

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::dataframe::DataFrame;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SessionState;
use datafusion::logical_expr::{DdlStatement, Expr, LogicalPlan};
use datafusion::prelude::SessionContext;
use datafusion::sql::parser::DFParser;
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion_substrait::logical_plan::consumer::from_substrait_plan;
use datafusion_substrait::logical_plan::producer::to_substrait_plan;
use prost::Message;

pub use datafusion_substrait::substrait::proto::Plan;

use crate::engine::call::MarkerKind;
use crate::error::{ErrorKind, GradError};

/// The name written into the plan's `version.producer`.
const PRODUCER: &str = "datafusion-grad";

/// Which consumer an exported plan is shaped for.
///
/// ```
/// use datafusion_grad::substrait::Profile;
///
/// assert_eq!("acero".parse::<Profile>().unwrap(), Profile::Acero);
/// assert_eq!(Profile::DataFusion.name(), "datafusion");
/// assert!("duckdb".parse::<Profile>().unwrap_err().to_string().contains("[unexportable]"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Profile {
    /// The plan as `datafusion-substrait` produces it: every plan shape and
    /// function DataFusion's consumer reads back.
    #[default]
    DataFusion,
    /// A plan Apache Arrow's Acero (pyarrow's `pyarrow.substrait.run_query`)
    /// runs with the same results as DataFusion; what it cannot run, or would
    /// run with other numbers, is refused ([`acero`]).
    Acero,
}

impl Profile {
    /// Every profile, in a stable order.
    pub const ALL: [Profile; 2] = [Profile::DataFusion, Profile::Acero];

    /// The profile's name as accepted by [`FromStr`], e.g. `"acero"`.
    ///
    /// ```
    /// assert_eq!(datafusion_grad::substrait::Profile::Acero.name(), "acero");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Profile::DataFusion => "datafusion",
            Profile::Acero => "acero",
        }
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Profile {
    type Err = GradError;

    fn from_str(s: &str) -> Result<Self, GradError> {
        let lower = s.to_ascii_lowercase();
        Profile::ALL
            .into_iter()
            .find(|p| p.name() == lower)
            .ok_or_else(|| {
                let names: Vec<&str> = Profile::ALL.iter().map(|p| p.name()).collect();
                GradError::new(
                    ErrorKind::Unexportable,
                    format!(
                        "unknown Substrait profile `{s}`; use one of {}",
                        names.join(", ")
                    ),
                )
            })
    }
}

/// The differentiated plan of the single SQL query `sql` (tables, views and
/// functions are those of `ctx`) as a Substrait plan for `profile`.
///
/// The query is planned, analyzed (every `grad`/`jvp`/`vjp` is replaced by
/// its derivative) and optimized with `ctx`'s state, then produced. Fails
/// with an [`ErrorKind::Unexportable`] error for SQL that is not exactly one
/// statement, for what Substrait cannot carry (see the [module
/// docs](self)), and for what `profile` cannot run; differentiation errors
/// keep their own kind.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> datafusion::error::Result<()> {
/// use datafusion_grad::substrait::{plan_to_json, to_substrait, Profile};
///
/// let ctx = datafusion_grad::session_context();
/// ctx.sql("CREATE TABLE t(x DOUBLE, y DOUBLE) AS VALUES (1.0, 2.0)").await?.collect().await?;
/// let plan = to_substrait(&ctx, "SELECT grad(sin(x) * y, x) FROM t", Profile::Acero).await?;
/// let json = plan_to_json(&plan)?;
/// assert!(json.contains("\"cos\"") && !json.contains("\"grad\""));
///
/// let err = to_substrait(&ctx, "INSERT INTO t VALUES (1.0, 1.0)", Profile::DataFusion).await;
/// assert!(err.unwrap_err().to_string().contains("[unexportable]"));
/// # Ok(())
/// # }
/// ```
pub async fn to_substrait(ctx: &SessionContext, sql: &str, profile: Profile) -> Result<Box<Plan>> {
    let mut statements = DFParser::parse_sql_with_dialect(sql, &GenericDialect {})?;
    if statements.len() != 1 {
        return Err(unexportable(format!(
            "a Substrait plan holds exactly one query, got {} statements",
            statements.len()
        )));
    }
    let state = ctx.state();
    let statement = statements.pop_front().expect("one statement");
    let plan = state.statement_to_plan(statement).await?;
    logical_to_substrait(&state, &plan, profile).await
}

/// The Substrait plan of `plan` for `profile`, after `state`'s analyzer
/// (which differentiates) and optimizer have run; see [`to_substrait`].
///
/// `plan` may be unoptimized (from [`SessionState::create_logical_plan`],
/// the DataFrame API or [`from_substrait`]) or already optimized.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> datafusion::error::Result<()> {
/// use datafusion_grad::substrait::{logical_to_substrait, Profile};
///
/// let ctx = datafusion_grad::session_context();
/// ctx.sql("CREATE TABLE t(x DOUBLE) AS VALUES (1.0)").await?.collect().await?;
/// let df = ctx.sql("SELECT grad(exp(x), x) AS d FROM t").await?;
/// let plan = logical_to_substrait(&ctx.state(), df.logical_plan(), Profile::DataFusion).await?;
/// assert_eq!(plan.relations.len(), 1);
/// # Ok(())
/// # }
/// ```
pub async fn logical_to_substrait(
    state: &SessionState,
    plan: &LogicalPlan,
    profile: Profile,
) -> Result<Box<Plan>> {
    refuse_unexportable_nodes(plan, "exported as")?;
    let optimized = state.optimize(plan)?;
    refuse_unexportable_nodes(&optimized, "exported as")?;
    refuse_surviving_markers(&optimized)?;
    let produced = match profile {
        Profile::DataFusion => to_substrait_plan(&optimized, state),
        Profile::Acero => acero::to_acero_plan(&optimized, state),
    };
    let mut plan = produced.map_err(|e| producer_error(e, profile))?;
    normalize(&mut plan);
    Ok(plan)
}

/// A [`DataFrame`] that runs the Substrait `plan` in `ctx` (whose tables the
/// plan's named tables resolve to).
///
/// Functions resolve by name among `ctx`'s functions, so `grad`, `jvp` and
/// `vjp` calls in the plan (as another producer, or DataFusion's own on an
/// unoptimized plan, writes them) are the markers: the plan is analyzed on
/// import, which differentiates them, and a derivative that cannot be taken
/// fails here with its typed error. What DataFusion's consumer cannot read
/// is an [`ErrorKind::Unexportable`] error with the consumer's message.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> datafusion::error::Result<()> {
/// use datafusion_grad::substrait::{from_substrait, logical_to_substrait, to_substrait, Profile};
///
/// let ctx = datafusion_grad::session_context();
/// ctx.sql("CREATE TABLE t(x DOUBLE) AS VALUES (3.0)").await?.collect().await?;
/// let plan = to_substrait(&ctx, "SELECT grad(x * x, x) AS d FROM t", Profile::DataFusion).await?;
/// let df = from_substrait(&ctx, &plan).await?;
/// // and back out again, e.g. for Acero
/// let again = logical_to_substrait(&ctx.state(), df.logical_plan(), Profile::Acero).await?;
/// assert_eq!(again.relations.len(), 1);
/// # Ok(())
/// # }
/// ```
pub async fn from_substrait(ctx: &SessionContext, plan: &Plan) -> Result<DataFrame> {
    let state = ctx.state();
    let logical = from_substrait_plan(&state, plan)
        .await
        .map_err(|e| wrap(e, "cannot import the Substrait plan"))?;
    refuse_unexportable_nodes(&logical, "run from")?;
    let analyzed =
        state
            .analyzer()
            .execute_and_check(logical, state.config_options(), |_, _| {})?;
    Ok(DataFrame::new(state, analyzed))
}

/// `plan` as Substrait's canonical JSON (protobuf JSON mapping, lowerCamelCase
/// field names), pretty-printed.
///
/// ```
/// use datafusion_grad::substrait::{plan_from_bytes_or_json, plan_to_json, Plan};
///
/// let json = plan_to_json(&Plan::default()).unwrap();
/// assert!(json.starts_with('{'));
/// ```
pub fn plan_to_json(plan: &Plan) -> Result<String> {
    serde_json::to_string_pretty(plan)
        .map_err(|e| unexportable(format!("cannot write the Substrait plan as JSON: {e}")))
}

/// `plan` as protobuf bytes (the binary Substrait encoding engines read).
///
/// ```
/// use datafusion_grad::substrait::{plan_to_bytes, Plan};
///
/// assert!(plan_to_bytes(&Plan::default()).is_empty());
/// ```
pub fn plan_to_bytes(plan: &Plan) -> Vec<u8> {
    plan.encode_to_vec()
}

/// A Substrait plan read from protobuf bytes or from its JSON text (told
/// apart by a leading `{`).
///
/// Anything else, and a plan without exactly one relation tree, is an
/// [`ErrorKind::Unexportable`] error.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> datafusion::error::Result<()> {
/// use datafusion_grad::substrait::*;
///
/// let ctx = datafusion_grad::session_context();
/// ctx.sql("CREATE TABLE t(x DOUBLE) AS VALUES (1.0)").await?.collect().await?;
/// let plan = to_substrait(&ctx, "SELECT grad(x * x, x) FROM t", Profile::DataFusion).await?;
/// assert_eq!(plan_from_bytes_or_json(&plan_to_bytes(&plan))?, *plan);
/// assert_eq!(plan_from_bytes_or_json(plan_to_json(&plan)?.as_bytes())?, *plan);
/// assert!(plan_from_bytes_or_json(b"SELECT 1").is_err());
/// # Ok(())
/// # }
/// ```
pub fn plan_from_bytes_or_json(data: &[u8]) -> Result<Plan> {
    let first = data.iter().find(|b| !b.is_ascii_whitespace());
    let plan: Plan = if first == Some(&b'{') {
        let text = std::str::from_utf8(data)
            .map_err(|e| unexportable(format!("the Substrait JSON plan is not UTF-8: {e}")))?;
        serde_json::from_str(text)
            .map_err(|e| unexportable(format!("not a Substrait JSON plan: {e}")))?
    } else {
        Plan::decode(data)
            .map_err(|e| unexportable(format!("not a Substrait protobuf plan: {e}")))?
    };
    if plan.relations.len() != 1 {
        return Err(unexportable(format!(
            "not a Substrait plan with one relation tree ({} relations)",
            plan.relations.len()
        )));
    }
    Ok(plan)
}

/// Refuses plan nodes that Substrait (or DataFusion's producer) cannot carry,
/// anywhere in `plan`, subqueries included; `verb` says what was tried
/// ("exported as", "run from").
fn refuse_unexportable_nodes(plan: &LogicalPlan, verb: &str) -> Result<()> {
    let mut found = None;
    plan.apply_with_subqueries(|node| {
        found = unexportable_node(node);
        Ok(match found {
            Some(_) => TreeNodeRecursion::Stop,
            None => TreeNodeRecursion::Continue,
        })
    })?;
    match found {
        Some(what) => Err(unexportable(format!(
            "{what} cannot be {verb} a Substrait plan"
        ))),
        None => Ok(()),
    }
}

/// What `node` is, if Substrait export refuses it.
fn unexportable_node(node: &LogicalPlan) -> Option<String> {
    Some(match node {
        LogicalPlan::RecursiveQuery(_) => "a recursive CTE (WITH RECURSIVE)".to_string(),
        LogicalPlan::Dml(dml) => format!("DML ({} into/of table `{}`)", dml.op, dml.table_name),
        LogicalPlan::Ddl(ddl) => match ddl {
            DdlStatement::CreateMemoryTable(c) if c.input.schema().fields().is_empty() => {
                format!("DDL (CREATE TABLE `{}`)", c.name)
            }
            DdlStatement::CreateMemoryTable(c) => {
                format!("DDL (CREATE TABLE `{}` AS SELECT)", c.name)
            }
            DdlStatement::CreateView(v) => format!("DDL (CREATE VIEW `{}`)", v.name),
            other => format!("DDL ({})", other.name()),
        },
        LogicalPlan::Explain(_) => "EXPLAIN".to_string(),
        LogicalPlan::Analyze(_) => "EXPLAIN ANALYZE".to_string(),
        LogicalPlan::Statement(s) => format!("the statement {}", s.name()),
        LogicalPlan::Copy(_) => "COPY".to_string(),
        LogicalPlan::DescribeTable(_) => "DESCRIBE".to_string(),
        LogicalPlan::Unnest(_) => "UNNEST".to_string(),
        // datafusion-grad's own operators (a gradient table's group join
        // of relational reverse mode, loops, shared subplans): no Substrait
        // relation carries them.
        LogicalPlan::Extension(e) => format!(
            "datafusion-grad's plan node `{}` (a gradient with respect to a table's rows, a \
             loop or a shared subplan)",
            e.node.name()
        ),
        _ => return None,
    })
}

/// Refuses an optimized plan in which a `grad`/`jvp`/`vjp` call was not
/// rewritten (e.g. a context without the analyzer rule and with
/// simplification turned off): no other engine could evaluate it.
fn refuse_surviving_markers(plan: &LogicalPlan) -> Result<()> {
    let mut found = None;
    plan.apply_with_subqueries(|node| {
        node.apply_expressions(|e| {
            e.apply(|e| {
                if let Expr::ScalarFunction(f) = e {
                    if MarkerKind::is_marker_name(f.name()) {
                        found = Some(f.name().to_string());
                        return Ok(TreeNodeRecursion::Stop);
                    }
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })
    })?;
    match found {
        Some(name) => Err(unexportable(format!(
            "`{name}` was not replaced by its derivative while planning (is the \
             datafusion-grad analyzer rule registered?); no Substrait consumer can run it"
        ))),
        None => Ok(()),
    }
}

/// Deterministic output: extension declarations sorted by anchor (the
/// producer lists them in hash-map order) and our producer name.
fn normalize(plan: &mut Plan) {
    use datafusion_substrait::substrait::proto::extensions::simple_extension_declaration::MappingType;
    plan.extensions.sort_by_key(|d| match &d.mapping_type {
        Some(MappingType::ExtensionFunction(f)) => (0, f.function_anchor),
        Some(MappingType::ExtensionType(t)) => (1, t.type_anchor),
        Some(MappingType::ExtensionTypeVariation(v)) => (2, v.type_variation_anchor),
        None => (3, 0),
    });
    if let Some(version) = plan.version.as_mut() {
        version.producer = PRODUCER.to_string();
    }
}

/// A producer failure as an [`ErrorKind::Unexportable`] error (typed errors,
/// such as the Acero profile's refusals, pass through).
fn producer_error(err: DataFusionError, profile: Profile) -> DataFusionError {
    wrap(
        err,
        &format!("the Substrait producer ({profile} profile) failed"),
    )
}

/// `err` as an [`ErrorKind::Unexportable`] error with `context`, unless it
/// already is a [`GradError`].
fn wrap(err: DataFusionError, context: &str) -> DataFusionError {
    if GradError::find(&err).is_some() {
        return err;
    }
    unexportable(format!("{context}: {}", err.strip_backtrace()))
}

/// An [`ErrorKind::Unexportable`] error.
pub(crate) fn unexportable(message: impl Into<String>) -> DataFusionError {
    GradError::new(ErrorKind::Unexportable, message).into()
}

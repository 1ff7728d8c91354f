//! Every name datafusion-grad reserves in the plans and expressions it
//! writes: built here and recognised here, nowhere else.
//!
//! All start with `__dfgrad` (DataFusion's own `__common_expr_{n}` columns
//! are recognised here too, as the bindings treat them alike):
//!
//! | name | what it stands for |
//! |---|---|
//! | `__dfgrad_arg{i}` | argument `i` of a derivative rule's template ([`crate::rules`]) |
//! | `__dfgrad_node{k}` | a nested marker's derivative while its outer marker is interned |
//! | `__dfgrad_root{k}` | a marker's derivative while the analyzer binds shared parts |
//! | `__dfgrad_aggregate{k}` | an aggregate output inlined into a marker's `f` |
//! | `__dfgrad_subquery{k}` | a scalar subquery's derivative, joined in |
//! | `__dfgrad_agg{k}`, `__dfgrad_window{k}` | aggregates and windows the rewrite through aggregates adds |
//! | `__dfgrad_outer{k}` | qualifier of a localized outer reference or parameter |
//! | `__dfgrad{m}_{node}` | a shared part bound by a projection (`m` keeps it unique in its schema) |
//! | `__dfgrad_input` | alias of an unqualified input in exported SQL |
//! | `__dfgrad_acero_{i}` | a pre-projected aggregate argument in Acero's Substrait |
//! | `__dfgrad_stat{k}` | a group statistic an aggregate's transpose rule reads ([`crate::rules::transpose`]) |
//! | `__dfgrad_where{k}` | a derivative with respect to a table's rows in a `WHERE` clause, computed by a projection below it |
//! | `__dfgrad_loss{k}` | a loss subquery's value, bound below a marker (relational reverse mode) |
//! | `__dfgrad_leaf{k}` | qualifier of an input of a relational block in the backward pass ([`crate::plan::reverse`]) |
//! | `__dfgrad_c{i}`, `__dfgrad_present` | column `i` of such an input, and its marker of a row that is there (not padded by an outer join) |
//! | `__dfgrad_adj{i}`, `__dfgrad_term{i}`, `__dfgrad_d{k}`, `__dfgrad_key{j}` | adjoints (of an output, of a term), partial derivatives and group or row keys of the backward pass |
//! | `__dfgrad_on{k}`, `__dfgrad_summed{k}` | the join keys and sums of a partial's factor summed over a join's other side (a contraction in the backward pass) |
//! | `__dfgrad_seed`, `__dfgrad_stats` | qualifiers of a group's adjoints and of its statistics while they are joined |
//! | `__dfgrad_gradient`, `__dfgrad_table{k}` | a gradient table's derivative column, and the table's qualifier where it is joined |
//! | `__dfgrad_updated` | whether a row of an `UPDATE` overwriting its table was updated ([`crate::plan::overwrite`]) |
//! | `__dfgrad_duplicate_rows`, `__dfgrad_loss_rows` | the checks that a parameter relation's rows are told apart, and that a loss query returns one row |
//! | `__dfgrad_value{c}_{cte}` | a recursive CTE's column `c` passed on under a name of its own to a derivative through its iterations |
//! | `__dfgrad_tangent{j}_{c}` | the tangent of a recursive CTE's column `c` with respect to variable `j`, carried through its iterations ([`crate::plan::analyzer`]) |
//! | `__dfgrad_r{k}`, `c{i}` | an operator's CTE in exported SQL printed as a chain, and its column `i` (read only qualified, by the chain's own aliases `q`, `l`, `r`) |

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchema, TableReference};
use datafusion::error::Result;
use datafusion::logical_expr::Expr;

/// A family of placeholder columns `{prefix}{k}`, unqualified: each stands
/// for item `k` of a list while an expression is rewritten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placeholder {
    /// A rule template's argument (`__dfgrad_arg{i}`).
    Arg,
    /// A nested marker's derivative (`__dfgrad_node{k}`).
    Node,
    /// A marker's derivative in the analyzer (`__dfgrad_root{k}`).
    Root,
    /// An aggregate output inlined into `f` (`__dfgrad_aggregate{k}`).
    Aggregate,
    /// A scalar subquery's derivative (`__dfgrad_subquery{k}`).
    Subquery,
    /// An aggregate added by the rewrite through aggregates (`__dfgrad_agg{k}`).
    AddedAggregate,
    /// A window added by the rewrite through aggregates (`__dfgrad_window{k}`).
    AddedWindow,
    /// A pre-projected aggregate argument for Acero (`__dfgrad_acero_{i}`).
    Acero,
    /// A group statistic of a transpose rule (`__dfgrad_stat{k}`).
    Stat,
    /// A loss subquery's value bound below a marker (`__dfgrad_loss{k}`).
    Loss,
    /// Column `i` of a backward block's input (`__dfgrad_c{i}`).
    LeafColumn,
    /// An adjoint in the backward pass (`__dfgrad_adj{i}`).
    Adjoint,
    /// A partial derivative in the backward pass (`__dfgrad_d{k}`).
    Partial,
    /// A group or row key in the backward pass (`__dfgrad_key{j}`).
    Key,
    /// A term's adjoint in a backward block (`__dfgrad_term{i}`).
    Term,
    /// A `WHERE` clause's derivative computed below it (`__dfgrad_where{k}`).
    Where,
    /// A join key of a partial summed over a join's other side
    /// (`__dfgrad_on{k}`).
    JoinKey,
    /// A partial's factor summed over a join's other side
    /// (`__dfgrad_summed{k}`).
    Contracted,
    /// A parameter row's factor of a group join's scaled sums
    /// (`__dfgrad_factor{k}`).
    Factor,
}

impl Placeholder {
    fn prefix(self) -> &'static str {
        match self {
            Placeholder::Arg => "__dfgrad_arg",
            Placeholder::Node => "__dfgrad_node",
            Placeholder::Root => "__dfgrad_root",
            Placeholder::Aggregate => "__dfgrad_aggregate",
            Placeholder::Subquery => "__dfgrad_subquery",
            Placeholder::AddedAggregate => "__dfgrad_agg",
            Placeholder::AddedWindow => "__dfgrad_window",
            Placeholder::Acero => "__dfgrad_acero_",
            Placeholder::Stat => "__dfgrad_stat",
            Placeholder::Loss => "__dfgrad_loss",
            Placeholder::LeafColumn => "__dfgrad_c",
            Placeholder::Adjoint => "__dfgrad_adj",
            Placeholder::Partial => "__dfgrad_d",
            Placeholder::Key => "__dfgrad_key",
            Placeholder::Term => "__dfgrad_term",
            Placeholder::Where => "__dfgrad_where",
            Placeholder::JoinKey => "__dfgrad_on",
            Placeholder::Contracted => "__dfgrad_summed",
            Placeholder::Factor => "__dfgrad_factor",
        }
    }

    /// The name of item `k`.
    pub fn name(self, k: usize) -> String {
        format!("{}{k}", self.prefix())
    }

    /// The (unqualified) column of item `k`.
    pub fn column(self, k: usize) -> Expr {
        Expr::Column(Column::new_unqualified(self.name(k)))
    }

    /// Whether `c` has this family's form (unqualified, its prefix), whether
    /// or not an item number follows.
    pub(crate) fn claims(self, c: &Column) -> bool {
        c.relation.is_none() && c.name.starts_with(self.prefix())
    }

    /// `k` when `c` is this family's column of item `k`.
    pub fn index(self, c: &Column) -> Option<usize> {
        match c.relation {
            None => c.name.strip_prefix(self.prefix())?.parse().ok(),
            Some(_) => None,
        }
    }

    /// `e` with each of this family's columns `k` replaced by `values[k]`.
    pub(crate) fn fill(self, e: Expr, values: &[Expr]) -> Result<Expr> {
        Ok(e.transform_up(|e| match &e {
            Expr::Column(c) => match self.index(c).and_then(|k| values.get(k)) {
                Some(v) => Ok(Transformed::yes(v.clone())),
                None => Ok(Transformed::no(e)),
            },
            _ => Ok(Transformed::no(e)),
        })?
        .data)
    }
}

/// The qualifier of the `k`-th localized outer variable (`__dfgrad_outer{k}`).
pub fn outer_qualifier(k: usize) -> TableReference {
    TableReference::bare(format!("__dfgrad_outer{k}"))
}

/// The qualifier of the `k`-th input of a backward block (`__dfgrad_leaf{k}`).
pub(crate) fn leaf_qualifier(k: usize) -> TableReference {
    TableReference::bare(format!("__dfgrad_leaf{k}"))
}

/// The qualifier of the `k`-th gradient table joined below a node (`__dfgrad_table{k}`).
pub(crate) fn gradient_table_qualifier(k: usize) -> TableReference {
    TableReference::bare(format!("__dfgrad_table{k}"))
}

/// Whether `q` is a qualifier [`gradient_table_qualifier`] builds.
pub(crate) fn is_gradient_table_qualifier(q: &TableReference) -> bool {
    q.table()
        .strip_prefix("__dfgrad_table")
        .is_some_and(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
}

/// The tangent column of a recursive CTE's column `c` with respect to the
/// `j`-th variable differentiated through its iterations
/// (`__dfgrad_tangent{j}_{c}`).
pub(crate) fn tangent_column(j: usize, c: usize) -> String {
    format!("__dfgrad_tangent{j}_{c}")
}

/// The tangent of column `i` of a node's output in the `j`-th direction,
/// where forward mode rewrites every node of a recursive term that reads
/// its work table more than once (`__dfgrad_dot{j}_{i}`).
pub(crate) fn node_tangent(j: usize, i: usize) -> String {
    format!("__dfgrad_dot{j}_{i}")
}

/// The `k`-th part of the tangents of an aggregate of such a term (a
/// window function below it, an aggregate of the rows) that a projection
/// above combines (`__dfgrad_part{k}`).
pub(crate) fn aggregate_part(k: usize) -> String {
    format!("__dfgrad_part{k}")
}

/// The `i`-th group key of an aggregate joined back to its rows, where
/// such a term needs a value of each row's group (`__dfgrad_group_key{i}`).
pub(crate) fn group_key(i: usize) -> String {
    format!("__dfgrad_group_key{i}")
}

/// The `k`-th value (a subquery over the work table, a relational
/// gradient) computed below a projection of such a term
/// (`__dfgrad_lifted{k}`).
pub(crate) fn lifted_value(k: usize) -> String {
    format!("__dfgrad_lifted{k}")
}

/// The tangent of the [`lifted_value`] `k` in the `j`-th direction
/// (`__dfgrad_lifted_dot{j}_{k}`).
pub(crate) fn lifted_tangent(j: usize, k: usize) -> String {
    format!("__dfgrad_lifted_dot{j}_{k}")
}

/// Column `c` of the recursive CTE `cte` passed on to a derivative through
/// its iterations (`__dfgrad_value{c}_{cte}`: chained recursive CTEs pass
/// theirs on through the same projections).
pub(crate) fn carried_value(cte: &str, c: usize) -> String {
    format!("__dfgrad_value{c}_{cte}")
}

/// The iteration that produced a row of a recursive CTE differentiated in
/// reverse mode (`__dfgrad_iteration`; 0 for the static term's rows).
pub(crate) const ITERATION_COLUMN: &str = "__dfgrad_iteration";

/// A copy of column `c` of a recursive CTE's first row, carried along the
/// rows derived from it for reverse mode to replay the iterations
/// (`__dfgrad_initial{c}`).
pub(crate) fn initial_column(c: usize) -> String {
    format!("__dfgrad_initial{c}")
}

/// The cotangent of column `c` of a recursive CTE's row for the `k`-th
/// derivative taken through its iterations in reverse mode
/// (`__dfgrad_seed{k}_{c}`).
pub(crate) fn seed_column(k: usize, c: usize) -> String {
    format!("__dfgrad_seed{k}_{c}")
}

/// The cotangent of column `c` of a recursive CTE's state while its
/// iterations are replayed backwards (`__dfgrad_adjoint{c}`).
pub(crate) fn adjoint_column(c: usize) -> String {
    format!("__dfgrad_adjoint{c}")
}

/// The cotangent of the `m`-th relational gradient of a step that reads its
/// work table again, as its loop runs backwards (`__dfgrad_cotangent{m}`).
pub(crate) fn cotangent_column(m: usize) -> String {
    format!("__dfgrad_cotangent{m}")
}

/// The recursive CTE that runs a loop whose step reads its work table again
/// backwards, for relational reverse mode (`__dfgrad_backward_rows`).
pub(crate) const BACKWARD_ROWS: &str = "__dfgrad_backward_rows";

/// The rows' adjoints one backward step computes, as the next step's rows
/// read them (`__dfgrad_adjoints`).
pub(crate) const ADJOINTS: &str = "__dfgrad_adjoints";

/// The qualifier of the row a recursive CTE's row made, read beside it by
/// relational reverse mode through its iterations (`__dfgrad_next`).
pub(crate) const NEXT: &str = "__dfgrad_next";

/// The iteration a row of a loss's plan batched over a loop's iterations
/// belongs to (`__dfgrad_level`).
pub(crate) const LEVEL: &str = "__dfgrad_level";

/// The first row (its number) a row of a recursive CTE differentiated in
/// reverse mode through aggregating steps derives from
/// (`__dfgrad_trajectory`).
pub(crate) const TRAJECTORY_COLUMN: &str = "__dfgrad_trajectory";

/// The value of the `j`-th aggregate of a recursive CTE's step: a variable
/// of the step's update, and the value that made a row, kept beside it for
/// reverse mode (`__dfgrad_aggregate{j}`).
pub(crate) fn aggregate_column(j: usize) -> String {
    format!("__dfgrad_aggregate{j}")
}

/// The `j`-th aggregate's value that made the row of a recursive CTE
/// before, beside it in a backward step (`__dfgrad_previous_aggregate{j}`).
pub(crate) fn previous_aggregate_column(j: usize) -> String {
    format!("__dfgrad_previous_aggregate{j}")
}

/// The `i`-th key of the rows a derivative through a recursive CTE's
/// aggregating steps is taken for: a group key of the node asking for it,
/// or its row number (`__dfgrad_key{i}`).
pub(crate) fn key_column(i: usize) -> String {
    format!("__dfgrad_key{i}")
}

/// The recursive CTE that runs the `k`-th derivative through a recursive
/// CTE's aggregating steps backwards (`__dfgrad_backward{k}`).
pub(crate) fn backward_cte(k: usize) -> String {
    format!("__dfgrad_backward{k}")
}

/// The qualifier of a recursive CTE's rows (with their iteration and
/// trajectory) read by its backward recursion (`__dfgrad_forward`).
pub(crate) const FORWARD: &str = "__dfgrad_forward";

/// The rows a derivative through a recursive CTE's aggregating steps is
/// taken for, numbered (`__dfgrad_row`).
pub(crate) const ROW_COLUMN: &str = "__dfgrad_row";

/// The number of rows a derivative inside `avg` through a recursive
/// CTE's aggregating steps averages over, for the `k`-th derivative
/// (`__dfgrad_count{k}`).
pub(crate) fn count_column(k: usize) -> String {
    format!("__dfgrad_count{k}")
}

/// The `j`-th aggregate's contribution to the cotangent of column `c` of a
/// recursive CTE's state, in a backward step (`__dfgrad_contribution{j}_{c}`).
pub(crate) fn contribution_column(j: usize, c: usize) -> String {
    format!("__dfgrad_contribution{j}_{c}")
}

/// The `k`-th derivative taken through a recursive CTE's iterations in
/// reverse mode (`__dfgrad_reverse{k}`).
pub(crate) fn reverse_column(k: usize) -> String {
    format!("__dfgrad_reverse{k}")
}

/// Whether `name` is a column [`tangent_column`] builds.
pub(crate) fn is_tangent_column(name: &str) -> bool {
    name.strip_prefix("__dfgrad_tangent").is_some_and(|rest| {
        rest.split_once('_').is_some_and(|(j, c)| {
            [j, c]
                .iter()
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
    })
}

/// The name of the `k`-th CTE of a query exported as a chain of operators
/// (`__dfgrad_r{k}`).
pub(crate) fn export_relation(k: usize) -> String {
    format!("__dfgrad_r{k}")
}

/// Column `i` of such a CTE (`c{i}`): only ever read qualified by the
/// chain's own alias of its CTE, so it cannot meet a user's name.
pub(crate) fn export_column(i: usize) -> String {
    format!("c{i}")
}

/// A backward input's column telling a row that is there from one an outer
/// join padded with NULLs.
pub(crate) const PRESENT: &str = "__dfgrad_present";

/// The qualifier of a group's adjoints while its statistics are joined to them.
pub(crate) const SEED: &str = "__dfgrad_seed";

/// The qualifier of a group's statistics while they are joined to its adjoints.
pub(crate) const STATS: &str = "__dfgrad_stats";

/// A gradient table's derivative column.
pub(crate) const GRADIENT: &str = "__dfgrad_gradient";

/// Whether a row an [`crate::plan::overwrite::Overwrite`] writes was updated.
pub(crate) const UPDATED: &str = "__dfgrad_updated";

/// The function that fails on a parameter row its other columns do not
/// tell apart.
pub(crate) const DUPLICATE_ROWS: &str = "__dfgrad_duplicate_rows";

/// The function that fails on a loss query of more than one row.
pub(crate) const LOSS_ROWS: &str = "__dfgrad_loss_rows";

/// The alias given to an input without a qualifier in exported SQL.
pub(crate) const INPUT_ALIAS: &str = "__dfgrad_input";

/// A prefix `__dfgrad{m}_` for bound columns that no column of `schema`
/// starts with.
pub fn binding_prefix(schema: &DFSchema) -> String {
    (0..)
        .map(|m| format!("__dfgrad{m}_"))
        .find(|p| !schema.fields().iter().any(|f| f.name().starts_with(p)))
        .expect("some prefix is free")
}

/// Whether `name` is a column the analyzer binds (`__dfgrad{m}_{node}`, with
/// a prefix from [`binding_prefix`]), or one DataFusion's
/// common-subexpression elimination computes (`__common_expr_{n}`).
pub fn is_bound_name(name: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if let Some(n) = name.strip_prefix("__common_expr_") {
        return digits(n);
    }
    name.strip_prefix("__dfgrad")
        .and_then(|rest| rest.split_once('_'))
        .is_some_and(|(m, node)| digits(m) && !node.is_empty())
}

//! Emitting derivatives with their shared subexpressions computed once.
//!
//! A DataFusion [`Expr`] is a tree, so emitting a DAG as expressions repeats
//! every shared node at each use: all partials of an `n`-factor product, or
//! the derivative of a depth-`n` composition, become `O(n²)` tree nodes (and
//! a second derivative far more). Here each shared node is instead *bound* to
//! a column, computed by a projection below the plan node that asks for the
//! derivative — a `let` in relational form. Nodes that depend on other bound
//! nodes go in a later projection, so the result is a stack of [`Layer`]s,
//! each carrying forward only the bound columns still used above it.
//!
//! A node is only bound when computing it on every row is harmless: it can
//! never raise an error ([`Workspace::own_safe`] for it and every node below
//! it), or it is evaluated on every row anyway (not only inside a `CASE`
//! branch). Nodes that read outer references, placeholders or subqueries
//! stay inline.

use datafusion::common::{Column, HashMap, HashSet};
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, Operator};

use super::graph::{Graph, NodeId};
use super::workspace::Workspace;
use super::MAX_TREE_NODES;
use crate::error::{fail, ErrorKind};

/// One projection: the bound columns it passes on from below and the ones it defines.
#[derive(Debug, Clone, Default)]
pub struct Layer {
    /// Names of bound columns defined below that are still used above.
    pub carried: Vec<String>,
    /// New bound columns: name and defining expression.
    pub defined: Vec<(String, Expr)>,
}

/// Derivative expressions over a stack of binding projections.
#[derive(Debug, Clone)]
pub struct Shared {
    /// The projections to put, in order, between the input and the node that
    /// uses `exprs` (each also passes every input column through).
    pub layers: Vec<Layer>,
    /// One expression per root, over the input columns and the bound columns.
    pub exprs: Vec<Expr>,
}

/// Smallest tree size (nodes) of a shared node worth binding to a column.
const MIN_BOUND_SIZE: u64 = 3;

/// Most binding projections stacked below one plan node; deeper chains are
/// cut into at most this many layers and the rest is repeated (within
/// [`MAX_TREE_NODES`]). DataFusion 55 computes an expression's name at every
/// level while typing it, so its planning time grows with depth times size:
/// the fewer the layers, the deeper and larger the repeated trees. Measured
/// (issue 21, dev profile, 2 cores): `grad` of a 300-deep `sin(sin(…x))` took
/// 38 s with at most 2 layers, 3.8 s with 8, 2.9 s with 16, 2.2 s with 64
/// (the plain expression: 2.4 s); a product of 300 factors was refused as too
/// large with 2 layers and takes 1.1 s with 16. The 1,000 random expressions
/// of `tests/properties.rs` with second derivatives stayed within noise
/// (51-68 s), their peak memory rose from 0.8 to 2.1 GB beyond 2 layers.
const MAX_LAYERS: usize = 16;

/// Height from which an expression is cut, its top bound to a column even if
/// it is used once: DataFusion's planning cost grows faster than linearly
/// with expression depth (each level formats its arguments' names).
const MAX_HEIGHT: usize = 32;

/// When a node is bound to a column.
#[derive(Debug, Clone, Copy)]
struct Limits {
    /// A shared node is bound when its tree has at least this many nodes.
    min_size: u64,
    /// Any node is bound when its tree is at least this high.
    max_height: usize,
}

/// Emits `roots` with every shared node worth it bound to a column named
/// `{prefix}{node}`. `always[i]` says whether root `i` is evaluated on every
/// row where the plan node evaluates its expressions (it is not, e.g., when it
/// sits inside a `CASE` branch).
pub fn share(
    ws: &mut Workspace,
    roots: &[NodeId],
    always: &[bool],
    prefix: &str,
) -> Result<Shared> {
    let order = ws.graph().reachable(roots);
    let mut own_safe = HashSet::with_capacity(order.len());
    for &n in &order {
        if ws.own_safe(n)? {
            own_safe.insert(n);
        }
    }
    let g = ws.graph();
    let mut uses: HashMap<NodeId, usize> = HashMap::with_capacity(order.len());
    for &n in &order {
        for &a in g.args(n) {
            *uses.entry(a).or_default() += 1;
        }
    }
    for &r in roots {
        *uses.entry(r).or_default() += 1;
    }
    let evaluated = always_evaluated(g, &order, roots, always);
    let pinned = pinned(g, &order);

    let nodes = Nodes {
        order: &order,
        uses: &uses,
        own_safe: &own_safe,
        evaluated: &evaluated,
        pinned: &pinned,
    };
    // Bind smaller shared nodes and cut deep expressions shorter until the
    // stack of projections fits.
    let mut limits = Limits {
        min_size: MIN_BOUND_SIZE,
        max_height: MAX_HEIGHT,
    };
    let Bindings { level, size } = loop {
        let b = bindings(g, &nodes, limits);
        if b.level.values().copied().max().unwrap_or(0) <= MAX_LAYERS {
            break b;
        }
        limits.min_size *= 2;
        limits.max_height *= 2;
    };
    let emitted = level
        .keys()
        .chain(roots.iter().filter(|r| !level.contains_key(*r)))
        .fold(0u64, |acc, n| acc.saturating_add(size[n]));
    // Nodes left inline are repeated at each use: refuse what would not fit.
    if emitted > MAX_TREE_NODES {
        return fail(
            ErrorKind::DerivativeTooLarge,
            format!(
                "the derivative has {emitted} expression nodes with its shared parts computed \
                 once where possible (limit {MAX_TREE_NODES}): parts inside a CASE branch that \
                 may raise an error (sqrt, power with a variable exponent, integer arithmetic) \
                 cannot be computed outside their branch, and very deep chains are cut into at \
                 most {MAX_LAYERS} layers, so the rest is repeated"
            ),
        );
    }
    if level.is_empty() {
        return Ok(Shared {
            layers: vec![],
            exprs: g.emit(roots),
        });
    }

    let name = |n: NodeId| format!("{prefix}{n}");
    let mut bound: HashMap<NodeId, Expr> = level
        .keys()
        .map(|&n| (n, Expr::Column(Column::new_unqualified(name(n)))))
        .collect();
    let top = level.values().copied().max().unwrap_or(0);
    let mut by_level: Vec<Vec<NodeId>> = vec![vec![]; top + 1];
    for (&n, &l) in &level {
        by_level[l].push(n);
    }
    // The last layer whose input still needs each bound column.
    let mut last_use: HashMap<NodeId, usize> = HashMap::new();
    let mut layers: Vec<Layer> = Vec::with_capacity(top);
    for (l, nodes) in by_level.iter_mut().enumerate().skip(1) {
        nodes.sort_unstable();
        let mut layer = Layer::default();
        for &n in nodes.iter() {
            for m in frontier(g, g.args(n), &level) {
                let u = last_use.entry(m).or_default();
                *u = (*u).max(l);
            }
            let own = bound.remove(&n).expect("bound node");
            let expr = g.emit_bound(&[n], &bound).remove(0);
            bound.insert(n, own);
            layer.defined.push((name(n), expr));
        }
        layers.push(layer);
    }
    for m in frontier(g, roots, &level) {
        last_use.insert(m, top + 1);
    }
    // A column defined in layer l and last used by layer u is carried by
    // layers l+1 .. u-1.
    let mut carried: Vec<(NodeId, usize, usize)> =
        last_use.iter().map(|(&m, &u)| (m, level[&m], u)).collect();
    carried.sort_unstable();
    for (m, defined, used) in carried {
        for layer in layers.iter_mut().take(used - 1).skip(defined) {
            layer.carried.push(name(m));
        }
    }
    Ok(Shared {
        layers,
        exprs: g.emit_bound(roots, &bound),
    })
}

/// What [`bindings`] needs to know of the nodes reachable from the roots.
struct Nodes<'a> {
    /// The nodes, in ascending (topological) order.
    order: &'a [NodeId],
    /// How many times each node is used (by nodes or as a root).
    uses: &'a HashMap<NodeId, usize>,
    /// The nodes whose own operation never raises an error.
    own_safe: &'a HashSet<NodeId>,
    /// The nodes evaluated on every row.
    evaluated: &'a HashSet<NodeId>,
    /// The nodes that must stay inline.
    pinned: &'a HashSet<NodeId>,
}

/// The layer (from 1) of each node bound under `limits`. A node may be bound
/// when it is not pinned and computing it on every row is harmless: it is
/// evaluated on every row anyway, or nothing in its expression (down to the
/// bound columns it reads) can raise an error.
fn bindings(g: &Graph, nodes: &Nodes, limits: Limits) -> Bindings {
    // Per node: tree size, height, the deepest layer it reads, and whether
    // its expression (given the bindings below) never raises an error.
    let mut shape: HashMap<NodeId, (u64, usize, usize, bool)> =
        HashMap::with_capacity(nodes.order.len());
    let mut level: HashMap<NodeId, usize> = HashMap::new();
    for &n in nodes.order {
        let (mut size, mut height, mut reads) = (1u64, 1usize, 0usize);
        let mut safe = nodes.own_safe.contains(&n);
        for a in g.args(n) {
            match level.get(a) {
                Some(&l) => {
                    size += 1;
                    height = height.max(2);
                    reads = reads.max(l);
                }
                None => {
                    let (s, h, r, child_safe) = shape[a];
                    size = size.saturating_add(s);
                    height = height.max(h + 1);
                    reads = reads.max(r);
                    safe &= child_safe;
                }
            }
        }
        shape.insert(n, (size, height, reads, safe));
        let worth = (nodes.uses[&n] > 1 && size >= limits.min_size) || height >= limits.max_height;
        let bindable = !g.args(n).is_empty()
            && !nodes.pinned.contains(&n)
            && !builds_struct(g.shell(n))
            && (safe || nodes.evaluated.contains(&n));
        if worth && bindable {
            level.insert(n, reads + 1);
        }
    }
    let size = shape.into_iter().map(|(n, (s, ..))| (n, s)).collect();
    Bindings { level, size }
}

/// Whether `shell` assembles a struct (the partials of `grad(f, x, y)`): its
/// fields are bound instead, so `grad(f, x, y)['x']` reads one field without
/// a struct column, which engines without structs could not print.
fn builds_struct(shell: &Expr) -> bool {
    matches!(shell, Expr::ScalarFunction(f) if f.func.name() == "named_struct")
}

/// The bound nodes with their layers, and each node's tree size given them.
struct Bindings {
    level: HashMap<NodeId, usize>,
    size: HashMap<NodeId, u64>,
}

/// The bound nodes an expression over `starts` refers to directly (through
/// unbound nodes only).
fn frontier(g: &Graph, starts: &[NodeId], level: &HashMap<NodeId, usize>) -> Vec<NodeId> {
    let mut seen = HashSet::new();
    let mut found = Vec::new();
    let mut stack: Vec<NodeId> = starts.to_vec();
    while let Some(n) = stack.pop() {
        if !seen.insert(n) {
            continue;
        }
        if level.contains_key(&n) {
            found.push(n);
        } else {
            stack.extend(g.args(n));
        }
    }
    found
}

/// The nodes evaluated on every row: reached from an always-evaluated root
/// without entering a `CASE` branch (beyond the first condition), the right
/// side of `AND`/`OR`, or a later argument of `coalesce`.
fn always_evaluated(
    g: &Graph,
    order: &[NodeId],
    roots: &[NodeId],
    always: &[bool],
) -> HashSet<NodeId> {
    let mut evaluated: HashSet<NodeId> = roots
        .iter()
        .zip(always)
        .filter(|(_, &a)| a)
        .map(|(&r, _)| r)
        .collect();
    for &n in order.iter().rev() {
        if !evaluated.contains(&n) {
            continue;
        }
        let shell = g.shell(n);
        for (i, &a) in g.args(n).iter().enumerate() {
            if is_unconditional(shell, i) {
                evaluated.insert(a);
            }
        }
    }
    evaluated
}

/// Whether argument `i` of a node is evaluated on every row the node is.
pub(crate) fn is_unconditional(shell: &Expr, i: usize) -> bool {
    match shell {
        Expr::Case(case) => i == 0 || (case.expr.is_some() && i == 1),
        Expr::BinaryExpr(b) if matches!(b.op, Operator::And | Operator::Or) => i == 0,
        Expr::ScalarFunction(f) if matches!(f.func.name(), "coalesce" | "nvl" | "nvl2") => i == 0,
        _ => true,
    }
}

/// The nodes that must stay inline: those that read an outer reference, a
/// placeholder or a subquery (a projection below cannot compute them).
fn pinned(g: &Graph, order: &[NodeId]) -> HashSet<NodeId> {
    let mut pinned = HashSet::new();
    for &n in order {
        let own = matches!(
            g.shell(n),
            Expr::OuterReferenceColumn(..)
                | Expr::Placeholder(_)
                | Expr::ScalarSubquery(_)
                | Expr::Exists(_)
                | Expr::InSubquery(_)
                | Expr::ScalarVariable(..)
        );
        if own || g.args(n).iter().any(|a| pinned.contains(a)) {
            pinned.insert(n);
        }
    }
    pinned
}

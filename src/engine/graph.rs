//! A hash-consed DAG of expressions.
//!
//! Every node is an expression *shell* (the expression with its children
//! replaced by holes) plus the ids of its children. Equal subexpressions get
//! the same id, so a derivative that reuses parts of the forward expression
//! (or of itself) costs one node per distinct subexpression. Shells are
//! interned too, so a node is looked up by a shell id and its children's ids,
//! never by hashing a whole expression. Node ids are
//! created after their children, so ascending id order is a topological order,
//! and every walk here is a loop: no recursion, no stack overflow on deep input.

use std::hash::BuildHasher;
use std::ops::Range;
use std::sync::Arc;

use datafusion::common::hash_utils::RandomState;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{HashMap, ScalarValue};
use datafusion::error::Result;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{BinaryExpr, Case, Cast, Expr, Operator, TryCast};

/// Index of a node in a [`Graph`].
pub type NodeId = usize;

/// Index of a distinct shell in a [`Graph`]: equal shells have equal ids.
pub(crate) type ShellId = usize;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Node {
    shell: ShellId,
    /// The children: a range of [`Graph::arg_pool`].
    args: Range<usize>,
}

/// A hash index of items stored elsewhere, numbered `0..`, each with its
/// hash: open addressing with linear probing, at most half full.
#[derive(Debug, Default)]
struct Index {
    /// Per slot, 1 + the number of the item in it, or 0 when empty; the
    /// length is 0 or a power of two.
    slots: Vec<usize>,
    /// The hash of each item.
    hashes: Vec<u64>,
}

impl Index {
    /// The item with `hash` for which `same` holds.
    fn find(&self, hash: u64, same: impl Fn(usize) -> bool) -> Option<usize> {
        let mask = self.slots.len().checked_sub(1)?;
        let mut slot = hash as usize & mask;
        loop {
            match self.slots[slot] {
                0 => return None,
                i if self.hashes[i - 1] == hash && same(i - 1) => return Some(i - 1),
                _ => slot = (slot + 1) & mask,
            }
        }
    }

    /// Records the next item, with `hash`; its number.
    fn push(&mut self, hash: u64) -> usize {
        let item = self.hashes.len();
        self.hashes.push(hash);
        if 2 * self.hashes.len() > self.slots.len() {
            self.slots = vec![0; (2 * self.slots.len()).max(16)];
            for i in 0..self.hashes.len() {
                self.place(i);
            }
        } else {
            self.place(item);
        }
        item
    }

    /// Puts item `i` in the first free slot from its hash on.
    fn place(&mut self, i: usize) {
        let mask = self.slots.len() - 1;
        let mut slot = self.hashes[i] as usize & mask;
        while self.slots[slot] != 0 {
            slot = (slot + 1) & mask;
        }
        self.slots[slot] = i + 1;
    }

    /// The hash of item `i`.
    fn hash(&self, i: usize) -> u64 {
        self.hashes[i]
    }
}

/// A hash-consed expression DAG.
#[derive(Debug, Default)]
pub struct Graph {
    nodes: Vec<Node>,
    /// The children of every node, one after the other.
    arg_pool: Vec<NodeId>,
    node_index: Index,
    /// The distinct shells.
    shells: Vec<Arc<Expr>>,
    shell_index: Index,
    /// Deterministic, so a shell's hash holds in every graph.
    hasher: RandomState,
    /// The shells of `-a` (key `None`) and of `a op b`.
    operators: Vec<(Option<Operator>, ShellId)>,
}
/// The hole that stands for a child inside a shell.
pub(crate) fn hole() -> Expr {
    Expr::Literal(ScalarValue::Null, None)
}

/// Splits `expr` into its shell and its children, in `map_children` order.
// pub for the tests in tests/unit/engine_graph.rs
#[doc(hidden)]
pub fn split(expr: Expr) -> Result<(Expr, Vec<Expr>)> {
    let mut children = Vec::new();
    let shell = expr
        .map_children(|child| {
            children.push(child);
            Ok(Transformed::yes(hole()))
        })?
        .data;
    Ok((shell, children))
}

/// [`split`] without cloning the children, for the commonest kinds of node
/// (and leaves): the shell, with the children appended to `children`;
/// `None` for the other kinds.
// pub for the tests in tests/unit/engine_graph.rs
#[doc(hidden)]
pub fn split_ref<'e>(expr: &'e Expr, children: &mut Vec<&'e Expr>) -> Option<Expr> {
    let boxed = || Box::new(hole());
    let shell = match expr {
        Expr::ScalarFunction(f) => Expr::ScalarFunction(ScalarFunction::new_udf(
            Arc::clone(&f.func),
            vec![hole(); f.args.len()],
        )),
        Expr::Cast(c) => Expr::Cast(Cast::new_from_field(boxed(), Arc::clone(&c.field))),
        Expr::TryCast(c) => Expr::TryCast(TryCast::new_from_field(boxed(), Arc::clone(&c.field))),
        Expr::Not(_) => Expr::Not(boxed()),
        Expr::IsNull(_) => Expr::IsNull(boxed()),
        Expr::IsNotNull(_) => Expr::IsNotNull(boxed()),
        Expr::Case(c) => Expr::Case(Case::new(
            c.expr.as_ref().map(|_| boxed()),
            c.when_then_expr
                .iter()
                .map(|_| (boxed(), boxed()))
                .collect(),
            c.else_expr.as_ref().map(|_| boxed()),
        )),
        Expr::Column(_) | Expr::Literal(..) => expr.clone(),
        _ => return None,
    };
    expr.apply_children(|child| {
        children.push(child);
        Ok(TreeNodeRecursion::Continue)
    })
    .expect("collecting children cannot fail");
    Some(shell)
}

/// Puts `children` back into the holes of `shell`.
pub(crate) fn fill(shell: Expr, children: Vec<Expr>) -> Expr {
    let mut children = children.into_iter();
    shell
        .map_children(|_| {
            Ok(Transformed::yes(
                children.next().expect("one child per hole"),
            ))
        })
        .expect("filling holes cannot fail")
        .data
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of distinct nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the graph has no node.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The shell of node `id` (children are holes).
    pub fn shell(&self, id: NodeId) -> &Expr {
        &self.shells[self.nodes[id].shell]
    }

    /// The id of node `id`'s shell.
    pub(crate) fn shell_id(&self, id: NodeId) -> ShellId {
        self.nodes[id].shell
    }

    /// The children of node `id`.
    pub fn args(&self, id: NodeId) -> &[NodeId] {
        &self.arg_pool[self.nodes[id].args.clone()]
    }

    /// The value of node `id` if it is a Float64 literal.
    pub fn number(&self, id: NodeId) -> Option<f64> {
        match self.shell(id) {
            Expr::Literal(ScalarValue::Float64(Some(v)), _) => Some(*v),
            _ => None,
        }
    }

    /// The node for `shell(args)`, created if new (no folding).
    pub fn add(&mut self, shell: Expr, args: &[NodeId]) -> NodeId {
        let shell = self.intern_shell(shell);
        self.node(shell, args)
    }

    /// The id of `shell`, added if new.
    fn intern_shell(&mut self, shell: Expr) -> ShellId {
        let hash = self.hasher.hash_one(&shell);
        match self.find_shell(&shell, hash) {
            Some(s) => s,
            None => self.push_shell(Arc::new(shell), hash),
        }
    }

    /// The id of `shell`, whose hash is `hash`, if the graph has it.
    fn find_shell(&self, shell: &Expr, hash: u64) -> Option<ShellId> {
        let shells = &self.shells;
        self.shell_index.find(hash, |s| {
            let known = shells[s].as_ref();
            std::ptr::eq(known, shell) || *known == *shell
        })
    }

    /// Adds a shell the graph does not have yet.
    fn push_shell(&mut self, shell: Arc<Expr>, hash: u64) -> ShellId {
        self.shells.push(shell);
        self.shell_index.push(hash)
    }

    /// The node for the shell `shell` applied to `args`, created if new.
    fn node(&mut self, shell: ShellId, args: &[NodeId]) -> NodeId {
        let hash = self.hasher.hash_one((shell, args));
        let (nodes, pool) = (&self.nodes, &self.arg_pool);
        let same = |id: NodeId| {
            let node = &nodes[id];
            node.shell == shell && pool[node.args.clone()] == *args
        };
        if let Some(id) = self.node_index.find(hash, same) {
            return id;
        }
        let start = self.arg_pool.len();
        self.arg_pool.extend_from_slice(args);
        self.nodes.push(Node {
            shell,
            args: start..self.arg_pool.len(),
        });
        self.node_index.push(hash)
    }

    /// The shell of `-a` (`op` `None`) or of `a op b`.
    fn operator(&mut self, op: Option<Operator>) -> ShellId {
        if let Some(&(_, shell)) = self.operators.iter().find(|(o, _)| *o == op) {
            return shell;
        }
        let shell = match op {
            None => Expr::Negative(Box::new(hole())),
            Some(op) => Expr::BinaryExpr(BinaryExpr::new(Box::new(hole()), op, Box::new(hole()))),
        };
        let shell = self.intern_shell(shell);
        self.operators.push((op, shell));
        shell
    }

    /// A Float64 literal node.
    pub fn num(&mut self, v: f64) -> NodeId {
        self.add(Expr::Literal(ScalarValue::Float64(Some(v)), None), &[])
    }

    /// A binary arithmetic node, folding literals and the neutral and absorbing
    /// elements (0 and 1) as symbolic zeros and ones.
    pub fn binary(&mut self, op: Operator, a: NodeId, b: NodeId) -> NodeId {
        let (x, y) = (self.number(a), self.number(b));
        match (op, x, y) {
            (Operator::Plus, Some(x), Some(y)) => return self.num(x + y),
            (Operator::Minus, Some(x), Some(y)) => return self.num(x - y),
            (Operator::Multiply, Some(x), Some(y)) => return self.num(x * y),
            (Operator::Divide, Some(x), Some(y)) if y != 0.0 => return self.num(x / y),
            (Operator::Plus, Some(0.0), _) => return b,
            (Operator::Plus | Operator::Minus, _, Some(0.0)) => return a,
            (Operator::Minus, Some(0.0), _) => return self.neg(b),
            (Operator::Multiply, Some(z), _) | (Operator::Multiply, _, Some(z)) if z == 0.0 => {
                return self.num(0.0)
            }
            (Operator::Multiply, Some(1.0), _) => return b,
            (Operator::Multiply | Operator::Divide, _, Some(1.0)) => return a,
            (Operator::Multiply, Some(-1.0), _) => return self.neg(b),
            (Operator::Multiply | Operator::Divide, _, Some(-1.0)) => return self.neg(a),
            (Operator::Divide, Some(0.0), _) => return self.num(0.0),
            _ => {}
        }
        let shell = self.operator(Some(op));
        self.node(shell, &[a, b])
    }

    /// `-a`, folding literals and double negation.
    pub fn neg(&mut self, a: NodeId) -> NodeId {
        if let Some(x) = self.number(a) {
            return self.num(-x);
        }
        if matches!(self.shell(a), Expr::Negative(_)) {
            return self.args(a)[0];
        }
        let shell = self.operator(None);
        self.node(shell, &[a])
    }

    /// Adds `expr` (without folding), aliases stripped; `leaf` may claim a
    /// subexpression as an existing node (used to substitute placeholders).
    pub fn intern(
        &mut self,
        expr: &Expr,
        fold: bool,
        leaf: &mut dyn FnMut(&Expr) -> Result<Option<NodeId>>,
    ) -> Result<NodeId> {
        enum Step<'e> {
            Visit(&'e Expr),
            Build(Expr, usize),
            /// `a op b` (`Some(op)`) or `-a` (`None`), the commonest shells.
            Operator(Option<Operator>),
        }
        let mut work = vec![Step::Visit(expr)];
        let mut done: Vec<NodeId> = Vec::new();
        let mut children = Vec::new();
        while let Some(step) = work.pop() {
            match step {
                Step::Visit(Expr::Alias(alias)) => work.push(Step::Visit(&alias.expr)),
                Step::Visit(e) => {
                    if let Some(id) = leaf(e)? {
                        done.push(id);
                        continue;
                    }
                    match e {
                        Expr::BinaryExpr(b) => {
                            work.push(Step::Operator(Some(b.op)));
                            work.push(Step::Visit(&b.right));
                            work.push(Step::Visit(&b.left));
                        }
                        Expr::Negative(a) => {
                            work.push(Step::Operator(None));
                            work.push(Step::Visit(a));
                        }
                        e => match split_ref(e, &mut children) {
                            Some(shell) => {
                                work.push(Step::Build(shell, children.len()));
                                work.extend(children.drain(..).rev().map(Step::Visit));
                            }
                            // A rarer kind of node: split from a clone, whose
                            // children are interned on their own.
                            None => {
                                let (shell, children) = split(e.clone())?;
                                let mut args = Vec::with_capacity(children.len());
                                for child in &children {
                                    args.push(self.intern(child, fold, leaf)?);
                                }
                                done.push(self.build(shell, &args, fold));
                            }
                        },
                    }
                }
                Step::Build(shell, n) => {
                    let start = done.len() - n;
                    let id = self.build(shell, &done[start..], fold);
                    done.truncate(start);
                    done.push(id);
                }
                Step::Operator(op) => {
                    let id = match (op, fold) {
                        (Some(op), true) if is_arithmetic(op) => {
                            let b = done.pop().expect("right operand");
                            let a = done.pop().expect("left operand");
                            self.binary(op, a, b)
                        }
                        (None, true) => {
                            let a = done.pop().expect("operand");
                            self.neg(a)
                        }
                        _ => {
                            let n = if op.is_some() { 2 } else { 1 };
                            let start = done.len() - n;
                            let shell = self.operator(op);
                            let id = self.node(shell, &done[start..]);
                            done.truncate(start);
                            id
                        }
                    };
                    done.push(id);
                }
            }
        }
        Ok(done.pop().expect("one root"))
    }

    /// The node for `shell(args)`, folding arithmetic when `fold` holds and a
    /// field of a struct built in the graph always.
    pub(crate) fn build(&mut self, shell: Expr, args: &[NodeId], fold: bool) -> NodeId {
        match self.fold(&shell, args, fold) {
            Some(id) => id,
            None => self.add(shell, args),
        }
    }

    /// Adds node `id` of `other` with `args` as its children, folding
    /// arithmetic and sharing `other`'s shell.
    pub(crate) fn copy_node(&mut self, other: &Graph, id: NodeId, args: &[NodeId]) -> NodeId {
        let s = other.nodes[id].shell;
        let (shell, hash) = (&other.shells[s], other.shell_index.hash(s));
        if let Some(id) = self.fold(shell, args, true) {
            return id;
        }
        let shell = match self.find_shell(shell, hash) {
            Some(s) => s,
            None => self.push_shell(Arc::clone(shell), hash),
        };
        self.node(shell, args)
    }

    /// The node `shell(args)` folds to, if it folds.
    fn fold(&mut self, shell: &Expr, args: &[NodeId], arithmetic: bool) -> Option<NodeId> {
        match (shell, arithmetic) {
            (Expr::BinaryExpr(b), true) if is_arithmetic(b.op) => {
                Some(self.binary(b.op, args[0], args[1]))
            }
            (Expr::Negative(_), true) => Some(self.neg(args[0])),
            _ => self.struct_field(shell, args),
        }
    }

    /// The value node of `get_field(named_struct(…, 'name', value, …), 'name')`
    /// (how a nested `grad(f, x, y)['x']` refers to one partial).
    fn struct_field(&self, shell: &Expr, args: &[NodeId]) -> Option<NodeId> {
        let name_of = |id: NodeId| match self.shell(id) {
            Expr::Literal(v, _) => v.try_as_str().flatten(),
            _ => None,
        };
        let is_call =
            |e: &Expr, name: &str| matches!(e, Expr::ScalarFunction(f) if f.func.name() == name);
        if !is_call(shell, "get_field") || args.len() != 2 {
            return None;
        }
        let key = name_of(args[1])?;
        if !is_call(self.shell(args[0]), "named_struct") {
            return None;
        }
        self.args(args[0])
            .chunks(2)
            .find(|pair| pair.len() == 2 && name_of(pair[0]) == Some(key))
            .map(|pair| pair[1])
    }

    /// The nodes reachable from `roots`, in ascending (topological) order.
    pub fn reachable(&self, roots: &[NodeId]) -> Vec<NodeId> {
        self.reachable_until(roots, &|_| false)
    }

    /// The nodes reachable from `roots` without passing through a node for
    /// which `stop` holds (such a node is included, its children are not).
    fn reachable_until(&self, roots: &[NodeId], stop: &dyn Fn(NodeId) -> bool) -> Vec<NodeId> {
        let mut seen = vec![false; self.nodes.len()];
        let mut stack: Vec<NodeId> = roots.to_vec();
        while let Some(id) = stack.pop() {
            if !seen[id] {
                seen[id] = true;
                if !stop(id) {
                    stack.extend(self.args(id));
                }
            }
        }
        (0..self.nodes.len()).filter(|&id| seen[id]).collect()
    }

    /// Number of distinct nodes reachable from `roots` (the DAG size of an expression).
    pub fn size(&self, roots: &[NodeId]) -> usize {
        self.reachable(roots).len()
    }

    /// Number of nodes of the expression trees of `roots` (saturating): what
    /// [`Graph::emit`] would build.
    pub fn tree_size(&self, roots: &[NodeId]) -> u64 {
        let mut size: HashMap<NodeId, u64> = HashMap::new();
        for id in self.reachable(roots) {
            let s = self
                .args(id)
                .iter()
                .fold(1u64, |acc, a| acc.saturating_add(size[a]));
            size.insert(id, s);
        }
        roots
            .iter()
            .fold(0u64, |acc, r| acc.saturating_add(size[r]))
    }

    /// Builds the expression trees of `roots`. A subexpression used several
    /// times is emitted identically each time, so DataFusion's common
    /// subexpression elimination computes it once.
    pub fn emit(&self, roots: &[NodeId]) -> Vec<Expr> {
        self.emit_bound(roots, &HashMap::new())
    }

    /// Like [`Graph::emit`], with each node of `bound` emitted as the given
    /// expression (e.g. a column that holds its value) instead of its tree.
    pub fn emit_bound(&self, roots: &[NodeId], bound: &HashMap<NodeId, Expr>) -> Vec<Expr> {
        let order = self.reachable_until(roots, &|id| bound.contains_key(&id));
        let mut uses: HashMap<NodeId, usize> = HashMap::with_capacity(order.len());
        for &id in &order {
            if !bound.contains_key(&id) {
                for &a in self.args(id) {
                    *uses.entry(a).or_default() += 1;
                }
            }
        }
        for &r in roots {
            *uses.entry(r).or_default() += 1;
        }
        let mut built: HashMap<NodeId, Expr> = HashMap::with_capacity(order.len());
        let mut take = |built: &mut HashMap<NodeId, Expr>, id: NodeId| {
            let left = uses.get_mut(&id).expect("counted");
            *left -= 1;
            if *left == 0 {
                built.remove(&id).expect("built before use")
            } else {
                built[&id].clone()
            }
        };
        for id in order {
            let expr = match bound.get(&id) {
                Some(e) => e.clone(),
                None => {
                    let children = self.args(id).iter().map(|&a| take(&mut built, a)).collect();
                    fill(self.shell(id).clone(), children)
                }
            };
            built.insert(id, expr);
        }
        roots.iter().map(|&r| take(&mut built, r)).collect()
    }
}

/// Whether `op` is one of the arithmetic operators `+ - * / %`.
pub fn is_arithmetic(op: Operator) -> bool {
    matches!(
        op,
        Operator::Plus | Operator::Minus | Operator::Multiply | Operator::Divide | Operator::Modulo
    )
}

/// A value per node, stored by id.
#[derive(Debug)]
pub(crate) struct NodeMap<T>(Vec<Option<T>>);

impl<T> Default for NodeMap<T> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<T> NodeMap<T> {
    /// The value of node `id`, if set.
    pub(crate) fn get(&self, id: &NodeId) -> Option<&T> {
        self.0.get(*id).and_then(Option::as_ref)
    }

    /// Whether node `id` has a value.
    pub(crate) fn contains_key(&self, id: &NodeId) -> bool {
        self.get(id).is_some()
    }

    /// Sets the value of node `id`.
    pub(crate) fn insert(&mut self, id: NodeId, value: T) {
        if self.0.len() <= id {
            self.0.resize_with(id + 1, || None);
        }
        self.0[id] = Some(value);
    }
}

impl<T> std::ops::Index<&NodeId> for NodeMap<T> {
    type Output = T;

    fn index(&self, id: &NodeId) -> &T {
        self.get(id).expect("node has a value")
    }
}

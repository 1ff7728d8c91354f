//! A hash-consed DAG of expressions.
//!
//! Every node is an expression *shell* (the expression with its children
//! replaced by holes) plus the ids of its children. Equal subexpressions get
//! the same id, so a derivative that reuses parts of the forward expression
//! (or of itself) costs one node per distinct subexpression. Node ids are
//! created after their children, so ascending id order is a topological order,
//! and every walk here is a loop: no recursion, no stack overflow on deep input.

use std::hash::BuildHasher;
use std::sync::Arc;

use datafusion::common::hash_utils::RandomState;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{HashMap, ScalarValue};
use datafusion::error::Result;
use datafusion::logical_expr::{BinaryExpr, Expr, Operator};

/// Index of a node in a [`Graph`].
pub type NodeId = usize;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Node {
    shell: Arc<Expr>,
    args: Vec<NodeId>,
}

/// A hash-consed expression DAG.
#[derive(Debug, Default)]
pub struct Graph {
    nodes: Vec<Node>,
    /// The first node with a given hash; the others follow in `same_hash`.
    index: HashMap<u64, NodeId>,
    same_hash: Vec<Option<NodeId>>,
    hasher: RandomState,
    /// The shells of `-a` (key `None`) and of `a op b`, built once.
    operators: Vec<(Option<Operator>, Arc<Expr>)>,
}

/// The hole that stands for a child inside a shell.
pub(crate) fn hole() -> Expr {
    Expr::Literal(ScalarValue::Null, None)
}

/// Splits `expr` into its shell and its children, in `map_children` order.
fn split(expr: Expr) -> Result<(Expr, Vec<Expr>)> {
    let mut children = Vec::new();
    let shell = expr
        .map_children(|child| {
            children.push(child);
            Ok(Transformed::yes(hole()))
        })?
        .data;
    Ok((shell, children))
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
        &self.nodes[id].shell
    }

    /// The children of node `id`.
    pub fn args(&self, id: NodeId) -> &[NodeId] {
        &self.nodes[id].args
    }

    /// The value of node `id` if it is a Float64 literal.
    pub fn number(&self, id: NodeId) -> Option<f64> {
        match self.nodes[id].shell.as_ref() {
            Expr::Literal(ScalarValue::Float64(Some(v)), _) => Some(*v),
            _ => None,
        }
    }

    /// The node for `shell(args)`, created if new (no folding).
    pub fn add(&mut self, shell: Expr, args: Vec<NodeId>) -> NodeId {
        self.find_or_insert(&shell, &args, |shell| Arc::new(shell.clone()))
    }

    /// [`Graph::add`] for a shell that other nodes may share.
    fn add_shared(&mut self, shell: &Arc<Expr>, args: &[NodeId]) -> NodeId {
        self.find_or_insert(shell, args, |_| Arc::clone(shell))
    }

    /// The node for `shell(args)`; `own` makes the shell to store when it is new.
    fn find_or_insert(
        &mut self,
        shell: &Expr,
        args: &[NodeId],
        own: impl FnOnce(&Expr) -> Arc<Expr>,
    ) -> NodeId {
        let hash = self.hasher.hash_one((shell, args));
        let first = self.index.get(&hash).copied();
        let mut next = first;
        while let Some(id) = next {
            let node = &self.nodes[id];
            if node.args == args && *node.shell == *shell {
                return id;
            }
            next = self.same_hash[id];
        }
        let id = self.nodes.len();
        self.nodes.push(Node {
            shell: own(shell),
            args: args.to_vec(),
        });
        self.same_hash.push(first);
        self.index.insert(hash, id);
        id
    }

    /// The shell of `-a` (`op` `None`) or of `a op b`.
    fn operator(&mut self, op: Option<Operator>) -> Arc<Expr> {
        if let Some((_, shell)) = self.operators.iter().find(|(o, _)| *o == op) {
            return Arc::clone(shell);
        }
        let shell = Arc::new(match op {
            None => Expr::Negative(Box::new(hole())),
            Some(op) => Expr::BinaryExpr(BinaryExpr::new(Box::new(hole()), op, Box::new(hole()))),
        });
        self.operators.push((op, Arc::clone(&shell)));
        shell
    }

    /// A Float64 literal node.
    pub fn num(&mut self, v: f64) -> NodeId {
        self.add(Expr::Literal(ScalarValue::Float64(Some(v)), None), vec![])
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
        self.add_shared(&shell, &[a, b])
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
        self.add_shared(&shell, &[a])
    }

    /// Adds `expr` (without folding), aliases stripped; `leaf` may claim a
    /// subexpression as an existing node (used to substitute placeholders).
    pub fn intern(
        &mut self,
        expr: Expr,
        fold: bool,
        leaf: &mut dyn FnMut(&Expr) -> Result<Option<NodeId>>,
    ) -> Result<NodeId> {
        enum Step {
            Visit(Expr),
            Build(Expr, usize),
            /// `a op b` (`Some(op)`) or `-a` (`None`), the commonest shells.
            Operator(Option<Operator>),
        }
        let mut work = vec![Step::Visit(expr)];
        let mut done: Vec<NodeId> = Vec::new();
        while let Some(step) = work.pop() {
            match step {
                Step::Visit(Expr::Alias(alias)) => work.push(Step::Visit(*alias.expr)),
                Step::Visit(e) => {
                    if let Some(id) = leaf(&e)? {
                        done.push(id);
                        continue;
                    }
                    match e {
                        Expr::BinaryExpr(b) => {
                            work.push(Step::Operator(Some(b.op)));
                            work.push(Step::Visit(*b.right));
                            work.push(Step::Visit(*b.left));
                        }
                        Expr::Negative(a) => {
                            work.push(Step::Operator(None));
                            work.push(Step::Visit(*a));
                        }
                        e => {
                            let (shell, children) = split(e)?;
                            work.push(Step::Build(shell, children.len()));
                            work.extend(children.into_iter().rev().map(Step::Visit));
                        }
                    }
                }
                Step::Build(shell, n) => {
                    let args = done.split_off(done.len() - n);
                    let id = self.build(shell, args, fold);
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
                            let id = self.add_shared(&shell, &done[start..]);
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
    pub(crate) fn build(&mut self, shell: Expr, args: Vec<NodeId>, fold: bool) -> NodeId {
        match self.fold(&shell, &args, fold) {
            Some(id) => id,
            None => self.add(shell, args),
        }
    }

    /// Adds node `id` of `other` with `args` as its children, folding
    /// arithmetic and sharing `other`'s shell.
    pub(crate) fn copy_node(&mut self, other: &Graph, id: NodeId, args: &[NodeId]) -> NodeId {
        let shell = &other.nodes[id].shell;
        match self.fold(shell, args, true) {
            Some(id) => id,
            None => self.add_shared(shell, args),
        }
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
        let name_of = |id: NodeId| match self.nodes[id].shell.as_ref() {
            Expr::Literal(v, _) => v.try_as_str().flatten(),
            _ => None,
        };
        let is_call =
            |e: &Expr, name: &str| matches!(e, Expr::ScalarFunction(f) if f.func.name() == name);
        if !is_call(shell, "get_field") || args.len() != 2 {
            return None;
        }
        let key = name_of(args[1])?;
        let fields = &self.nodes[args[0]];
        if !is_call(&fields.shell, "named_struct") {
            return None;
        }
        fields
            .args
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
                    stack.extend(&self.nodes[id].args);
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
            let s = self.nodes[id]
                .args
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
                for &a in &self.nodes[id].args {
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
                    let node = &self.nodes[id];
                    let children = node.args.iter().map(|&a| take(&mut built, a)).collect();
                    fill(node.shell.as_ref().clone(), children)
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

//! A hash-consed DAG of expressions.
//!
//! Every node is an expression *shell* (the expression with its children
//! replaced by holes) plus the ids of its children. Equal subexpressions get
//! the same id, so a derivative that reuses parts of the forward expression
//! (or of itself) costs one node per distinct subexpression. Node ids are
//! created after their children, so ascending id order is a topological order,
//! and every walk here is a loop: no recursion, no stack overflow on deep input.

use std::collections::HashMap;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::ScalarValue;
use datafusion::error::Result;
use datafusion::logical_expr::{BinaryExpr, Expr, Operator};

/// Index of a node in a [`Graph`].
pub type NodeId = usize;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Node {
    shell: Expr,
    args: Vec<NodeId>,
}

/// A hash-consed expression DAG.
#[derive(Debug, Default)]
pub struct Graph {
    nodes: Vec<Node>,
    index: HashMap<Node, NodeId>,
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
        match &self.nodes[id].shell {
            Expr::Literal(ScalarValue::Float64(Some(v)), _) => Some(*v),
            _ => None,
        }
    }

    /// The node for `shell(args)`, created if new (no folding).
    pub fn add(&mut self, shell: Expr, args: Vec<NodeId>) -> NodeId {
        let node = Node { shell, args };
        if let Some(&id) = self.index.get(&node) {
            return id;
        }
        let id = self.nodes.len();
        self.nodes.push(node.clone());
        self.index.insert(node, id);
        id
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
        let shell = Expr::BinaryExpr(BinaryExpr::new(Box::new(hole()), op, Box::new(hole())));
        self.add(shell, vec![a, b])
    }

    /// `-a`, folding literals and double negation.
    pub fn neg(&mut self, a: NodeId) -> NodeId {
        if let Some(x) = self.number(a) {
            return self.num(-x);
        }
        if matches!(self.shell(a), Expr::Negative(_)) {
            return self.args(a)[0];
        }
        self.add(Expr::Negative(Box::new(hole())), vec![a])
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
                    let (shell, children) = split(e)?;
                    work.push(Step::Build(shell, children.len()));
                    work.extend(children.into_iter().rev().map(Step::Visit));
                }
                Step::Build(shell, n) => {
                    let args = done.split_off(done.len() - n);
                    let id = match (&shell, fold) {
                        (Expr::BinaryExpr(b), true) if is_arithmetic(b.op) => {
                            self.binary(b.op, args[0], args[1])
                        }
                        (Expr::Negative(_), true) => self.neg(args[0]),
                        _ => match self.struct_field(&shell, &args) {
                            Some(id) => id,
                            None => self.add(shell, args),
                        },
                    };
                    done.push(id);
                }
            }
        }
        Ok(done.pop().expect("one root"))
    }

    /// The value node of `get_field(named_struct(…, 'name', value, …), 'name')`
    /// (how a nested `grad(f, x, y)['x']` refers to one partial).
    fn struct_field(&self, shell: &Expr, args: &[NodeId]) -> Option<NodeId> {
        let name_of = |id: NodeId| match &self.nodes[id].shell {
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
        let mut seen = std::collections::HashSet::new();
        let mut stack: Vec<NodeId> = roots.to_vec();
        while let Some(id) = stack.pop() {
            if seen.insert(id) && !stop(id) {
                stack.extend(&self.nodes[id].args);
            }
        }
        let mut order: Vec<NodeId> = seen.into_iter().collect();
        order.sort_unstable();
        order
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
                    fill(node.shell.clone(), children)
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

//! Guards: the conditions under which a path of a derivative is taken, each
//! emitted once.
//!
//! A guard is a boolean node used only as a `CASE` condition, so NULL counts
//! as false. It is a conjunction of *atoms* (a selection's condition: `f`'s
//! own `CASE` condition, or `p IS NOT NULL` for a selecting partial `p`),
//! written as a chain that tests each atom only where the ones before it hold:
//!
//! ```sql
//! CASE WHEN (CASE WHEN a1 THEN a2 ELSE false END) THEN a3 ELSE false END
//! ```
//!
//! so an atom that may raise an error off its branch (it reads `f`'s `sqrt`
//! inside a `CASE` branch) is only evaluated where `f` evaluates it. A sum of
//! guarded flows is guarded by the disjunction `g1 OR g2` of their guards.
//!
//! Guards are recognised by their shape, also in an expression that is itself
//! a derivative (a nested `grad`): there, a path through `CASE WHEN g THEN t
//! ELSE 0 END` (an earlier derivative's guarded term) selects `t` under the
//! atom `(CASE WHEN g THEN 1 END) IS NOT NULL`, which is `g` itself. So each
//! atom enters a guard once, a guard implied by an enclosing one is dropped
//! ([`Workspace::guard_and`]), and `CASE WHEN g THEN (CASE WHEN h THEN e …)`
//! with `g` implying `h` is written `CASE WHEN g THEN e`
//! ([`Workspace::case_when`]): no condition is tested again under itself.

use datafusion::common::ScalarValue;
use datafusion::logical_expr::{Expr, Operator};

use super::graph::{self, NodeId};
use super::workspace::Workspace;

/// What a condition node is, as a guard.
enum Shape {
    /// The literal `true`: no condition.
    True,
    /// `CASE WHEN a THEN b ELSE false END`: `a` and `b`, `b` tested only where `a` holds.
    And(NodeId, NodeId),
    /// `a OR b`.
    Or(NodeId, NodeId),
    /// Any other condition: an atom.
    Atom,
}

impl Workspace<'_> {
    /// The shape of the condition node `c`. `(CASE WHEN c THEN v END) IS
    /// NOT NULL` for a non-NULL literal `v` (a unit selection's test) is
    /// read as `c`.
    fn guard_shape(&self, c: NodeId) -> Shape {
        let c = self.unit_condition(c).unwrap_or(c);
        let args = self.g.args(c);
        match self.g.shell(c) {
            Expr::Literal(ScalarValue::Boolean(Some(true)), _) => Shape::True,
            Expr::Case(case)
                if case.expr.is_none()
                    && case.when_then_expr.len() == 1
                    && case.else_expr.is_some()
                    && self.g.shell(args[2]) == &false_literal() =>
            {
                Shape::And(args[0], args[1])
            }
            Expr::BinaryExpr(b) if b.op == Operator::Or => Shape::Or(args[0], args[1]),
            _ => Shape::Atom,
        }
    }

    /// `c` when node `test` is `(CASE WHEN c THEN v [ELSE NULL] END) IS NOT
    /// NULL` with `v` a non-NULL literal: true exactly where `c` is.
    fn unit_condition(&self, test: NodeId) -> Option<NodeId> {
        match self.g.shell(test) {
            Expr::IsNotNull(_) => self.single_branch(self.g.args(test)[0]),
            _ => None,
        }
    }

    /// `c` when node `p` is `CASE WHEN c THEN v [ELSE NULL] END` with `v` a
    /// non-NULL literal.
    fn single_branch(&self, p: NodeId) -> Option<NodeId> {
        let Expr::Case(case) = self.g.shell(p) else {
            return None;
        };
        let args = self.g.args(p);
        let is_null = |id: NodeId| matches!(self.g.shell(id), Expr::Literal(v, _) if v.is_null());
        let single = case.expr.is_none()
            && case.when_then_expr.len() == 1
            && matches!(self.g.shell(args[1]), Expr::Literal(v, _) if !v.is_null())
            && (case.else_expr.is_none() || is_null(args[2]));
        single.then_some(args[0])
    }

    /// The atoms of the condition `c`, in the order they are tested.
    // pub for the tests in tests/unit/engine_guard.rs
    #[doc(hidden)]
    pub fn atoms(&self, c: NodeId) -> Vec<NodeId> {
        let mut out = Vec::new();
        let mut stack = vec![c];
        while let Some(c) = stack.pop() {
            match self.guard_shape(c) {
                Shape::True => {}
                Shape::And(a, b) => stack.extend([b, a]),
                Shape::Or(..) | Shape::Atom => out.push(self.unit_condition(c).unwrap_or(c)),
            }
        }
        out
    }

    /// Whether the condition `c` holds wherever every atom of `known` does.
    // pub for the tests in tests/unit/engine_guard.rs
    #[doc(hidden)]
    pub fn implies(&self, known: &[NodeId], c: NodeId) -> bool {
        self.atoms(c)
            .into_iter()
            .all(|a| self.atom_implied(known, a))
    }

    /// Whether the atom `a` holds wherever every atom of `known` does: it is
    /// one of them, or a disjunction with a side that is implied.
    fn atom_implied(&self, known: &[NodeId], a: NodeId) -> bool {
        known.contains(&a)
            || match self.guard_shape(a) {
                Shape::Or(l, r) => self.implies(known, l) || self.implies(known, r),
                _ => false,
            }
    }

    /// The guard `guard AND c`: `c`'s atoms that `guard` does not imply,
    /// tested after `guard`'s, in `c`'s order; `c` when there is no guard.
    // pub for the tests in tests/unit/engine_guard.rs
    #[doc(hidden)]
    pub fn guard_and(&mut self, guard: Option<NodeId>, c: NodeId) -> NodeId {
        let mut known = guard.map(|g| self.atoms(g)).unwrap_or_default();
        let mut acc = guard;
        for a in self.atoms(c) {
            if self.atom_implied(&known, a) {
                continue;
            }
            acc = Some(match acc {
                None => a,
                Some(g) => {
                    let no = self.g.add(false_literal(), &[]);
                    self.case_when(g, a, Some(no))
                }
            });
            known.push(a);
        }
        acc.unwrap_or_else(|| self.g.add(lit_bool(true), &[]))
    }

    /// The disjunction of `guards`, leaving out each one that implies
    /// another (a sum's guard).
    // pub for the tests in tests/unit/engine_guard.rs
    #[doc(hidden)]
    pub fn guard_or(&mut self, guards: &[NodeId]) -> NodeId {
        let atoms: Vec<Vec<NodeId>> = guards.iter().map(|&g| self.atoms(g)).collect();
        let mut kept: Vec<NodeId> = Vec::with_capacity(guards.len());
        for (i, &g) in guards.iter().enumerate() {
            let redundant = guards.iter().enumerate().any(|(j, &h)| {
                j != i
                    && self.implies(&atoms[i], h)
                    // of two equivalent guards, the first stays
                    && (j < i || !self.implies(&atoms[j], g))
            });
            if !redundant && !kept.contains(&g) {
                kept.push(g);
            }
        }
        kept.into_iter()
            .reduce(|a, b| self.g.binary(Operator::Or, a, b))
            .expect("at least one guard")
    }

    /// The atom that node `p`, a selecting partial, is not NULL: the
    /// condition `c` of a single-branch `CASE WHEN c THEN v END`, else
    /// `p IS NOT NULL`.
    // pub for the tests in tests/unit/engine_guard.rs
    #[doc(hidden)]
    pub fn selected(&mut self, p: NodeId) -> NodeId {
        match self.single_branch(p) {
            Some(c) => c,
            None => self.g.add(Expr::IsNotNull(Box::new(graph::hole())), &[p]),
        }
    }

    /// Whether node `p`, a selecting partial, is 1 wherever it is not NULL
    /// (a `CASE` whose every result is `1.0` or NULL): a flow through it
    /// needs no product, only the narrower guard.
    // pub for the tests in tests/unit/engine_guard.rs
    #[doc(hidden)]
    pub fn is_unit_selection(&self, p: NodeId) -> bool {
        let shell = self.g.shell(p);
        let Expr::Case(_) = shell else {
            return false;
        };
        self.g
            .args(p)
            .iter()
            .enumerate()
            .filter(|&(i, _)| super::primitive::differentiated(shell, i))
            .all(|(_, &a)| match self.g.shell(a) {
                Expr::Literal(ScalarValue::Float64(Some(v)), _) => *v == 1.0,
                Expr::Literal(v, _) => v.is_null(),
                _ => false,
            })
    }

    /// `then` for use under the condition `cond`: the `THEN` branch of each
    /// `CASE` at its top whose condition `cond` implies.
    pub(crate) fn under(&self, cond: NodeId, mut then: NodeId) -> NodeId {
        let known = self.atoms(cond);
        loop {
            let Expr::Case(case) = self.g.shell(then) else {
                return then;
            };
            let args = self.g.args(then);
            if case.expr.is_some() || !self.implies(&known, args[0]) {
                return then;
            }
            then = args[1];
        }
    }
}

fn lit_bool(v: bool) -> Expr {
    Expr::Literal(ScalarValue::Boolean(Some(v)), None)
}

fn false_literal() -> Expr {
    lit_bool(false)
}

//! Chains: a contraction whose probe rows are themselves an inner join,
//! summed without building that join's rows either.
//!
//! A matrix factorization's prediction,
//!
//! ```sql
//! SELECT r.i, r.j, sum(u.val * v.val)
//! FROM r JOIN u ON u.i = r.i JOIN v ON v.j = r.j AND v.k = u.k
//! GROUP BY r.i, r.j
//! ```
//!
//! is planned as `v ⋈ (u ⋈ r)`: a contraction of two inputs would list
//! `v` (the build side) and stream the R·K rows of `u ⋈ r`. A chain lists
//! `u` too (the *near* side, by the inner join's keys) and streams `r`
//! itself: for each rating, the entries of `u` under its user and those of
//! `v` under its item are each listed in the order of their *link* (here
//! `k`, numbered once for both sides), and a merge of the two lists finds
//! the pairs whose links are equal — a row-wise dot product, K steps per
//! rating instead of K joined rows (where both lists are one entry per
//! link, in order, nothing is NULL and the build side gives no group
//! column, a plain dot product of the two rows of factors).
//!
//! A chain is taken where the probe side of a contraction of two inputs is
//! (through projections and round-robin repartitions) an inner hash join
//! without a filter whose inputs split the contraction's probe
//! expressions: every key the build side compares reads either the near
//! side (a link) or the inner probe side (at least one of each), every
//! group column is the inner probe side's, and every factor of a product
//! is one side's (or none). Each join keeps its NULL rule (a NULL key or
//! link matches nothing, or under `IS NOT DISTINCT FROM` the NULLs of its
//! own join). Otherwise the contraction keeps its two inputs.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode, TreeNodeRecursion};
use datafusion::common::JoinType;
use datafusion::error::Result;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::utils::collect_columns;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, Partitioning};

use super::groups::Groups;
use super::numbering::{self, Nulls, NONE};
use super::{
    at_join, beneath, dealt, dot, nulls, plain_inner, split_product, substitute, unprojected,
    unrepartitioned, Build, ContractionExec, Numbered, Part, Spec,
};
use crate::exec::serves;

/// A chain's near side and how it meets the other two (see the [module
/// docs](self)).
#[derive(Debug, Clone)]
pub(super) struct Near {
    /// The near side's keys of the inner join and its factors (it gives
    /// no group column).
    pub(super) part: Part,
    /// The probe side's keys of the inner join.
    pub(super) probe_keys: Vec<Arc<dyn PhysicalExpr>>,
    /// The inner join's NULL rule.
    pub(super) nulls: Nulls,
    /// The near side's expressions the build side compares …
    pub(super) links: Vec<Arc<dyn PhysicalExpr>>,
    /// … and the build side's expressions compared with them.
    pub(super) build_links: Vec<Arc<dyn PhysicalExpr>>,
}

/// `pair` (a contraction of two inputs) as a chain, where its probe side
/// is a join a chain can take, its output partitioned as `wanted` (the
/// partitioning of the aggregate it replaces, which what is above may rely
/// on).
pub(super) fn chained(
    pair: &ContractionExec,
    wanted: &Partitioning,
) -> Result<Option<ContractionExec>> {
    match linked(pair, wanted)? {
        Some(chain) => Ok(Some(chain)),
        None => turned(pair, wanted),
    }
}

/// `pair` as a chain with its inner join's inputs swapped (the rows to
/// stream are those DataFusion collects), where that is one.
fn turned(pair: &ContractionExec, wanted: &Partitioning) -> Result<Option<ContractionExec>> {
    // Only the join right below (a shared subplan, say, is not rebuilt).
    if join_below(&pair.right).is_none() {
        return Ok(None);
    }
    let mut swapped = false;
    let right = Arc::clone(&pair.right)
        .transform_down(|node| {
            let Some(join) = node.downcast_ref::<HashJoinExec>() else {
                return Ok(Transformed::no(node));
            };
            // Without its dynamic filter (which may not be swapped).
            let fresh = join.builder().reset_state().build()?;
            swapped = true;
            let turned = fresh.swap_inputs(PartitionMode::CollectLeft)?;
            Ok(Transformed::new(turned, true, TreeNodeRecursion::Jump))
        })
        .data()?;
    if !swapped {
        return Ok(None);
    }
    let plan = at_join::<HashJoinExec>(
        Arc::clone(&pair.spec.replaced),
        Arc::clone(&pair.left),
        right,
    )?;
    match ContractionExec::pair(&plan)? {
        Some(turned) => linked(&turned, wanted),
        None => Ok(None),
    }
}

/// `pair` as a chain of its inner join's inputs as they are.
fn linked(pair: &ContractionExec, wanted: &Partitioning) -> Result<Option<ContractionExec>> {
    let spec = &pair.spec;
    if spec.near.is_some() {
        return Ok(None);
    }
    // The probe side's expressions, followed down to the inner join.
    let Some((join, projections)) = join_below(&pair.right) else {
        return Ok(None);
    };
    if !plain_inner(join) {
        return Ok(None);
    }
    let mut probe = spec.probe.clone();
    for projection in projections {
        probe = probe.map(|e| beneath(projection, e))?;
    }
    probe = probe.map(|e| unprojected(join, e))?;
    let (near, below) = (join.left(), join.right());
    let (near_schema, below_schema) = (near.schema(), below.schema());
    let keys_supported = join.on().iter().all(|(n, p)| {
        let types = (n.data_type(&near_schema), p.data_type(&below_schema));
        matches!(types, (Ok(a), Ok(b)) if a == b && numbering::supported(&a))
    });
    if !keys_supported {
        return Ok(None);
    }
    // Each of the probe side's expressions on one side of the inner join.
    let width = near_schema.fields().len();
    let side = |e: &Arc<dyn PhysicalExpr>| {
        let columns = collect_columns(e);
        match (
            columns.iter().all(|c| c.index() < width),
            columns.iter().all(|c| c.index() >= width),
        ) {
            (_, true) => Some(false),
            (true, false) => Some(true),
            (false, false) => None,
        }
    };
    let lower = |e: Arc<dyn PhysicalExpr>| substitute(e, |c| local(c, width));
    let (mut far, mut build_far, mut links, mut build_links) = (vec![], vec![], vec![], vec![]);
    for (b, p) in spec.build.keys.iter().zip(&probe.keys) {
        match side(p) {
            Some(true) => {
                links.push(Arc::clone(p));
                build_links.push(Arc::clone(b));
            }
            Some(false) => {
                far.push(lower(Arc::clone(p))?);
                build_far.push(Arc::clone(b));
            }
            None => return Ok(None),
        }
    }
    if far.is_empty() || links.is_empty() {
        return Ok(None);
    }
    let mut groups = vec![];
    for g in &probe.groups {
        match (g.downcast_ref::<Column>(), side(g)) {
            (Some(_), Some(false)) => groups.push(lower(Arc::clone(g))?),
            _ => return Ok(None),
        }
    }
    let join_schema = Arc::clone(join.join_schema());
    let (mut near_factors, mut probe_factors) = (vec![], vec![]);
    for f in &probe.factors {
        let (n, p) = match f {
            Some(f) => match split_product(f, &join_schema, width)? {
                Some(split) => split,
                None => return Ok(None),
            },
            None => (None, None),
        };
        near_factors.push(n);
        probe_factors.push(p);
    }
    // The plan replaced: the inner join collecting its near side, its
    // probe rows in the partitions of the contraction's (hashed as they
    // were where the join was partitioned: what is above may rely on it).
    let partitions = wanted.partition_count();
    let near_input = unrepartitioned(near);
    let near_input = match near_input.output_partitioning().partition_count() {
        1 => near_input,
        _ => Arc::new(CoalescePartitionsExec::new(near_input)),
    };
    let probe_input = match join.partition_mode() {
        PartitionMode::Partitioned => Arc::clone(below),
        _ => unrepartitioned(below),
    };
    let probe_input = match probe_input.output_partitioning().partition_count() == partitions {
        true => probe_input,
        false => Arc::new(RepartitionExec::try_new(
            probe_input,
            Partitioning::RoundRobinBatch(partitions),
        )?) as Arc<dyn ExecutionPlan>,
    };
    let right = Arc::clone(&pair.right)
        .transform_down(|mut node| {
            let mut removed = false;
            while let Some(deal) = dealt(&node) {
                (node, removed) = (Arc::clone(deal.input()), true);
            }
            let Some(join) = node.downcast_ref::<HashJoinExec>() else {
                return Ok(Transformed::new_transformed(node, removed));
            };
            let join = join
                .builder()
                .with_partition_mode(PartitionMode::CollectLeft)
                .with_new_children(vec![Arc::clone(&near_input), Arc::clone(&probe_input)])?
                .recompute_properties()
                .build_exec()?;
            Ok(Transformed::new(join, true, TreeNodeRecursion::Jump))
        })
        .data()?;
    let replaced = at_join::<HashJoinExec>(
        Arc::clone(&spec.replaced),
        Arc::clone(&pair.left),
        Arc::clone(&right),
    )?;
    if !serves(replaced.output_partitioning(), wanted) {
        return Ok(None);
    }
    let Some(aggregate) = replaced.downcast_ref::<AggregateExec>() else {
        return Ok(None);
    };
    let chain = Near {
        part: Part {
            keys: join.on().iter().map(|(n, _)| Arc::clone(n)).collect(),
            groups: vec![],
            factors: near_factors,
        },
        probe_keys: join.on().iter().map(|(_, p)| Arc::clone(p)).collect(),
        nulls: nulls(join.null_equality()),
        links,
        build_links,
    };
    let spec = Spec {
        replaced: Arc::clone(&replaced),
        build: Part {
            keys: build_far,
            groups: spec.build.groups.clone(),
            factors: spec.build.factors.clone(),
        },
        probe: Part {
            keys: far,
            groups,
            factors: probe_factors,
        },
        group_order: spec.group_order.clone(),
        nulls: spec.nulls,
        schema: Arc::clone(&spec.schema),
        near: Some(chain),
        merged: None,
    };
    Ok(Some(ContractionExec::new(
        Arc::new(spec),
        Arc::clone(&pair.left),
        Some(near_input),
        probe_input,
        Arc::clone(aggregate.properties()),
    )))
}

/// `pair` with its join's inputs swapped, where its build side is an inner
/// join and its probe side is not: as a chain where it makes one (a
/// chain's probe rows are those of the join's probe side, whatever their
/// number), else as a pair that lists the other side and streams the
/// join's rows. DataFusion collects the side it estimates smaller and has
/// no estimate of a join's rows; a join's rows grow with its inputs (a
/// factorization's ratings with their adjoints, against an item's
/// factors).
pub(super) fn swapped(pair: &ContractionExec) -> Result<Option<ContractionExec>> {
    if pair.spec.near.is_some() || joined(&pair.right) || !joined(&pair.left) {
        return Ok(None);
    }
    let plan = Arc::clone(&pair.spec.replaced)
        .transform_down(|node| {
            let Some(join) = node.downcast_ref::<HashJoinExec>() else {
                return Ok(Transformed::no(node));
            };
            let mut build = unrepartitioned(join.left());
            while let Some(c) = build.downcast_ref::<CoalescePartitionsExec>() {
                build = unrepartitioned(c.input());
            }
            let probe = unrepartitioned(join.right());
            let probe = match probe.output_partitioning().partition_count() {
                1 => probe,
                _ => Arc::new(CoalescePartitionsExec::new(probe)),
            };
            // Without its dynamic filter (which may not be swapped, and
            // would be fed by nothing).
            let fresh = join
                .builder()
                .reset_state()
                .with_new_children(vec![build, probe])?
                .build()?;
            let swapped = fresh.swap_inputs(PartitionMode::CollectLeft)?;
            Ok(Transformed::new(swapped, true, TreeNodeRecursion::Jump))
        })
        .data()?;
    match ContractionExec::pair(&plan)? {
        Some(turned) => Ok(Some(
            chained(&turned, &pair.properties.partitioning)?.unwrap_or(turned),
        )),
        None => Ok(None),
    }
}

/// The hash join below `plan` through projections and round-robin
/// repartitions, and those projections from the top.
fn join_below(plan: &Arc<dyn ExecutionPlan>) -> Option<(&HashJoinExec, Vec<&ProjectionExec>)> {
    let (mut input, mut projections) = (plan, vec![]);
    loop {
        if let Some(projection) = input.downcast_ref::<ProjectionExec>() {
            projections.push(projection);
            input = projection.input();
        } else if let Some(deal) = dealt(input) {
            input = deal.input();
        } else {
            return Some((input.downcast_ref::<HashJoinExec>()?, projections));
        }
    }
}

/// Whether `plan` is an inner hash join (through projections,
/// repartitions and a merge of partitions).
fn joined(plan: &Arc<dyn ExecutionPlan>) -> bool {
    let mut plan = unrepartitioned(plan);
    loop {
        if let Some(c) = plan.downcast_ref::<CoalescePartitionsExec>() {
            plan = unrepartitioned(c.input());
        } else if let Some(p) = plan.downcast_ref::<ProjectionExec>() {
            plan = unrepartitioned(p.input());
        } else {
            break;
        }
    }
    plan.downcast_ref::<HashJoinExec>()
        .is_some_and(|j| *j.join_type() == JoinType::Inner)
}

/// Column `c` of the inner join's output in its probe side's rows (the
/// near side's `width` columns come first).
fn local(c: &Column, width: usize) -> Arc<dyn PhysicalExpr> {
    Arc::new(Column::new(c.name(), c.index() - width))
}

/// Adds the products of `rows` (their key numbers on the near side
/// `near_keys`) with the pairs of `near`'s and `build`'s entries under
/// their keys whose links are equal: a merge of the two lists, each in
/// the order of its links, or where one list is much the shorter, a
/// binary search of the other for each of its links.
pub(super) fn add(
    rows: &Numbered,
    near_keys: &[u32],
    build: &Build,
    near: &Build,
    groups: &mut Groups,
) {
    let aggregates = rows.side.factors.len();
    let checked = rows.checked(build) || rows.checked(near);
    // Where the build side gives no group column, a row's products all go
    // to its own group: summed here first (`sums`, and whether a non-NULL
    // product reached each), added once.
    let one_group = build.groups.is_none();
    let (mut sums, mut reached) = (vec![0.0; aggregates], vec![false; aggregates]);
    for (row, &n) in near_keys.iter().enumerate().take(rows.side.rows) {
        let b = rows.keys[row];
        if b == NONE || n == NONE {
            continue;
        }
        let (mut i, near_end) = (near.starts[n as usize], near.starts[n as usize + 1]);
        let (mut j, build_end) = (build.starts[b as usize], build.starts[b as usize + 1]);
        let probe_group = rows.groups[row];
        if one_group && !checked && near.dense[n as usize] && build.dense[b as usize] {
            // Both lists one entry per link, in order: the pairs are
            // side by side, a dot product per aggregate.
            let links = near_end - i;
            let place = groups.place(probe_group, 0);
            for a in 0..aggregates {
                let at = |start: usize| (start..start + links).map(move |e| e * aggregates + a);
                let sum = match aggregates {
                    1 => dot(&near.factor[i..i + links], &build.factor[j..j + links]),
                    _ => (at(i).zip(at(j)))
                        .map(|(x, y)| near.factor[x] * build.factor[y])
                        .sum(),
                };
                groups.add(place, a, rows.factor(row, a).unwrap_or_default() * sum);
            }
            continue;
        }
        let mut matched = false;
        let mut pair = |i: usize, j: usize| {
            matched = true;
            let place = (!one_group).then(|| groups.place(probe_group, build.group[j]));
            for a in 0..aggregates {
                let product = match checked {
                    false => {
                        let p = rows.factor(row, a).unwrap_or_default();
                        p * near.factor[i * aggregates + a] * build.factor[j * aggregates + a]
                    }
                    true => match (
                        rows.factor(row, a),
                        near.factor(i, a, aggregates),
                        build.factor(j, a, aggregates),
                    ) {
                        (Some(p), Some(x), Some(y)) => p * x * y,
                        _ => continue,
                    },
                };
                match place {
                    Some(place) => groups.add(place, a, product),
                    None => {
                        sums[a] += product;
                        reached[a] = true;
                    }
                }
            }
        };
        let (near_len, build_len) = (near_end - i, build_end - j);
        let searched = near_len.min(build_len) * 16 < near_len.max(build_len);
        while i < near_end && j < build_end {
            let (x, y) = (near.link[i], build.link[j]);
            if x != y {
                // Past the smaller link: one step, or a search in the long list.
                if x < y {
                    i = match searched && near_len > build_len {
                        true => i + near.link[i..near_end].partition_point(|&l| l < y),
                        false => i + 1,
                    };
                } else {
                    j = match searched && build_len > near_len {
                        true => j + build.link[j..build_end].partition_point(|&l| l < x),
                        false => j + 1,
                    };
                }
                continue;
            }
            let (mut i_end, mut j_end) = (i + 1, j + 1);
            while i_end < near_end && near.link[i_end] == x {
                i_end += 1;
            }
            while j_end < build_end && build.link[j_end] == x {
                j_end += 1;
            }
            for i in i..i_end {
                for j in j..j_end {
                    pair(i, j);
                }
            }
            (i, j) = (i_end, j_end);
        }
        if one_group && matched {
            // The group exists (a joined row does) even where every product
            // was NULL.
            let place = groups.place(probe_group, 0);
            for a in 0..aggregates {
                if reached[a] {
                    groups.add(place, a, sums[a]);
                }
                (sums[a], reached[a]) = (0.0, false);
            }
        }
    }
}

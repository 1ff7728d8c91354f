//! Reverse mode through a recursive query's iterations, executed
//! ([`crate::plan::adjoint_loop`]): [`AdjointLoopExec`] replays each row's
//! iterations forwards from its first row, then backwards through the
//! step's vector-Jacobian product, keeping every `checkpoint_every`-th
//! state.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{
    new_null_array, Array, ArrayRef, AsArray, FixedSizeListArray, Float64Array, RecordBatch,
    UInt32Array,
};
use datafusion::arrow::compute::{cast, interleave, take};
use datafusion::arrow::datatypes::{DataType, Float64Type, Int64Type, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
    SendableRecordBatchStream,
};
use futures::StreamExt;

use super::kit;
use crate::options::GradOptions;

/// The properties of an [`AdjointLoopExec`] over `input`: its partitions,
/// unordered.
pub(crate) fn properties(
    schema: &SchemaRef,
    input: &Arc<dyn ExecutionPlan>,
) -> Arc<PlanProperties> {
    Arc::new(PlanProperties::new(
        EquivalenceProperties::new(Arc::clone(schema)),
        input.output_partitioning().clone(),
        EmissionType::Incremental,
        Boundedness::Bounded,
    ))
}

/// Where one derivative's seeds are in the input, and which cotangents of
/// the first row sum to it.
#[derive(Debug, Clone)]
pub(crate) struct Seeds {
    pub(crate) seeds: Vec<Option<usize>>,
    pub(crate) copies: Vec<usize>,
}

/// Executes an [`AdjointLoop`](crate::plan::adjoint_loop::AdjointLoop): see the [module docs](self).
#[derive(Debug)]
pub struct AdjointLoopExec {
    pub(crate) input: Arc<dyn ExecutionPlan>,
    pub(crate) schema: SchemaRef,
    pub(crate) name: String,
    pub(crate) replay: Arc<Replay>,
    /// Input columns: the iteration, the first row's columns.
    pub(crate) iteration: usize,
    pub(crate) initial: Vec<usize>,
    pub(crate) wanted: Vec<Seeds>,
    pub(crate) properties: Arc<PlanProperties>,
}

impl DisplayAs for AdjointLoopExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "AdjointLoopExec: through={}, derivatives={}",
            self.name,
            self.wanted.len()
        )
    }
}

impl AdjointLoopExec {
    /// The same replay over `input`.
    fn with_input(&self, input: Arc<dyn ExecutionPlan>) -> Result<Self> {
        Ok(Self {
            properties: properties(&self.schema, &input),
            input,
            schema: Arc::clone(&self.schema),
            name: self.name.clone(),
            replay: Arc::clone(&self.replay),
            iteration: self.iteration,
            initial: self.initial.clone(),
            wanted: self.wanted.clone(),
        })
    }
}

impl ExecutionPlan for AdjointLoopExec {
    kit::one_input!("AdjointLoopExec");
    kit::own_properties!();

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        for e in self.replay.updates.iter().chain(&self.replay.adjoints) {
            if f(e)? == TreeNodeRecursion::Stop {
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let every = context
            .session_config()
            .options()
            .extensions
            .get::<GradOptions>()
            .map_or(0, |o| o.checkpoint_every) as usize;
        let replay = Arc::clone(&self.replay);
        let (iteration, initial, wanted) =
            (self.iteration, self.initial.clone(), self.wanted.clone());
        let schema = Arc::clone(&self.schema);
        let out = Arc::clone(&schema);
        let stream = self.input.execute(partition, context)?.map(move |batch| {
            let batch = batch?;
            let mut columns = batch.columns().to_vec();
            let types: Vec<&DataType> = out.fields()[batch.num_columns()..]
                .iter()
                .map(|f| f.data_type())
                .collect();
            columns
                .extend(replay.derivatives(&batch, iteration, &initial, &wanted, &types, every)?);
            Ok(RecordBatch::try_new(Arc::clone(&out), columns)?)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

/// A loop's step and its vector-Jacobian product, as physical
/// expressions: what replaying the loop needs, apart from the rows.
#[derive(Debug)]
pub(crate) struct Replay {
    pub(crate) state: SchemaRef,
    pub(crate) updates: Vec<Arc<dyn PhysicalExpr>>,
    pub(crate) differentiable: Vec<usize>,
    pub(crate) adjoint_schema: SchemaRef,
    pub(crate) adjoints: Vec<Arc<dyn PhysicalExpr>>,
}

impl Replay {
    /// The derivatives `wanted` (of types `types`) for every row of
    /// `batch`, keeping every `every`-th state of a replay (0: about every
    /// √T-th). Rows with the same iteration count are replayed together,
    /// once for all the derivatives.
    fn derivatives(
        &self,
        batch: &RecordBatch,
        iteration: usize,
        initial: &[usize],
        wanted: &[Seeds],
        types: &[&DataType],
        every: usize,
    ) -> Result<Vec<ArrayRef>> {
        let n = batch.num_rows();
        let iterations = batch.column(iteration).as_primitive::<Int64Type>();
        let mut groups: HashMap<i64, Vec<u32>> = HashMap::new();
        for row in 0..n {
            if iterations.is_valid(row) {
                groups
                    .entry(iterations.value(row))
                    .or_default()
                    .push(row as u32);
            }
        }
        // Per derivative, its value for each group (after a NULL for the
        // rows of no iteration), and where each row's value is.
        let mut parts: Vec<Vec<ArrayRef>> =
            types.iter().map(|t| vec![new_null_array(t, 1)]).collect();
        let mut place = vec![(0usize, 0usize); n];
        for (g, (count, rows)) in groups.into_iter().enumerate() {
            let take_rows = UInt32Array::from(rows.clone());
            let taken =
                |i: usize, t: &DataType| conform(&take(batch.column(i), &take_rows, None)?, t);
            let first = RecordBatch::try_new(
                Arc::clone(&self.state),
                initial
                    .iter()
                    .zip(self.state.fields())
                    .map(|(&i, f)| taken(i, f.data_type()))
                    .collect::<Result<_>>()?,
            )?;
            let seeds = wanted
                .iter()
                .map(|w| {
                    w.seeds
                        .iter()
                        .zip(&self.differentiable)
                        .map(|(s, &c)| {
                            let t = self.state.field(c).data_type();
                            match s {
                                Some(i) => taken(*i, t),
                                None => zeros(t, rows.len()),
                            }
                        })
                        .collect::<Result<Vec<_>>>()
                })
                .collect::<Result<Vec<_>>>()?;
            let cotangents = self.backwards(first, seeds, count.max(0) as usize, every)?;
            for ((w, t), (cotangents, parts)) in wanted
                .iter()
                .zip(types)
                .zip(cotangents.iter().zip(&mut parts))
            {
                let mut sum: Option<ArrayRef> = None;
                for &i in &w.copies {
                    let c = conform(&cotangents[i], t)?;
                    sum = Some(match sum {
                        Some(s) => add(&s, &c)?,
                        None => c,
                    });
                }
                parts.push(match sum {
                    Some(s) => s,
                    None => zeros(t, rows.len())?,
                });
            }
            for (j, &row) in rows.iter().enumerate() {
                place[row as usize] = (g + 1, j);
            }
        }
        parts
            .iter()
            .map(|parts| {
                let parts: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
                Ok(interleave(&parts, &place)?)
            })
            .collect()
    }

    /// The cotangents of the first row's differentiable columns, for each
    /// derivative, given those of the row `count` iterations later
    /// (`seeds`): one replay for all of them.
    fn backwards(
        &self,
        first: RecordBatch,
        seeds: Vec<Vec<ArrayRef>>,
        count: usize,
        every: usize,
    ) -> Result<Vec<Vec<ArrayRef>>> {
        let every = match every {
            0 => ((count as f64).sqrt().ceil() as usize).max(1),
            k => k,
        };
        // Forwards, keeping every `every`-th state (not the last's: the seeds
        // stand for it).
        let mut kept = Vec::new();
        let mut state = first;
        for i in 0..count {
            if i % every == 0 {
                kept.push(state.clone());
            }
            if i + 1 < count {
                state = self.step(&state)?;
            }
        }
        // Backwards, one stretch between kept states at a time.
        let mut cotangents = seeds;
        for (s, start) in kept.into_iter().enumerate().rev() {
            let len = every.min(count - s * every);
            let mut states = vec![start];
            for _ in 1..len {
                states.push(self.step(states.last().expect("a state"))?);
            }
            for state in states.iter().rev() {
                for c in cotangents.iter_mut() {
                    *c = self.pullback(state, c)?;
                }
            }
        }
        Ok(cotangents)
    }

    /// The next iteration's row of each row of `state`.
    fn step(&self, state: &RecordBatch) -> Result<RecordBatch> {
        let n = state.num_rows();
        let columns = self
            .updates
            .iter()
            .zip(self.state.fields())
            .map(|(u, f)| conform(&u.evaluate(state)?.into_array(n)?, f.data_type()))
            .collect::<Result<Vec<_>>>()?;
        Ok(RecordBatch::try_new(Arc::clone(&self.state), columns)?)
    }

    /// The cotangents of `state`'s differentiable columns, given those of
    /// the next iteration's (`after`).
    fn pullback(&self, state: &RecordBatch, after: &[ArrayRef]) -> Result<Vec<ArrayRef>> {
        let n = state.num_rows();
        let mut columns = state.columns().to_vec();
        columns.extend(after.iter().cloned());
        let batch = RecordBatch::try_new(Arc::clone(&self.adjoint_schema), columns)?;
        self.adjoints
            .iter()
            .zip(&self.differentiable)
            .map(|(a, &c)| {
                conform(
                    &a.evaluate(&batch)?.into_array(n)?,
                    self.state.field(c).data_type(),
                )
            })
            .collect()
    }
}

/// `array` as type `t`: cast, or a number spread over every element of a
/// float tensor type (the engine writes a zero cotangent as the number 0).
fn conform(array: &ArrayRef, t: &DataType) -> Result<ArrayRef> {
    if array.data_type() == t {
        return Ok(Arc::clone(array));
    }
    if let (DataType::FixedSizeList(field, size), true) = (t, array.data_type().is_numeric()) {
        let numbers = cast(array, &DataType::Float64)?;
        let numbers = numbers.as_primitive::<Float64Type>();
        let size = *size as usize;
        let values: Float64Array = (0..numbers.len() * size)
            .map(|i| numbers.is_valid(i / size).then(|| numbers.value(i / size)))
            .collect();
        // A matrix's rows are vectors of the number too.
        let values = conform(&(Arc::new(values) as ArrayRef), field.data_type())?;
        return Ok(Arc::new(FixedSizeListArray::try_new(
            Arc::clone(field),
            size as i32,
            values,
            numbers.nulls().cloned(),
        )?));
    }
    Ok(cast(array, t)?)
}

/// `n` zeros of the float or float tensor type `t`.
fn zeros(t: &DataType, n: usize) -> Result<ArrayRef> {
    conform(&(Arc::new(Float64Array::from(vec![0.0; n])) as ArrayRef), t)
}

/// `a + b`, element by element (floats or float vectors or matrices of one
/// shape).
fn add(a: &ArrayRef, b: &ArrayRef) -> Result<ArrayRef> {
    use datafusion::arrow::compute::kernels::numeric;
    match a.data_type() {
        DataType::FixedSizeList(field, size) => {
            let (a, b) = (a.as_fixed_size_list(), b.as_fixed_size_list());
            let nulls = datafusion::arrow::buffer::NullBuffer::union(a.nulls(), b.nulls());
            Ok(Arc::new(FixedSizeListArray::try_new(
                Arc::clone(field),
                *size,
                add(a.values(), b.values())?,
                nulls,
            )?))
        }
        _ => Ok(numeric::add(a, b)?),
    }
}

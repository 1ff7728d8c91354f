//! Loop-invariant data of recursive queries, kept on Ballista's executors.
//!
//! On Ballista the client runs each iteration of a recursive query as a
//! distributed query of its own ([`super::recursion`]), so without help every
//! iteration reads and decodes the loop's data again, as DataFusion does
//! without [`crate::exec::loop_invariant`]. The client names the queries of one
//! run of a recursive query with a run key (the setting
//! `datafusion_grad.ballista_loop_run`, set for them only); the scheduler's
//! physical optimizer rule [`KeepOnExecutors`](super::keep::KeepOnExecutors)
//! puts each loop-invariant part of such a query that lies within one stage
//! (a file scan with its filters and projections) under a
//! [`KeptOnExecutorsExec`] of the run. An executor keeps the batches of each
//! partition the first time one of its tasks computes them, under the run
//! key and a fingerprint of the plan the task runs (its files and byte
//! ranges included), and replays them to the later tasks of the same run
//! that run the same plan; a task that runs on another executor computes
//! the partition there (and keeps it there).
//!
//! What is kept is bounded: each partition's batches must fit in its task's
//! memory pool, and all kept batches of one executor process in
//! `datafusion_grad.ballista_kept_bytes` (entries of other runs make room,
//! least recently used first); a partition that does not fit is computed in
//! every iteration, as without keeping. Entries not read for
//! [`IDLE_SECONDS`] are dropped when the store is next used.
//!
//! ```sql
//! SET datafusion_grad.ballista_kept_bytes = 4294967296; -- 4 GiB per executor
//! SET datafusion_grad.cache_loop_invariants = false;     -- read the data every iteration
//! ```

use std::collections::HashMap;
use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, LazyLock, Mutex, OnceLock};
use std::time::{Duration, Instant};

use datafusion::arrow::array::RecordBatch;
use datafusion::error::Result;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    displayable, DisplayAs, DisplayFormatType, ExecutionPlan, SendableRecordBatchStream,
};
use futures::StreamExt;

use crate::exec::kit;
use crate::exec::loop_invariant::replay;
use crate::options::GradOptions;

/// Seconds after which a kept partition nobody read is dropped.
pub const IDLE_SECONDS: u64 = 60;

/// A loop-invariant part of an iteration's query whose partitions the
/// executors keep across the iterations of one run (see the
/// [module docs](self)).
#[derive(Debug)]
pub struct KeptOnExecutorsExec {
    input: Arc<dyn ExecutionPlan>,
    /// The run key.
    run: String,
    /// A hash of `input` as this process sees it, made when first needed.
    fingerprint: OnceLock<u64>,
}

impl KeptOnExecutorsExec {
    /// `input`, kept for the run `run`.
    pub fn new(input: Arc<dyn ExecutionPlan>, run: String) -> Self {
        Self {
            input,
            run,
            fingerprint: OnceLock::new(),
        }
    }

    /// The same run over `input`.
    fn with_input(&self, input: Arc<dyn ExecutionPlan>) -> Result<Self> {
        Ok(Self::new(input, self.run.clone()))
    }

    /// The run its partitions are kept for.
    pub fn run(&self) -> &str {
        &self.run
    }

    /// Where partition `partition` is kept: the run, and the input as
    /// displayed in full with its schema. It is made where the partition
    /// runs, because Ballista's executors run each task on a plan of their
    /// own: a scan cut down to the task's files, as partition 0.
    fn key(&self, partition: usize) -> Key {
        let fingerprint = *self.fingerprint.get_or_init(|| {
            let mut hasher = DefaultHasher::new();
            displayable(self.input.as_ref())
                .indent(true)
                .to_string()
                .hash(&mut hasher);
            format!("{:?}", self.input.schema()).hash(&mut hasher);
            hasher.finish()
        });
        (self.run.clone(), fingerprint, partition)
    }
}

impl DisplayAs for KeptOnExecutorsExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "KeptOnExecutorsExec: run={}", self.run)
    }
}

impl ExecutionPlan for KeptOnExecutorsExec {
    kit::one_input!("KeptOnExecutorsExec");
    kit::input_properties!();
    kit::no_expressions!();

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let schema = self.schema();
        let key = self.key(partition);
        if let Some(batches) = STORE.lock().expect("store lock").replay(&key) {
            return Ok(replay(schema, batches));
        }
        let limit = context
            .session_config()
            .options()
            .extensions
            .get::<GradOptions>()
            .map_or(GradOptions::default().ballista_kept_bytes, |o| {
                o.ballista_kept_bytes
            });
        if limit == 0 {
            return self.input.execute(partition, context);
        }
        let keeping = Keeping {
            input: self.input.execute(partition, Arc::clone(&context))?,
            kept: Some(Vec::new()),
            reservation: MemoryConsumer::new("KeptOnExecutorsExec").register(context.memory_pool()),
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
            key,
        };
        let stream = futures::stream::unfold(keeping, |mut keeping| async move {
            match keeping.input.next().await {
                Some(Ok(batch)) => {
                    keeping.keep(&batch);
                    Some((Ok(batch), keeping))
                }
                Some(Err(e)) => {
                    keeping.kept = None;
                    Some((Err(e), keeping))
                }
                None => {
                    keeping.finish();
                    None
                }
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

/// A kept partition's place in the store: its run, the fingerprint of its
/// node's input and the partition.
type Key = (String, u64, usize);

/// A partition being computed, its batches passed on and collected, for
/// the store once the input ends.
struct Keeping {
    input: SendableRecordBatchStream,
    /// `None`: not kept (an error, or no room).
    kept: Option<Vec<RecordBatch>>,
    reservation: MemoryReservation,
    limit: usize,
    key: Key,
}

impl Keeping {
    /// Collects `batch` while the task's pool and the store's limit have
    /// room for it.
    fn keep(&mut self, batch: &RecordBatch) {
        let Some(kept) = self.kept.as_mut() else {
            return;
        };
        let size = batch.get_array_memory_size();
        if self.reservation.size() + size > self.limit || self.reservation.try_grow(size).is_err() {
            self.kept = None;
            self.reservation.free();
            return;
        }
        kept.push(batch.clone());
    }

    /// Hands the collected batches to the store.
    fn finish(&mut self) {
        if let Some(batches) = self.kept.take() {
            let reservation = self.reservation.take();
            STORE.lock().expect("store lock").keep(
                self.key.clone(),
                batches,
                reservation,
                self.limit,
            );
        }
    }
}

/// A kept partition.
// pub for the tests in tests/unit/ballista_kept.rs
#[doc(hidden)]
pub struct Entry {
    batches: Vec<RecordBatch>,
    /// Its bytes, held in the memory pool of the task that computed it.
    reservation: MemoryReservation,
    last_read: Instant,
}

/// The partitions this process keeps.
// pub for the tests in tests/unit/ballista_kept.rs
#[doc(hidden)]
#[derive(Default)]
pub struct Store {
    /// The kept partitions.
    pub entries: HashMap<Key, Entry>,
    /// Their bytes.
    pub bytes: usize,
    replays: u64,
}

/// The store of this process (an executor's; in-process clusters share it).
static STORE: LazyLock<Mutex<Store>> = LazyLock::new(Mutex::default);

impl Store {
    /// The batches kept under `key`, if any.
    pub fn replay(&mut self, key: &Key) -> Option<Vec<RecordBatch>> {
        self.drop_idle();
        let entry = self.entries.get_mut(key)?;
        entry.last_read = Instant::now();
        self.replays += 1;
        Some(entry.batches.clone())
    }

    /// Keeps `batches` under `key` if the store, within `limit` bytes, has
    /// room for them once idle entries and entries of other runs (least
    /// recently read first) are dropped.
    pub fn keep(
        &mut self,
        key: Key,
        batches: Vec<RecordBatch>,
        reservation: MemoryReservation,
        limit: usize,
    ) {
        self.drop_idle();
        let size = reservation.size();
        while self.bytes + size > limit {
            let oldest = self
                .entries
                .iter()
                .filter(|(k, _)| k.0 != key.0)
                .min_by_key(|(_, e)| e.last_read)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => self.remove(&k),
                None => return,
            }
        }
        if let Some(old) = self.entries.remove(&key) {
            self.bytes -= old.reservation.size();
        }
        self.bytes += size;
        let last_read = Instant::now();
        self.entries.insert(
            key,
            Entry {
                batches,
                reservation,
                last_read,
            },
        );
    }

    fn remove(&mut self, key: &Key) {
        if let Some(entry) = self.entries.remove(key) {
            self.bytes -= entry.reservation.size();
        }
    }

    /// Drops the entries nobody read for [`IDLE_SECONDS`].
    fn drop_idle(&mut self) {
        let idle = Duration::from_secs(IDLE_SECONDS);
        let stale: Vec<Key> = self
            .entries
            .iter()
            .filter(|(_, e)| e.last_read.elapsed() > idle)
            .map(|(k, _)| k.clone())
            .collect();
        for key in stale {
            self.remove(&key);
        }
    }
}

/// What this process keeps for recursive queries on Ballista, for
/// monitoring (and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeptStats {
    /// Partitions kept.
    pub partitions: usize,
    /// Their bytes.
    pub bytes: usize,
    /// Partitions served from the store since the process started.
    pub replays: u64,
}

/// What this process keeps now (see [`KeptStats`]).
pub fn kept_stats() -> KeptStats {
    let store = STORE.lock().expect("store lock");
    KeptStats {
        partitions: store.entries.len(),
        bytes: store.bytes,
        replays: store.replays,
    }
}

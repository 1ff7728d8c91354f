//! Handing plans across the FFI query-planner boundary by reference.
//!
//! `FFI_QueryPlanner` moves plans as protobuf, encoded with the codecs the
//! planner supplies. DataFusion's own codecs cannot encode in-memory tables
//! (what `from_pydict`/`register_batch` create) nor a recursive query's
//! physical plan. Both sides of the boundary live in one process, so
//! [`ByReference`] encodes what protobuf cannot carry as a key into a
//! process-wide table of live objects, and [`Handoff`] wraps a whole physical
//! plan so that it crosses as one such reference: it runs in this library,
//! exactly as planned here.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::TableProvider;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{internal_err, not_impl_err, TableReference};
use datafusion::error::Result;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{Extension, LogicalPlan};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::metrics::MetricsSet;
use datafusion::physical_plan::{
    displayable, DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties,
};
use datafusion_proto::logical_plan::LogicalExtensionCodec;
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};

/// An object waiting on the other side of the boundary.
enum Parked {
    Table(Arc<dyn TableProvider>),
    Plan(Arc<dyn ExecutionPlan>),
}

/// Parked objects by key. An entry is taken when decoded: each encoded plan
/// is decoded once, by the other side of the same planner call.
static PARKED: LazyLock<Mutex<HashMap<u64, Parked>>> = LazyLock::new(Default::default);
static NEXT_KEY: AtomicU64 = AtomicU64::new(1);

fn park(object: Parked, buf: &mut Vec<u8>) {
    let key = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
    PARKED.lock().expect("parked objects").insert(key, object);
    buf.extend_from_slice(&key.to_le_bytes());
}

fn take(buf: &[u8]) -> Result<Parked> {
    let Ok(key) = <[u8; 8]>::try_from(buf) else {
        return internal_err!(
            "datafusion-grad: not a by-reference payload ({} bytes)",
            buf.len()
        );
    };
    let key = u64::from_le_bytes(key);
    match PARKED.lock().expect("parked objects").remove(&key) {
        Some(object) => Ok(object),
        None => {
            internal_err!("datafusion-grad: plan object {key} was already taken or never parked")
        }
    }
}

/// Encodes table providers and unknown execution plans by reference.
#[derive(Debug, Default)]
pub struct ByReference;

impl LogicalExtensionCodec for ByReference {
    fn try_decode(
        &self,
        _buf: &[u8],
        _inputs: &[LogicalPlan],
        _ctx: &TaskContext,
    ) -> Result<Extension> {
        not_impl_err!("datafusion-grad's planner does not carry user-defined logical nodes")
    }

    fn try_encode(&self, node: &Extension, _buf: &mut Vec<u8>) -> Result<()> {
        not_impl_err!(
            "datafusion-grad's planner does not carry user-defined logical nodes ({})",
            node.node.name()
        )
    }

    fn try_decode_table_provider(
        &self,
        buf: &[u8],
        table_ref: &TableReference,
        _schema: SchemaRef,
        _ctx: &TaskContext,
    ) -> Result<Arc<dyn TableProvider>> {
        match take(buf)? {
            Parked::Table(table) => Ok(table),
            Parked::Plan(_) => internal_err!("datafusion-grad: {table_ref} decoded as a plan"),
        }
    }

    fn try_encode_table_provider(
        &self,
        _table_ref: &TableReference,
        node: Arc<dyn TableProvider>,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        park(Parked::Table(node), buf);
        Ok(())
    }
}

impl PhysicalExtensionCodec for ByReference {
    fn try_decode(
        &self,
        buf: &[u8],
        _inputs: &[Arc<dyn ExecutionPlan>],
        _ctx: &TaskContext,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match take(buf)? {
            Parked::Plan(plan) => Ok(plan),
            Parked::Table(_) => internal_err!("datafusion-grad: a table decoded as a plan"),
        }
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        park(Parked::Plan(node), buf);
        Ok(())
    }
}

/// A physical plan handed over whole: no children to encode, it runs the
/// plan it wraps.
#[derive(Debug)]
pub struct Handoff {
    plan: Arc<dyn ExecutionPlan>,
}

impl Handoff {
    /// Wraps `plan`.
    pub fn new(plan: Arc<dyn ExecutionPlan>) -> Self {
        Self { plan }
    }
}

impl DisplayAs for Handoff {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match t {
            DisplayFormatType::TreeRender => write!(f, "datafusion-grad"),
            _ => write!(
                f,
                "DataFusionGradExec: {}",
                displayable(self.plan.as_ref()).one_line()
            ),
        }
    }
}

impl ExecutionPlan for Handoff {
    fn name(&self) -> &str {
        "DataFusionGradExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.plan.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            return Ok(self);
        }
        internal_err!("DataFusionGradExec has no children")
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        self.plan.execute(partition, context)
    }

    fn metrics(&self) -> Option<MetricsSet> {
        self.plan.metrics()
    }
}

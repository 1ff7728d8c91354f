//! The physical plan codec of our Ballista processes: Ballista's, plus the
//! operators of ours that travel from the scheduler to the executors
//! ([`KeptOnExecutorsExec`], and [`BroadcastAggregateExec`] and
//! [`ContractionExec`] as the plans they replace, rebuilt on arrival).

use std::sync::Arc;

use ballista_core::serde::BallistaPhysicalExtensionCodec;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::HigherOrderUDF;
use datafusion::logical_expr::{AggregateUDF, ScalarUDF, WindowUDF};
use datafusion::physical_expr_common::physical_expr::proto_decode::PhysicalExprDecodeCtx;
use datafusion::physical_expr_common::physical_expr::proto_encode::PhysicalExprEncodeCtx;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::{ExecutionPlan, PhysicalExpr};
use datafusion_proto::physical_plan::{
    PhysicalExtensionCodec, PhysicalPlanNodeExt, PhysicalProtoConverterExtension,
};
use datafusion_proto::protobuf::PhysicalPlanNode;
use prost::Message;

use super::kept::KeptOnExecutorsExec;
use crate::exec::broadcast_aggregate::BroadcastAggregateExec;
use crate::exec::contraction::ContractionExec;
use crate::exec::only_child;

/// What an encoded [`KeptOnExecutorsExec`] starts with (its run key follows):
/// a protobuf message (what Ballista's codec writes) never starts with a
/// zero byte.
const KEPT: &[u8] = b"\0datafusion_grad.kept:";

/// What an encoded [`BroadcastAggregateExec`] starts with; the plan it
/// replaces follows, its cross join over placeholders.
const BROADCAST: &[u8] = b"\0datafusion_grad.broadcast:";

/// What an encoded [`ContractionExec`] starts with; the aggregate and join
/// it replaces follow, the join over placeholders.
const CONTRACTION: &[u8] = b"\0datafusion_grad.contraction:";

/// Ballista's physical extension codec with our operators added. Set on
/// the client ([`super::config`]), the scheduler and the executors
/// ([`super::cluster`]).
#[derive(Debug, Default)]
pub struct GradPhysicalCodec {
    ballista: BallistaPhysicalExtensionCodec,
}

/// A physical plan.
type Plan = Arc<dyn ExecutionPlan>;

/// How an operator that replaces an aggregate and its join travels: as the
/// plan it replaces, its join over placeholders (the operator's own inputs
/// travel as its children), rebuilt on arrival.
impl GradPhysicalCodec {
    /// Placeholders of the schemas of `node`'s inputs.
    fn placeholders(&self, node: &Arc<dyn ExecutionPlan>) -> Vec<Arc<dyn ExecutionPlan>> {
        (node.children().into_iter())
            .map(|p| Arc::new(EmptyExec::new(p.schema())) as Arc<dyn ExecutionPlan>)
            .collect()
    }

    /// Writes `prefix` and the plan `replaced` to `buf`.
    fn encode_replaced(
        &self,
        replaced: &Arc<dyn ExecutionPlan>,
        prefix: &[u8],
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        buf.extend_from_slice(prefix);
        proto_converter
            .execution_plan_to_proto(replaced, self)?
            .encode(buf)
            .map_err(|e| DataFusionError::Internal(format!("{}: {e}", replaced.name())))
    }

    /// The plan `encoded` (after its prefix) of `name`.
    fn decode_replaced(
        &self,
        encoded: &[u8],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
        name: &str,
    ) -> Result<Plan> {
        PhysicalPlanNode::decode(encoded)
            .map_err(|e| DataFusionError::Internal(format!("{name}: {e}")))?
            .try_into_physical_plan_with_converter(ctx, self, proto_converter)
    }
}

impl PhysicalExtensionCodec for GradPhysicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if let Some(run) = buf.strip_prefix(KEPT) {
            let run = String::from_utf8(run.to_vec()).map_err(|e| {
                DataFusionError::Internal(format!("KeptOnExecutorsExec run key: {e}"))
            })?;
            let input = only_child(inputs.to_vec(), "KeptOnExecutorsExec")?;
            return Ok(Arc::new(KeptOnExecutorsExec::new(input, run)));
        }
        if let Some(replaced) = buf.strip_prefix(BROADCAST) {
            let name = "BroadcastAggregateExec";
            let [left, right] = inputs else {
                return Err(DataFusionError::Internal(format!(
                    "{name} with {} inputs",
                    inputs.len()
                )));
            };
            let replaced = self.decode_replaced(replaced, ctx, proto_converter, name)?;
            return Ok(Arc::new(BroadcastAggregateExec::from_replaced(
                replaced,
                Arc::clone(left),
                Arc::clone(right),
            )?));
        }
        if let Some(replaced) = buf.strip_prefix(CONTRACTION) {
            let replaced =
                self.decode_replaced(replaced, ctx, proto_converter, "ContractionExec")?;
            return Ok(Arc::new(ContractionExec::from_replaced(
                replaced,
                inputs.to_vec(),
            )?));
        }
        self.ballista.try_decode(buf, inputs, ctx, proto_converter)
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        if let Some(kept) = node.downcast_ref::<KeptOnExecutorsExec>() {
            buf.extend_from_slice(KEPT);
            buf.extend_from_slice(kept.run().as_bytes());
            return Ok(());
        }
        if let Some(broadcast) = node.downcast_ref::<BroadcastAggregateExec>() {
            let Ok([left, right]) = <[_; 2]>::try_from(self.placeholders(&node)) else {
                return Err(DataFusionError::Internal(
                    "BroadcastAggregateExec without its two inputs".to_string(),
                ));
            };
            let Some(replaced) = broadcast.replaced(left, right)? else {
                return Err(DataFusionError::Internal(
                    "a BroadcastAggregateExec planned locally (merging its partitions) cannot travel"
                        .to_string(),
                ));
            };
            return self.encode_replaced(&replaced, BROADCAST, buf, proto_converter);
        }
        if let Some(contraction) = node.downcast_ref::<ContractionExec>() {
            let replaced = contraction.replaced(self.placeholders(&node))?;
            return self.encode_replaced(&replaced, CONTRACTION, buf, proto_converter);
        }
        self.ballista.try_encode(node, buf, proto_converter)
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> Result<Arc<ScalarUDF>> {
        self.ballista.try_decode_udf(name, buf)
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> Result<()> {
        self.ballista.try_encode_udf(node, buf)
    }

    fn try_decode_higher_order_function(
        &self,
        name: &str,
        buf: &[u8],
    ) -> Result<Arc<HigherOrderUDF>> {
        self.ballista.try_decode_higher_order_function(name, buf)
    }

    fn try_encode_higher_order_function(
        &self,
        node: &HigherOrderUDF,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        self.ballista.try_encode_higher_order_function(node, buf)
    }

    fn try_decode_expr(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn PhysicalExpr>],
        ctx: &PhysicalExprDecodeCtx<'_>,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        self.ballista.try_decode_expr(buf, inputs, ctx)
    }

    fn try_encode_expr(
        &self,
        node: &Arc<dyn PhysicalExpr>,
        buf: &mut Vec<u8>,
        ctx: &PhysicalExprEncodeCtx<'_>,
    ) -> Result<()> {
        self.ballista.try_encode_expr(node, buf, ctx)
    }

    fn try_decode_udaf(&self, name: &str, buf: &[u8]) -> Result<Arc<AggregateUDF>> {
        self.ballista.try_decode_udaf(name, buf)
    }

    fn try_encode_udaf(&self, node: &AggregateUDF, buf: &mut Vec<u8>) -> Result<()> {
        self.ballista.try_encode_udaf(node, buf)
    }

    fn try_decode_udwf(&self, name: &str, buf: &[u8]) -> Result<Arc<WindowUDF>> {
        self.ballista.try_decode_udwf(name, buf)
    }

    fn try_encode_udwf(&self, node: &WindowUDF, buf: &mut Vec<u8>) -> Result<()> {
        self.ballista.try_encode_udwf(node, buf)
    }
}

//! A loop's data file of one row group read by every core.
//!
//! DataFusion reads a Parquet row group in one partition: a file written
//! with one row group (pyarrow's default up to 1Mi rows) is decoded on one
//! core, even when the loop keeps its rows ([`super::invariant`]) and
//! spreads them over every core afterwards. [`split_file_scans`] gives such
//! a scan one partition per core instead, each the same file with a
//! [`ParquetRowSelection`] of a contiguous share of its rows: the Parquet
//! reader skips the pages before a share without decompressing them, so
//! each core decodes its share only. Only where the rows' partitions do not
//! matter (a round-robin repartition above, or kept rows that are spread),
//! and only for a local file whose footer says it has one row group (read
//! when the plan is made: a few hundred bytes; a file of several row groups
//! is already spread by DataFusion, and measured 5% slower split this way).

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use datafusion::datasource::physical_plan::parquet::ParquetRowSelection;
use datafusion::datasource::physical_plan::{
    FileGroup, FileScanConfig, FileScanConfigBuilder, ParquetSource,
};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::parquet::arrow::arrow_reader::{RowSelection, RowSelector};
use datafusion::parquet::file::metadata::ParquetMetaDataReader;
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::ExecutionPlan;

use super::dealt;

/// The fewest rows worth splitting: two batches per core.
const SPLIT_ROWS: usize = 2 * 8192;

/// `plan` (a loop-invariant part of a recursive term) with its scan of one
/// Parquet file in one partition read by `cores` partitions, where the
/// operators between them keep no partitioning: projections, filters, and
/// at most a round-robin repartition; below none, only if `may_widen`
/// (the kept rows are spread anyway). `None` where nothing is split.
pub(crate) fn split_file_scans(
    plan: &Arc<dyn ExecutionPlan>,
    cores: usize,
    may_widen: bool,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    if cores < 2 {
        return Ok(None);
    }
    let dealt = dealt(plan).is_some();
    let passes = plan.downcast_ref::<ProjectionExec>().is_some()
        || plan.downcast_ref::<FilterExec>().is_some();
    if dealt || passes {
        let [child] = plan.children()[..] else {
            return Ok(None);
        };
        return match split_file_scans(child, cores, may_widen || dealt)? {
            Some(child) => Ok(Some(replace_children_if_necessary(
                Arc::clone(plan),
                vec![child],
            )?)),
            None => Ok(None),
        };
    }
    Ok(match may_widen {
        true => split(plan, cores),
        false => None,
    })
}

/// `plan`, a scan of one local Parquet file of one row group (whole, or in
/// the byte ranges DataFusion deals out, which split no row group), as
/// `cores` partitions of a share of its rows each.
fn split(plan: &Arc<dyn ExecutionPlan>, cores: usize) -> Option<Arc<dyn ExecutionPlan>> {
    let scan = plan.downcast_ref::<DataSourceExec>()?;
    let config = scan.data_source().downcast_ref::<FileScanConfig>()?;
    config.file_source().downcast_ref::<ParquetSource>()?;
    let mut parts = config.file_groups.iter().flat_map(|g| g.files());
    let first = parts.next()?;
    let one_file =
        parts.all(|f| f.object_meta.location == first.object_meta.location && f.range.is_some());
    if !one_file || !first.extensions.is_empty() || config.limit.is_some() {
        return None;
    }
    let mut file = first.clone();
    file.range = None;
    if config.object_store_url != ObjectStoreUrl::local_filesystem() {
        return None;
    }
    let path = Path::new("/").join(file.object_meta.location.as_ref());
    let footer = ParquetMetaDataReader::new()
        .parse_and_finish(&File::open(path).ok()?)
        .ok()?;
    let rows = usize::try_from(footer.file_metadata().num_rows()).ok()?;
    if footer.num_row_groups() != 1 || rows < SPLIT_ROWS * cores {
        return None;
    }
    let groups = (0..cores)
        .map(|i| {
            let (start, end) = (rows * i / cores, rows * (i + 1) / cores);
            let selectors = [
                RowSelector::skip(start),
                RowSelector::select(end - start),
                RowSelector::skip(rows - end),
            ];
            let selectors: Vec<RowSelector> =
                selectors.into_iter().filter(|s| s.row_count > 0).collect();
            let share = ParquetRowSelection::new(RowSelection::from(selectors));
            FileGroup::new(vec![file.clone().with_extension(share)])
        })
        .collect();
    let config = FileScanConfigBuilder::from(config.clone())
        .with_file_groups(groups)
        .build();
    Some(DataSourceExec::from_data_source(config))
}

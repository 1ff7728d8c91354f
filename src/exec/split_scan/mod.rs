//! A loop's data file of one row group read by every core.
//!
//! DataFusion reads a Parquet row group in one partition: a file written
//! with one row group (pyarrow's default up to 1Mi rows) is decoded on one
//! core, even when the loop keeps its rows ([`super::invariant`]) and
//! spreads them over every core afterwards. [`split_file_scans`] reads
//! such a file with one scan per core instead, each decoding other
//! columns (groups of about equal compressed size, from the footer),
//! zipped back into whole rows by [`ZipColumnsExec`]; where there are more
//! cores than columns, each column group is read in contiguous shares of
//! rows too ([`ParquetRowSelection`]). With at least as many columns as
//! cores, each byte of the file is fetched and decompressed once: shares
//! of rows alone make every core fetch the whole column chunks (a file
//! without a page index), which measured 35% more CPU time than one core
//! reading it all.
//!
//! The split scans read the file through [`LocalFileReaders`] (unless the
//! scan has a reader of its own): the footer read when the plan was made,
//! and the column chunks into buffers that are not zero-filled first.
//!
//! Only where the rows' partitions do not matter (a round-robin
//! repartition above, or kept rows that are spread), and only for a local
//! file whose footer says it has one row group (read when the plan is
//! made: a few hundred bytes; a file of several row groups is already
//! spread by DataFusion), with no limit and no dynamic filter in the scan.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::common::tree_node::TreeNode;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::parquet::ParquetRowSelection;
use datafusion::datasource::physical_plan::{
    FileGroup, FileScanConfig, FileScanConfigBuilder, FileSource, ParquetSource,
};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::parquet::arrow::arrow_reader::{RowSelection, RowSelector};
use datafusion::parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use datafusion::physical_expr::projection::ProjectionExprs;
use datafusion::physical_expr::utils::collect_columns;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::{ExecutionPlan, Partitioning};

use super::dealt;
use local_reader::LocalFileReaders;
use zip::ZipColumnsExec;

// pub for the tests in tests/unit/exec_split_scan_local_reader.rs
#[doc(hidden)]
pub mod local_reader;
// pub for the tests in tests/unit/exec_split_scan_zip.rs
#[doc(hidden)]
pub mod zip;

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
    match may_widen {
        true => split(plan, cores),
        false => Ok(None),
    }
}

/// `plan`, a scan of one local Parquet file of one row group (whole, or in
/// the byte ranges DataFusion deals out, which split no row group), read
/// by `cores` scans: its columns dealt into groups of about equal size
/// (compressed, as the footer says), one scan each, zipped back together
/// ([`ZipColumnsExec`]); where there are more cores than groups, each group
/// read in shares of rows too. `None` where it is no such scan.
fn split(plan: &Arc<dyn ExecutionPlan>, cores: usize) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let Some(OneRowGroupFile {
        config,
        source,
        file,
        path,
        footer,
    }) = one_row_group_file(plan)
    else {
        return Ok(None);
    };
    let Ok(rows) = usize::try_from(footer.file_metadata().num_rows()) else {
        return Ok(None);
    };
    if rows < SPLIT_ROWS * cores {
        return Ok(None);
    }
    let schema = plan.schema();
    // shares of rows only where there are fewer columns than cores
    let count = cores.div_ceil(schema.fields().len().max(1));
    // a Parquet scan always has a projection (all columns by default)
    let Some(projection) = source.projection() else {
        return Ok(None);
    };
    let groups = column_groups(projection, &footer, cores / count);
    let files = shares(&file, rows, count);
    // our reader, unless the scan comes with a reader of its own
    let source = match source.parquet_file_reader_factory() {
        Some(_) => source.clone(),
        None => source
            .clone()
            .with_parquet_file_reader_factory(Arc::new(LocalFileReaders::new(
                path,
                Arc::new(footer),
            ))),
    };
    if groups.len() < 2 {
        let config = FileScanConfigBuilder::from(config.clone())
            .with_source(Arc::new(source))
            .with_file_groups(files)
            .build();
        return Ok(Some(DataSourceExec::from_data_source(config)));
    }
    let mut columns = vec![(0, 0); schema.fields().len()];
    let mut scans = Vec::with_capacity(groups.len());
    for (g, group) in groups.iter().enumerate() {
        for (j, &i) in group.iter().enumerate() {
            columns[i] = (g, j);
        }
        let Some(source) =
            source.try_pushdown_projection(&ProjectionExprs::from_indices(group, &schema))?
        else {
            return Ok(None);
        };
        // partition p reads share p and no other: DataFusion's scans
        // otherwise hand an unopened share to whichever partition is idle
        // (work stealing), and the zip would pair rows of other shares
        let config = FileScanConfigBuilder::from(config.clone())
            .with_source(source)
            .with_output_ordering(vec![])
            .with_file_groups(files.clone())
            .with_output_partitioning(Some(Partitioning::UnknownPartitioning(files.len())))
            .build();
        scans.push(DataSourceExec::from_data_source(config) as Arc<dyn ExecutionPlan>);
    }
    Ok(Some(Arc::new(ZipColumnsExec::try_new(
        scans, columns, schema,
    )?)))
}

/// A scan of one local Parquet file of one row group.
struct OneRowGroupFile<'a> {
    config: &'a FileScanConfig,
    source: &'a ParquetSource,
    /// The file, whole.
    file: PartitionedFile,
    /// Where it lies.
    path: PathBuf,
    footer: ParquetMetaData,
}

/// The scan `plan`, where it scans one local Parquet file of one row
/// group, with no limit and no filter in the scan that may change while it
/// runs (every scan of it must give the same rows: a static predicate
/// prunes and filters each alike).
fn one_row_group_file(plan: &Arc<dyn ExecutionPlan>) -> Option<OneRowGroupFile<'_>> {
    let scan = plan.downcast_ref::<DataSourceExec>()?;
    let config = scan.data_source().downcast_ref::<FileScanConfig>()?;
    let source = config.file_source().downcast_ref::<ParquetSource>()?;
    let mut parts = config.file_groups.iter().flat_map(|g| g.files());
    let first = parts.next()?;
    let one_file =
        parts.all(|f| f.object_meta.location == first.object_meta.location && f.range.is_some());
    if !one_file
        || !first.extensions.is_empty()
        || config.limit.is_some()
        || source.filter().is_some_and(|f| !is_static(&f))
        || config.object_store_url != ObjectStoreUrl::local_filesystem()
    {
        return None;
    }
    let mut file = first.clone();
    file.range = None;
    let path = Path::new("/").join(file.object_meta.location.as_ref());
    let footer = ParquetMetaDataReader::new()
        .parse_and_finish(&File::open(&path).ok()?)
        .ok()?;
    (footer.num_row_groups() == 1).then_some(OneRowGroupFile {
        config,
        source,
        file,
        path,
        footer,
    })
}

/// Whether `predicate` is the same whenever it is read: no dynamic filter
/// (a join's keys, filled in as the join runs) in it.
fn is_static(predicate: &Arc<dyn PhysicalExpr>) -> bool {
    !predicate
        .exists(|e| Ok(e.expression_id().is_some()))
        .expect("the visit does not fail")
}

/// The scan's columns (its `projection`) dealt into `count` groups (of
/// column indices; fewer where there are fewer columns), the largest
/// first, each to the group that reads the fewest compressed bytes so far.
fn column_groups(
    projection: &ProjectionExprs,
    footer: &ParquetMetaData,
    count: usize,
) -> Vec<Vec<usize>> {
    let chunks = footer.row_group(0).columns();
    let size = |name: &str| -> i64 {
        chunks
            .iter()
            .filter(|c| c.column_path().parts().first().map(String::as_str) == Some(name))
            .map(|c| c.compressed_size())
            .sum()
    };
    let mut sizes: Vec<(i64, usize)> = projection
        .iter()
        .map(|e| {
            collect_columns(&e.expr)
                .iter()
                .map(|c| size(c.name()))
                .sum()
        })
        .zip(0..)
        .collect();
    sizes.sort_by_key(|&(size, i)| (std::cmp::Reverse(size), i));
    let mut groups = vec![(0, Vec::new()); count.max(1)];
    for (size, i) in sizes {
        let smallest = groups
            .iter_mut()
            .min_by_key(|(total, _)| *total)
            .expect("at least one group");
        smallest.0 += size;
        smallest.1.push(i);
    }
    groups
        .into_iter()
        .map(|(_, mut group)| {
            group.sort_unstable();
            group
        })
        .filter(|group| !group.is_empty())
        .collect()
}

/// `file`'s `rows` in `count` file groups, each a contiguous share of them
/// (the whole file where `count` is 1).
fn shares(file: &PartitionedFile, rows: usize, count: usize) -> Vec<FileGroup> {
    if count < 2 {
        return vec![FileGroup::new(vec![file.clone()])];
    }
    (0..count)
        .map(|i| {
            let (start, end) = (rows * i / count, rows * (i + 1) / count);
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
        .collect()
}

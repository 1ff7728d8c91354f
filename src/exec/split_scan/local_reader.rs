//! Reads of one local Parquet file into buffers that are not zero-filled
//! first.
//!
//! DataFusion reads a local file through `object_store`, whose
//! `LocalFileSystem` fills every fetched range with zeros before reading
//! the file into it: for a loop's data file of one row group, the whole
//! column chunks. That `memset` was 13% of the CPU time of a one-step loop
//! over such a file (10 columns, `perf record`). [`LocalFileReaders`] reads
//! the same ranges with `read_to_end` into reserved (uninitialized) space,
//! which a file fills directly, and gives the footer the split has already
//! read.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{ParquetFileMetrics, ParquetFileReaderFactory};
use datafusion::error::Result;
use datafusion::parquet::arrow::arrow_reader::ArrowReaderOptions;
use datafusion::parquet::arrow::async_reader::AsyncFileReader;
use datafusion::parquet::errors::{ParquetError, Result as ParquetResult};
use datafusion::parquet::file::metadata::ParquetMetaData;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use futures::future::BoxFuture;
use futures::FutureExt;

/// Readers of the local file at `path`, whose footer is `footer` (read
/// when the plan was made, without its page index: DataFusion's scan reads
/// that through the reader where it wants it).
#[derive(Debug)]
pub(super) struct LocalFileReaders {
    path: PathBuf,
    footer: Arc<ParquetMetaData>,
}

impl LocalFileReaders {
    /// Readers of the file at `path` with the footer `footer`.
    pub(super) fn new(path: PathBuf, footer: Arc<ParquetMetaData>) -> Self {
        Self { path, footer }
    }
}

impl ParquetFileReaderFactory for LocalFileReaders {
    fn create_reader(
        &self,
        partition_index: usize,
        file: PartitionedFile,
        _metadata_size_hint: Option<usize>,
        metrics: &ExecutionPlanMetricsSet,
    ) -> Result<Box<dyn AsyncFileReader + Send>> {
        let metrics =
            ParquetFileMetrics::new(partition_index, file.object_meta.location.as_ref(), metrics);
        Ok(Box::new(LocalFileReader {
            path: self.path.clone(),
            footer: Arc::clone(&self.footer),
            metrics,
        }))
    }
}

/// One scan partition's reader of the file.
struct LocalFileReader {
    path: PathBuf,
    footer: Arc<ParquetMetaData>,
    metrics: ParquetFileMetrics,
}

impl LocalFileReader {
    /// `ranges` of the file, read on a blocking thread (as `object_store`
    /// reads local files), counted as bytes scanned.
    fn read(&self, ranges: Vec<Range<u64>>) -> BoxFuture<'static, ParquetResult<Vec<Bytes>>> {
        let total: u64 = ranges.iter().map(|r| r.end.saturating_sub(r.start)).sum();
        self.metrics
            .bytes_scanned
            .add(usize::try_from(total).unwrap_or(usize::MAX));
        let path = self.path.clone();
        async move {
            tokio::task::spawn_blocking(move || read_ranges(&path, &ranges))
                .await
                .map_err(|e| ParquetError::External(Box::new(e)))?
                .map_err(|e| ParquetError::External(Box::new(e)))
        }
        .boxed()
    }
}

impl AsyncFileReader for LocalFileReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, ParquetResult<Bytes>> {
        self.read(vec![range])
            .map(|read| read.map(|mut bytes| bytes.remove(0)))
            .boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, ParquetResult<Vec<Bytes>>> {
        self.read(ranges)
    }

    fn get_metadata<'a>(
        &'a mut self,
        _options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, ParquetResult<Arc<ParquetMetaData>>> {
        futures::future::ready(Ok(Arc::clone(&self.footer))).boxed()
    }
}

/// `ranges` of the file at `path`, each into a buffer of its length that
/// the file fills (`read_to_end` reads into reserved space without
/// initializing it first); a range past the end is an error.
// pub for the tests in tests/unit/exec_split_scan_local_reader.rs
#[doc(hidden)]
pub fn read_ranges(path: &Path, ranges: &[Range<u64>]) -> io::Result<Vec<Bytes>> {
    let mut file = File::open(path)?;
    ranges
        .iter()
        .map(|range| {
            let refused = |kind, why| {
                let (start, end) = (range.start, range.end);
                io::Error::new(
                    kind,
                    format!("{}: bytes {start}..{end} {why}", path.display()),
                )
            };
            let Some(bytes) = range.end.checked_sub(range.start) else {
                return Err(refused(
                    io::ErrorKind::InvalidInput,
                    "end before they start",
                ));
            };
            let length = usize::try_from(bytes)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            let mut buffer = Vec::with_capacity(length);
            file.seek(SeekFrom::Start(range.start))?;
            (&mut file).take(bytes).read_to_end(&mut buffer)?;
            if buffer.len() != length {
                return Err(refused(
                    io::ErrorKind::UnexpectedEof,
                    "are past the end of the file",
                ));
            }
            Ok(Bytes::from(buffer))
        })
        .collect()
}

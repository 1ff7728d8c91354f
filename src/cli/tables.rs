//! `--table NAME=PATH`: registering a file, or a directory of files, as a
//! table; and the same checks for DataFusion's URL tables
//! (`SELECT * FROM 'dir/'`).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::DataType;
use datafusion::catalog::{DynamicFileCatalog, TableProvider, UrlTableFactory};
use datafusion::common::DataFusionError;
use datafusion::datasource::dynamic_file::DynamicListTableFactory;
use datafusion::datasource::file_format::options::ArrowReadOptions;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::prelude::{CsvReadOptions, JsonReadOptions, ParquetReadOptions, SessionContext};

use super::{catch_panic, error_line, Error, Result};

/// The file formats `--table` can register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableFormat {
    Csv,
    Parquet,
    Json,
    Arrow,
}

impl TableFormat {
    /// The format of a file with extension `ext` (without the dot, any case).
    pub fn from_extension(ext: &str) -> Option<Self> {
        match ext.to_ascii_lowercase().as_str() {
            "csv" => Some(Self::Csv),
            "parquet" => Some(Self::Parquet),
            "json" | "ndjson" => Some(Self::Json),
            "arrow" | "ipc" | "feather" => Some(Self::Arrow),
            _ => None,
        }
    }
}

/// Registers the file at `path` as table `name`, choosing the reader by extension.
/// A panic of a file reader (e.g. on a corrupt Parquet footer) is an error.
pub(crate) async fn register_table(ctx: &SessionContext, name: &str, path: &Path) -> Result<()> {
    let refuse = |reason: String| -> Error {
        format!(
            "cannot register table '{name}' from '{}': {reason}",
            path.display()
        )
        .into()
    };
    // A directory is a partitioned data set: its files' extension gives the
    // format, its `KEY=VALUE` directories the partition columns (typed as
    // DataFusion's URL tables type them, so both read the same table).
    let (ext, partitions, paths) = if path.is_dir() {
        let files = DataFiles::of(path).map_err(refuse)?;
        let ext = files.extension().map_err(refuse)?;
        let partitions: Vec<(String, DataType)> = files
            .partition_keys()
            .map_err(refuse)?
            .into_iter()
            .map(|k| (k, partition_type()))
            .collect();
        (ext, partitions, files.paths)
    } else {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or("")
            .to_string();
        (ext, vec![], vec![path.to_path_buf()])
    };
    let ext = ext.as_str();
    let format = TableFormat::from_extension(ext).ok_or_else(|| {
        refuse(match ext {
            "" => format!(
                "the file has no extension to tell its format; rename it to end in one of \
                 {SUPPORTED_EXTENSIONS}"
            ),
            _ => format!(
                "unsupported file extension '.{ext}'; rename the file to end in one of \
                 {SUPPORTED_EXTENSIONS}"
            ),
        })
    })?;
    if format == TableFormat::Parquet {
        for file in &paths {
            parquet_footer(file).map_err(|reason| match path.is_dir() {
                true => refuse(format!("'{}': {reason}", file.display())),
                false => refuse(reason),
            })?;
        }
    }
    let location = path
        .to_str()
        .ok_or_else(|| format!("path '{}' is not valid UTF-8", path.display()))?;
    // DataFusion reads a location ending in `/` as a directory of files.
    let location = if path.is_dir() && !location.ends_with('/') {
        format!("{location}/")
    } else {
        location.to_string()
    };
    let location = location.as_str();
    // Readers only pick files with their configured extension, so use the real one.
    let file_extension = format!(".{ext}");
    let registered = catch_panic(async {
        match format {
            TableFormat::Csv => {
                let options = CsvReadOptions::new()
                    .has_header(true)
                    .file_extension(&file_extension)
                    .table_partition_cols(partitions);
                ctx.register_csv(name, location, options).await
            }
            TableFormat::Parquet => {
                let options = ParquetReadOptions::default()
                    .file_extension(&file_extension)
                    .table_partition_cols(partitions);
                ctx.register_parquet(name, location, options).await
            }
            TableFormat::Json => {
                let options = JsonReadOptions::default()
                    .file_extension(&file_extension)
                    .table_partition_cols(partitions);
                ctx.register_json(name, location, options).await
            }
            TableFormat::Arrow => {
                let options = ArrowReadOptions {
                    file_extension: &file_extension,
                    table_partition_cols: partitions,
                    ..Default::default()
                };
                ctx.register_arrow(name, location, options).await
            }
        }
    })
    .await;
    match registered {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(refuse(error_line(&e))),
        Err(panic) => Err(refuse(panic.to_string())),
    }
}

/// The file extensions `--table` reads, as listed in messages.
const SUPPORTED_EXTENSIONS: &str = ".csv, .parquet, .json, .ndjson, .arrow, .ipc or .feather";

/// Checks that the file at `path` ends as a Parquet file does: its footer
/// (metadata length, then `PAR1`) within the file, after the leading
/// `PAR1`. A file that does not is refused here, before the Parquet reader
/// reads a length it cannot trust.
fn parquet_footer(path: &Path) -> Result<(), String> {
    let unreadable = |e: std::io::Error| format!("cannot read the file: {e}");
    let mut file = std::fs::File::open(path).map_err(unreadable)?;
    let size = file.metadata().map_err(unreadable)?.len();
    let mut head = [0u8; 4];
    let mut tail = [0u8; 8];
    if size >= 12 {
        file.read_exact(&mut head).map_err(unreadable)?;
        file.seek(SeekFrom::End(-8)).map_err(unreadable)?;
        file.read_exact(&mut tail).map_err(unreadable)?;
    }
    let metadata = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]));
    if size < 12 || &head != b"PAR1" || &tail[4..] != b"PAR1" {
        return Err(format!(
            "not a Parquet file ({size} bytes, without the PAR1 marks a Parquet file begins \
             and ends with)"
        ));
    }
    if metadata + 12 > size {
        return Err(format!(
            "a corrupt Parquet file: its footer gives {metadata} bytes of metadata, but the \
             file has {size} bytes"
        ));
    }
    Ok(())
}

/// The type of a partition column, as DataFusion's URL tables infer it.
fn partition_type() -> DataType {
    DataType::Dictionary(Box::new(DataType::UInt16), Box::new(DataType::Utf8))
}

/// The data files of a directory that DataFusion's listing reads: those
/// with a supported extension directly in it and in its partition
/// directories (named `KEY=VALUE`, at any depth).
#[derive(Debug, Default)]
struct DataFiles {
    /// How many files have each extension.
    extensions: BTreeMap<String, usize>,
    /// The partition keys, outermost first, on the way to each file.
    layouts: BTreeSet<Vec<String>>,
    /// The files.
    paths: Vec<PathBuf>,
}

impl DataFiles {
    /// The data files of directory `dir`.
    fn of(dir: &Path) -> Result<Self, String> {
        let mut files = Self::default();
        files.add(dir, &mut Vec::new())?;
        Ok(files)
    }

    /// Adds the data files under `dir`, reached through the partition
    /// directories of the keys `keys`.
    fn add(&mut self, dir: &Path, keys: &mut Vec<String>) -> Result<(), String> {
        let entries = std::fs::read_dir(dir)
            .map_err(|e| format!("cannot list directory '{}': {e}", dir.display()))?;
        for entry in entries {
            let path = entry
                .map_err(|e| format!("cannot list directory '{}': {e}", dir.display()))?
                .path();
            if path.is_dir() {
                let name = path.file_name().and_then(|name| name.to_str());
                if let Some((key, _)) = name.and_then(|name| name.split_once('=')) {
                    keys.push(key.to_string());
                    self.add(&path, keys)?;
                    keys.pop();
                }
            } else if let Some(ext) = path.extension().and_then(|e| e.to_str()) {
                if TableFormat::from_extension(ext).is_some() {
                    *self.extensions.entry(ext.to_string()).or_default() += 1;
                    self.layouts.insert(keys.clone());
                    self.paths.push(path);
                }
            }
        }
        Ok(())
    }

    /// The extension the files share. A table is read from the files of one
    /// extension (the readers skip the others), so files of several
    /// extensions are refused rather than read in part, as is a directory
    /// without data files.
    fn extension(&self) -> Result<String, String> {
        let mut extensions = self.extensions.keys();
        match (extensions.next(), extensions.next()) {
            (Some(ext), None) => Ok(ext.clone()),
            (None, _) => Err(format!(
                "the directory has no data files: put files ending in {SUPPORTED_EXTENSIONS} \
                 directly in it or in partition directories named KEY=VALUE (other \
                 subdirectories are not read)"
            )),
            (Some(_), Some(_)) => {
                let found: Vec<String> = self
                    .extensions
                    .iter()
                    .map(|(ext, n)| format!("{n} .{ext}"))
                    .collect();
                Err(format!(
                    "the directory mixes data files of several extensions ({} files), but a \
                     table is read from files of one extension; put the files of each \
                     extension in a directory of their own and register one table per directory",
                    found.join(", ")
                ))
            }
        }
    }

    /// The partition columns: the keys of the `KEY=VALUE` directories, the
    /// same on the way to every file (files at different depths or under
    /// other keys are refused: their rows would lack a column).
    fn partition_keys(&self) -> Result<Vec<String>, String> {
        let mut layouts = self.layouts.iter();
        match (layouts.next(), layouts.next()) {
            (Some(keys), None) => Ok(keys.clone()),
            (None, _) => Ok(vec![]),
            (Some(_), Some(_)) => {
                let found: Vec<String> = self
                    .layouts
                    .iter()
                    .map(|keys| match keys.is_empty() {
                        true => "(none)".to_string(),
                        false => keys.join("/"),
                    })
                    .collect();
                Err(format!(
                    "the directory's data files lie under partition directories of different \
                     keys ({}); every file of a partitioned table lies under the same KEY=VALUE \
                     levels",
                    found.join(", ")
                ))
            }
        }
    }
}

/// `ctx` with DataFusion's URL tables (`SELECT * FROM 'file.parquet'`, or
/// `'dir/'`), as `SessionContext::enable_url_table` installs them, but
/// refusing a local directory whose data files `--table` would refuse (of
/// several extensions: DataFusion reads those of one and silently skips the
/// others).
pub(crate) fn with_url_tables(ctx: SessionContext) -> SessionContext {
    let catalogs = Arc::clone(ctx.state().catalog_list());
    let listing = Arc::new(DynamicListTableFactory::new(Default::default()));
    let factory = Arc::new(CheckedUrlTables(Arc::clone(&listing)));
    let session_id = ctx.session_id();
    let ctx: SessionContext = SessionStateBuilder::new_from_existing(ctx.state())
        .with_session_id(session_id)
        .with_catalog_list(Arc::new(DynamicFileCatalog::new(catalogs, factory)))
        .build()
        .into();
    listing.session_store().with_state(ctx.state_weak_ref());
    ctx
}

/// DataFusion's URL table factory behind the checks of a local directory.
#[derive(Debug)]
struct CheckedUrlTables(Arc<DynamicListTableFactory>);

#[async_trait]
impl UrlTableFactory for CheckedUrlTables {
    async fn try_new(
        &self,
        url: &str,
    ) -> datafusion::error::Result<Option<Arc<dyn TableProvider>>> {
        let path = Path::new(url);
        if path.is_dir() {
            DataFiles::of(path)
                .and_then(|files| files.extension())
                .map_err(|reason| {
                    DataFusionError::Plan(format!("cannot read '{url}': {reason}"))
                })?;
        }
        self.0.try_new(url).await
    }
}

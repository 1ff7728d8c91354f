//! `--table NAME=PATH`: registering a file, or a directory of files, as a table.

use std::collections::BTreeMap;
use std::path::Path;

use datafusion::datasource::file_format::options::ArrowReadOptions;
use datafusion::prelude::{CsvReadOptions, JsonReadOptions, ParquetReadOptions, SessionContext};

use crate::{catch_panic, error_line, Error, Result};

/// The file formats `--table` can register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TableFormat {
    Csv,
    Parquet,
    Json,
    Arrow,
}

impl TableFormat {
    /// The format of a file with extension `ext` (without the dot, any case).
    pub(crate) fn from_extension(ext: &str) -> Option<Self> {
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
    // A directory is a partitioned data set: its files' extension gives the format.
    let ext = if path.is_dir() {
        directory_extension(path).map_err(refuse)?
    } else {
        path.extension()
            .and_then(|e| e.to_str())
            .unwrap_or("")
            .to_string()
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
                    .file_extension(&file_extension);
                ctx.register_csv(name, location, options).await
            }
            TableFormat::Parquet => {
                let options = ParquetReadOptions::default().file_extension(&file_extension);
                ctx.register_parquet(name, location, options).await
            }
            TableFormat::Json => {
                let options = JsonReadOptions::default().file_extension(&file_extension);
                ctx.register_json(name, location, options).await
            }
            TableFormat::Arrow => {
                let options = ArrowReadOptions {
                    file_extension: &file_extension,
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

/// The extension shared by the data files of directory `dir`: the files with
/// a supported extension that DataFusion's listing reads, those directly in
/// `dir` and in its partition directories (named `KEY=VALUE`, at any depth).
/// A table is read from the files of one extension (the readers skip the
/// others), so a directory whose data files have several extensions is
/// refused rather than read in part, as is one without data files.
fn directory_extension(dir: &Path) -> Result<String, String> {
    let mut counts = BTreeMap::new();
    count_data_files(dir, &mut counts)?;
    let mut extensions = counts.keys();
    match (extensions.next(), extensions.next()) {
        (Some(ext), None) => Ok(ext.clone()),
        (None, _) => Err(format!(
            "the directory has no data files: put files ending in {SUPPORTED_EXTENSIONS} \
             directly in it or in partition directories named KEY=VALUE (other subdirectories \
             are not read)"
        )),
        (Some(_), Some(_)) => {
            let found: Vec<String> = counts
                .iter()
                .map(|(ext, n)| format!("{n} .{ext}"))
                .collect();
            Err(format!(
                "the directory mixes data files of several extensions ({} files), but a table \
                 is read from files of one extension; put the files of each extension in a \
                 directory of their own and register one table per directory",
                found.join(", ")
            ))
        }
    }
}

/// Adds the data files of `dir` (see [`directory_extension`]) to `counts`,
/// the number of files by extension.
fn count_data_files(dir: &Path, counts: &mut BTreeMap<String, usize>) -> Result<(), String> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot list directory '{}': {e}", dir.display()))?;
    for entry in entries {
        let path = entry
            .map_err(|e| format!("cannot list directory '{}': {e}", dir.display()))?
            .path();
        if path.is_dir() {
            let partition = path
                .file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.contains('='));
            if partition {
                count_data_files(&path, counts)?;
            }
        } else if let Some(ext) = path.extension().and_then(|e| e.to_str()) {
            if TableFormat::from_extension(ext).is_some() {
                *counts.entry(ext.to_string()).or_default() += 1;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_formats_by_extension() {
        assert_eq!(TableFormat::from_extension("CSV"), Some(TableFormat::Csv));
        assert_eq!(
            TableFormat::from_extension("ndjson"),
            Some(TableFormat::Json)
        );
        assert_eq!(
            TableFormat::from_extension("feather"),
            Some(TableFormat::Arrow)
        );
        assert_eq!(TableFormat::from_extension("txt"), None);
    }
}

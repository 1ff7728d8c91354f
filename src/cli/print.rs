//! Printing query results: the output formats, `--maxrows`, and the
//! summary line.

use std::io::{self, Write};
use std::sync::{Arc, LazyLock};
use std::time::Instant;

use arrow::array::{Array, ArrayRef, AsArray, Float64Array, RecordBatch, StringBuilder};
use arrow::datatypes::{DataType, Field, FieldRef, Float64Type, Schema, SchemaRef};
use arrow::error::ArrowError;
use arrow::json::writer::{make_encoder, Encoder, EncoderFactory, EncoderOptions, NullableEncoder};
use arrow::util::pretty::pretty_format_batches;
use clap::ValueEnum;

use super::{CliError, Result};

/// Output format of query results (`--format`, `\pset format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// A table, except for an unbounded source, whose rows are streamed as CSV
    /// as they arrive (datafusion-cli's default)
    Automatic,
    /// An ASCII table (at most --maxrows rows shown)
    Table,
    /// CSV with a header line (struct and list cells as JSON text)
    Csv,
    /// Tab-separated values with a header line (struct and list cells as JSON text)
    Tsv,
    /// A JSON array of objects
    Json,
    /// One JSON object per line
    #[value(alias = "nd-json")]
    Ndjson,
}

impl Format {
    /// The format's name, as `--format` takes it.
    pub(crate) fn name(self) -> String {
        self.to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default()
    }

    /// The names of all formats, for messages.
    pub fn all_names() -> String {
        Format::value_variants()
            .iter()
            .map(|f| f.name())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The format named `name` (any case; `nd-json` for `ndjson`).
    pub fn parse(name: &str) -> Result<Format, CliError> {
        Format::from_str(name, true).map_err(|_| CliError::UnknownFormat(name.to_string()))
    }
}

/// How many rows a table shows (`--maxrows N|inf`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxRows {
    /// Every row.
    Unlimited,
    /// At most this many.
    Limited(usize),
}

impl MaxRows {
    /// The limit as a number of rows.
    pub(crate) fn rows(self) -> usize {
        match self {
            MaxRows::Unlimited => usize::MAX,
            MaxRows::Limited(n) => n,
        }
    }
}

/// Parses a `--maxrows` value: a number of rows, or `inf` (also `infinite`,
/// `none`) for all of them.
pub fn parse_maxrows(value: &str) -> Result<MaxRows, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "inf" | "infinite" | "none" => Ok(MaxRows::Unlimited),
        n => n
            .parse()
            .map(MaxRows::Limited)
            .map_err(|_| format!("expected a number of rows or inf (no limit), got '{value}'")),
    }
}

/// Writes query results to stdout (and the summary line to stderr).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Printer {
    pub(crate) format: Format,
    pub(crate) quiet: bool,
    pub(crate) maxrows: MaxRows,
}

impl Printer {
    /// Whether the results are printed as a table (`automatic` for a bounded
    /// result, as `table`).
    pub(crate) fn is_table(&self) -> bool {
        matches!(self.format, Format::Table | Format::Automatic)
    }

    /// Prints all rows of `batches` (a table shows the first `--maxrows`).
    pub(crate) fn print_collected(
        &self,
        schema: &SchemaRef,
        batches: &[RecordBatch],
        start: Instant,
    ) -> Result<()> {
        let rows = batches.iter().map(RecordBatch::num_rows).sum();
        let limit = match self.is_table() {
            true => self.maxrows.rows(),
            false => usize::MAX,
        };
        let mut shown = Vec::new();
        let mut kept = 0;
        for batch in batches {
            if kept >= limit {
                break;
            }
            let batch = batch.slice(0, batch.num_rows().min(limit - kept));
            kept += batch.num_rows();
            shown.push(batch);
        }
        self.print(schema, &shown, rows, start)
    }

    /// Prints the `batches` of a statement started at `start`, which
    /// produced `rows` rows (more than `batches` hold where a table shows
    /// only the first `--maxrows`).
    pub(crate) fn print(
        &self,
        schema: &SchemaRef,
        batches: &[RecordBatch],
        rows: usize,
        start: Instant,
    ) -> Result<()> {
        let mut out = io::stdout().lock();
        let shown: usize = batches.iter().map(RecordBatch::num_rows).sum();
        if !schema.fields().is_empty() {
            // Without batches, print an empty one so the header still appears.
            let empty;
            let batches = if batches.is_empty() {
                empty = [RecordBatch::new_empty(Arc::clone(schema))];
                &empty[..]
            } else {
                batches
            };
            match self.format {
                Format::Table | Format::Automatic => {
                    if self.maxrows != MaxRows::Limited(0) || rows == 0 {
                        writeln!(out, "{}", table(batches, rows > shown)?)?;
                    }
                }
                format => write_batches(&mut out, format, batches, true)?,
            }
        }
        out.flush()?;
        if self.is_table() && !self.quiet {
            let elided = match rows > shown {
                true => format!(" (First {shown} displayed. Use --maxrows to adjust.)"),
                false => String::new(),
            };
            eprintln!(
                "{rows} row(s) fetched.{elided} Elapsed {:.3} seconds.",
                start.elapsed().as_secs_f64()
            );
        }
        Ok(())
    }
}

/// `batches` as an ASCII table; with `elided`, three rows of dots at its end
/// say that more rows were fetched than are shown.
pub fn table(batches: &[RecordBatch], elided: bool) -> Result<String> {
    let table = pretty_format_batches(batches)?.to_string();
    if !elided {
        return Ok(table);
    }
    let Some((body, border)) = table.rsplit_once('\n') else {
        return Ok(table);
    };
    let dots: Vec<String> = border
        .split('+')
        .filter(|segment| !segment.is_empty())
        .map(|segment| format!(" {:<1$} ", ".", segment.len().saturating_sub(2)))
        .collect();
    let dots = format!("|{}|", dots.join("|"));
    Ok(format!("{body}\n{dots}\n{dots}\n{dots}\n{border}"))
}

/// Writes non-empty `batches` to `out` in `format` (not a table); CSV and
/// TSV with a header line when `header`.
pub(crate) fn write_batches(
    out: &mut impl Write,
    format: Format,
    batches: &[RecordBatch],
    header: bool,
) -> Result<()> {
    match format {
        Format::Table | Format::Automatic => writeln!(out, "{}", table(batches, false)?)?,
        Format::Csv | Format::Tsv => {
            let delimiter = if format == Format::Csv { b',' } else { b'\t' };
            let mut writer = arrow::csv::WriterBuilder::new()
                .with_header(header)
                .with_delimiter(delimiter)
                .build(&mut *out);
            for batch in batches {
                writer.write(&nested_as_json(batch)?)?;
            }
        }
        Format::Json => {
            let mut writer = arrow::json::WriterBuilder::new()
                .with_explicit_nulls(true)
                .with_encoder_factory(Arc::new(NonFiniteAsStrings))
                .build::<_, arrow::json::writer::JsonArray>(&mut *out);
            for batch in batches {
                writer.write(batch)?;
            }
            writer.finish()?;
            drop(writer);
            writeln!(out)?;
        }
        Format::Ndjson => {
            let mut writer = arrow::json::WriterBuilder::new()
                .with_explicit_nulls(true)
                .with_encoder_factory(Arc::new(NonFiniteAsStrings))
                .build::<_, arrow::json::writer::LineDelimited>(&mut *out);
            for batch in batches {
                writer.write(batch)?;
            }
            writer.finish()?;
        }
    }
    Ok(())
}

/// Whether values of `data_type` are written as JSON text in CSV and TSV
/// cells (Arrow's CSV writer has no text for them).
fn is_nested(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Struct(_)
            | DataType::List(_)
            | DataType::LargeList(_)
            | DataType::FixedSizeList(..)
            | DataType::ListView(_)
            | DataType::LargeListView(_)
            | DataType::Map(..)
            | DataType::Union(..)
    )
}

/// `batch` with each struct, list (tensor) or map column replaced by a text
/// column holding each value as JSON, written as the `json` format writes it
/// (NaN and infinities as strings); a NULL value stays NULL (an empty cell).
fn nested_as_json(batch: &RecordBatch) -> Result<RecordBatch> {
    let schema = batch.schema();
    if !schema.fields().iter().any(|f| is_nested(f.data_type())) {
        return Ok(batch.clone());
    }
    let options = EncoderOptions::default()
        .with_explicit_nulls(true)
        .with_encoder_factory(Arc::new(NonFiniteAsStrings));
    let mut fields = Vec::with_capacity(schema.fields().len());
    let mut columns = Vec::with_capacity(schema.fields().len());
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        if !is_nested(field.data_type()) {
            fields.push(Arc::clone(field));
            columns.push(Arc::clone(column));
            continue;
        }
        let mut encoder = make_encoder(field, column.as_ref(), &options)?;
        let mut text = StringBuilder::new();
        let mut buffer = Vec::new();
        for row in 0..column.len() {
            if column.is_null(row) {
                text.append_null();
                continue;
            }
            buffer.clear();
            encoder.encode(row, &mut buffer);
            text.append_value(String::from_utf8_lossy(&buffer));
        }
        fields.push(Arc::new(Field::new(field.name(), DataType::Utf8, true)));
        columns.push(Arc::new(text.finish()) as ArrayRef);
    }
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}

/// Makes the JSON writers write NaN, +inf and -inf floating-point values as
/// the strings `"NaN"`, `"inf"` and `"-inf"` (as the table and CSV formats
/// print them), where Arrow writes `null`, which reads as SQL NULL. Finite
/// values are written by Arrow's own encoder; elements of lists and structs
/// too.
#[derive(Debug)]
struct NonFiniteAsStrings;

/// Encoder options without an encoder factory: Arrow's own encoders.
static ARROW_ENCODING: LazyLock<EncoderOptions> = LazyLock::new(EncoderOptions::default);

impl EncoderFactory for NonFiniteAsStrings {
    fn make_default_encoder<'a>(
        &self,
        field: &'a FieldRef,
        array: &'a dyn Array,
        _options: &'a EncoderOptions,
    ) -> Result<Option<NullableEncoder<'a>>, ArrowError> {
        if !matches!(
            array.data_type(),
            DataType::Float16 | DataType::Float32 | DataType::Float64
        ) {
            return Ok(None);
        }
        let values = arrow::compute::cast(array, &DataType::Float64)?
            .as_primitive::<Float64Type>()
            .clone();
        let finite = make_encoder(field, array, &ARROW_ENCODING)?;
        let encoder = FloatEncoder { values, finite };
        Ok(Some(NullableEncoder::new(
            Box::new(encoder),
            array.nulls().cloned(),
        )))
    }
}

/// The encoder of [`NonFiniteAsStrings`] for one floating-point array.
struct FloatEncoder<'a> {
    /// The array's values, as `f64`.
    values: Float64Array,
    /// Arrow's encoder of the array, for its finite values.
    finite: NullableEncoder<'a>,
}

impl Encoder for FloatEncoder<'_> {
    fn encode(&mut self, idx: usize, out: &mut Vec<u8>) {
        let value = self.values.value(idx);
        if value.is_finite() {
            self.finite.encode(idx, out);
        } else {
            // Rust prints them as NaN, inf and -inf.
            out.extend_from_slice(format!("\"{value}\"").as_bytes());
        }
    }
}

/// A schema of one text column per name in `names`, and a batch of `rows`
/// (each a row of texts) in it: the tables that meta-commands print.
pub fn text_batch(names: &[&str], rows: &[Vec<String>]) -> Result<(SchemaRef, RecordBatch)> {
    let schema = Arc::new(Schema::new(
        names
            .iter()
            .map(|name| Field::new(*name, DataType::Utf8, false))
            .collect::<Vec<_>>(),
    ));
    let columns = (0..names.len())
        .map(|i| {
            let mut column = StringBuilder::new();
            for row in rows {
                column.append_value(&row[i]);
            }
            Arc::new(column.finish()) as ArrayRef
        })
        .collect();
    let batch = RecordBatch::try_new(Arc::clone(&schema), columns)?;
    Ok((schema, batch))
}

//! Unit tests of `src/cli/tables.rs`: `--table` formats.

use datafusion_grad::cli::tables::TableFormat;

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

//! Unit tests of `src/cli/print.rs`: output formats.

use datafusion_grad::cli::print::{parse_maxrows, table, text_batch, Format, MaxRows};

#[test]
fn parses_maxrows() {
    assert_eq!(parse_maxrows("10").unwrap(), MaxRows::Limited(10));
    assert_eq!(parse_maxrows("INF").unwrap(), MaxRows::Unlimited);
    assert!(parse_maxrows("-1").is_err());
}

#[test]
fn elided_tables_end_in_dots() {
    let (_, batch) = text_batch(&["ab"], &[vec!["x".to_string()]]).unwrap();
    let out = table(&[batch], true).unwrap();
    assert_eq!(
        out,
        "+----+\n| ab |\n+----+\n| x  |\n| .  |\n| .  |\n| .  |\n+----+"
    );
}

#[test]
fn format_names() {
    assert_eq!(Format::parse("nd-json").unwrap(), Format::Ndjson);
    assert_eq!(Format::parse("TSV").unwrap(), Format::Tsv);
    assert!(Format::parse("xml").is_err());
    assert_eq!(
        Format::all_names(),
        "automatic, table, csv, tsv, json, ndjson"
    );
}

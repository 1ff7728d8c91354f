//! Unit tests of `src/export/tidy.rs`: floats as each engine reads them.

use datafusion_grad::export::tidy::float_text;
use datafusion_grad::export::SqlDialect;

#[test]
fn floats_are_short_and_typed() {
    assert_eq!(float_text("0.5", SqlDialect::Postgres).unwrap(), "0.5");
    assert_eq!(float_text("0.5", SqlDialect::DuckDb).unwrap(), "0.5e0");
    let tiny = format!("0.{}1", "0".repeat(299));
    assert_eq!(float_text(&tiny, SqlDialect::Sqlite).unwrap(), "1e-300");
    assert_eq!(float_text("12", SqlDialect::DuckDb), None);
}

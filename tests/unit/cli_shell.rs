//! Unit tests of `src/cli/shell.rs`: splitting input into statements.

use datafusion_grad::cli::shell::{split_statements, split_terminated};

#[test]
fn splits_and_skips_empty_statements() {
    assert_eq!(
        split_statements("SELECT 1; ;\n SELECT 2;;"),
        vec!["SELECT 1", "SELECT 2"]
    );
    assert_eq!(split_statements("SELECT 1"), vec!["SELECT 1"]);
    assert!(split_statements("  ; -- only a comment\n /* c; */ ;").is_empty());
}

#[test]
fn ignores_semicolons_in_strings_and_comments() {
    assert_eq!(
        split_statements("SELECT 'a;''b'; -- x; y\nSELECT \"c;d\" /* ; */ FROM t;"),
        vec!["SELECT 'a;''b'", "-- x; y\nSELECT \"c;d\" /* ; */ FROM t"]
    );
}

#[test]
fn keeps_what_follows_the_last_semicolon() {
    let split = split_terminated("SELECT 1; SELECT 'a;\n");
    assert_eq!(split.complete, vec!["SELECT 1"]);
    assert_eq!(split.rest, " SELECT 'a;\n");
    assert!(split.rest_has_content);
    // an open block comment is kept, so that the next lines stay in it
    let split = split_terminated("SELECT 1; /* open; comment\n");
    assert_eq!(split.rest, " /* open; comment\n");
    assert!(!split.rest_has_content);
    assert!(split.in_block_comment);
}

//! Unit tests of `src/cli/mod.rs`: the command line's parsers and messages.

use std::path::PathBuf;

use datafusion_grad::cli::{
    crate_relative, one_line, parse_batch_size, parse_memory_size, parse_table_arg, CliError,
};

#[test]
fn error_messages_on_one_line() {
    assert_eq!(
        one_line("datafusion_grad\ncaused by\nExternal error: a\n  b"),
        "datafusion_grad: External error: a b"
    );
}

#[test]
fn panic_locations_start_at_the_crate() {
    assert_eq!(
        crate_relative("/root/.cargo/registry/src/index.crates.io-1949/parquet-59.3.2/src/a.rs"),
        "parquet-59.3.2/src/a.rs"
    );
    assert_eq!(crate_relative("src/bin/dfgrad.rs"), "src/bin/dfgrad.rs");
}

#[test]
fn parses_table_args() {
    assert_eq!(
        parse_table_arg("t=data/a=b.csv").unwrap(),
        ("t".to_string(), PathBuf::from("data/a=b.csv"))
    );
    assert!(parse_table_arg("nopath").is_err());
    assert!(parse_table_arg("=x.csv").is_err());
}

#[test]
fn parses_sizes_and_batch_sizes() {
    assert_eq!(parse_memory_size("512").unwrap(), 512);
    assert_eq!(parse_memory_size("2k").unwrap(), 2048);
    assert_eq!(parse_memory_size("1GB").unwrap(), 1 << 30);
    for bad in ["", "g", "1.5g", "10x", "-1m", "0"] {
        assert!(parse_memory_size(bad).is_err(), "{bad}");
    }
    assert_eq!(parse_batch_size("64").unwrap(), 64);
    assert!(parse_batch_size("0").is_err());
    assert!(parse_batch_size("many").is_err());
}

#[test]
fn refusals_are_one_sentence() {
    let refusals = [
        CliError::UnknownCommand("\\x".to_string()),
        CliError::CommandArgument {
            command: "\\q".to_string(),
            expected: "no argument",
            got: "now".to_string(),
        },
        CliError::UnknownFunction("nope".to_string()),
        CliError::UnknownFormat("xml".to_string()),
        CliError::UnboundedFinalResult,
        CliError::Conflict("--rewrite needs -c or -f"),
    ];
    for refusal in refusals {
        let text = refusal.to_string();
        assert!(!text.contains('\n') && !text.ends_with('.'), "{text}");
        assert!(!text.contains(". "), "{text}");
    }
}

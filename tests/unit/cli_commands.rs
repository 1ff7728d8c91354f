//! Unit tests of `src/cli/commands.rs`: meta-commands and `\h`.

use datafusion_grad::cli::commands::{first_sentence, functions, Meta};
use datafusion_grad::cli::print::Format;
use datafusion_grad::cli::CliError;

#[test]
fn parses_meta_commands() {
    assert!(Meta::parse("SELECT 1").is_none());
    assert_eq!(Meta::parse(" \\q ").unwrap().unwrap(), Meta::Quit);
    assert_eq!(Meta::parse("\\d;").unwrap().unwrap(), Meta::ListTables);
    assert_eq!(
        Meta::parse("\\d  points").unwrap().unwrap(),
        Meta::Describe("points".to_string())
    );
    assert_eq!(
        Meta::parse("\\pset format CSV").unwrap().unwrap(),
        Meta::SetFormat(Format::Csv)
    );
    assert_eq!(
        Meta::parse("\\quiet off").unwrap().unwrap(),
        Meta::Quiet(Some(false))
    );
    assert!(matches!(
        Meta::parse("\\x").unwrap(),
        Err(CliError::UnknownCommand(_))
    ));
    assert!(matches!(
        Meta::parse("\\q now").unwrap(),
        Err(CliError::CommandArgument { .. })
    ));
    assert!(matches!(
        Meta::parse("\\pset format xml").unwrap(),
        Err(CliError::UnknownFormat(_))
    ));
}

#[test]
fn lists_every_function_with_a_description() {
    let functions = functions();
    assert_eq!(functions[0].name, "grad");
    assert!(functions.iter().any(|f| f.name == "matmul"));
    assert!(functions
        .iter()
        .any(|f| f.name == "tensor_avg" && f.kind == "aggregate"));
    for f in &functions {
        assert!(!f.description.is_empty(), "{}", f.name);
    }
    assert_eq!(first_sentence("One. Two."), "One.");
}

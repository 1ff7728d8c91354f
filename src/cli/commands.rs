//! Meta-commands of the interactive shell and of piped input, as in
//! datafusion-cli: `\?`, `\q`, `\d`, `\d NAME`, `\h`, `\h NAME`,
//! `\quiet [true|false]`, `\pset format FORMAT`.

use std::time::Instant;

use datafusion::logical_expr::Documentation;

use super::print::{text_batch, Format};
use super::shell::Shell;
use super::{CliError, Result};

/// A meta-command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Meta {
    /// `\q`
    Quit,
    /// `\?`
    Help,
    /// `\d`
    ListTables,
    /// `\d NAME`
    Describe(String),
    /// `\h`
    ListFunctions,
    /// `\h NAME`
    DescribeFunction(String),
    /// `\quiet [true|false]`
    Quiet(Option<bool>),
    /// `\pset format FORMAT`
    SetFormat(Format),
}

/// What a meta-command asks of the input loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MetaOutcome {
    Done,
    Quit,
}

/// The meta-commands and what they do, as `\?` lists them.
const HELP: &[(&str, &str)] = &[
    ("\\?", "list these commands"),
    ("\\q", "quit dfgrad"),
    ("\\d", "list tables (SHOW TABLES)"),
    ("\\d NAME", "describe table NAME (SHOW COLUMNS FROM NAME)"),
    ("\\h", "list datafusion-grad's SQL functions"),
    ("\\h NAME", "describe SQL function NAME"),
    (
        "\\quiet [true|false]",
        "show or set quiet mode (no row counts and timings)",
    ),
    (
        "\\pset format FORMAT",
        "set the output format (as --format)",
    ),
];

impl Meta {
    /// The meta-command `line` is, if it starts with `\` (surrounding
    /// whitespace and a final `;` ignored); an error if it is not one.
    pub fn parse(line: &str) -> Option<Result<Meta, CliError>> {
        let line = line.trim();
        let command = line.strip_prefix('\\')?;
        let command = command.strip_suffix(';').unwrap_or(command).trim();
        let (name, argument) = match command.split_once(char::is_whitespace) {
            Some((name, argument)) => (name, Some(argument.trim())),
            None => (command, None),
        };
        let invalid = |expected: &'static str| CliError::CommandArgument {
            command: format!("\\{name}"),
            expected,
            got: argument.unwrap_or("").to_string(),
        };
        Some(match (name, argument) {
            ("q" | "quit", None) => Ok(Meta::Quit),
            ("?", None) => Ok(Meta::Help),
            ("d", None) => Ok(Meta::ListTables),
            ("d", Some(table)) => Ok(Meta::Describe(table.to_string())),
            ("h", None) => Ok(Meta::ListFunctions),
            ("h", Some(function)) => Ok(Meta::DescribeFunction(function.to_string())),
            ("quiet", None) => Ok(Meta::Quiet(None)),
            ("quiet", Some(value)) => match value.to_ascii_lowercase().as_str() {
                "true" | "t" | "yes" | "y" | "on" => Ok(Meta::Quiet(Some(true))),
                "false" | "f" | "no" | "n" | "off" => Ok(Meta::Quiet(Some(false))),
                _ => Err(invalid("true or false")),
            },
            ("pset", Some(setting)) => match setting.split_once(char::is_whitespace) {
                Some(("format", format)) => Format::parse(format.trim()).map(Meta::SetFormat),
                _ => Err(invalid("`format FORMAT`")),
            },
            ("pset", None) => Err(invalid("`format FORMAT`")),
            ("q" | "quit" | "?", Some(_)) => Err(invalid("no argument")),
            _ => Err(CliError::UnknownCommand(line.to_string())),
        })
    }
}

/// Runs `meta` in `shell`.
pub(crate) async fn run(shell: &mut Shell, meta: Meta) -> Result<MetaOutcome> {
    let start = Instant::now();
    match meta {
        Meta::Quit => return Ok(MetaOutcome::Quit),
        Meta::Help => {
            let rows: Vec<Vec<String>> = HELP
                .iter()
                .map(|(c, d)| vec![c.to_string(), d.to_string()])
                .collect();
            let (schema, batch) = text_batch(&["command", "description"], &rows)?;
            shell.printer.print(&schema, &[batch], rows.len(), start)?;
        }
        Meta::ListTables => shell.run_statement("SHOW TABLES").await?,
        Meta::Describe(table) => {
            shell
                .run_statement(&format!("SHOW COLUMNS FROM {table}"))
                .await?
        }
        Meta::ListFunctions => {
            let rows: Vec<Vec<String>> = functions()
                .into_iter()
                .map(|f| vec![f.name, f.kind.to_string(), first_sentence(&f.description)])
                .collect();
            let (schema, batch) = text_batch(&["function", "kind", "description"], &rows)?;
            shell.printer.print(&schema, &[batch], rows.len(), start)?;
        }
        Meta::DescribeFunction(name) => println!("{}", describe_function(shell, &name)?),
        Meta::Quiet(None) => println!("Quiet mode is {}.", shell.printer.quiet),
        // A setting's confirmation is a status line, as the row counts
        // are: on stderr (stdout holds only the data, also of an rc file's
        // settings ahead of it), and not at all in quiet mode.
        Meta::Quiet(Some(quiet)) => {
            shell.printer.quiet = quiet;
            if !quiet {
                eprintln!("Quiet mode is {quiet}.");
            }
        }
        Meta::SetFormat(format) => {
            shell.printer.format = format;
            if !shell.printer.quiet {
                eprintln!("Output format is {}.", format.name());
            }
        }
    }
    Ok(MetaOutcome::Done)
}

/// One of datafusion-grad's SQL functions, as `\h` lists it.
pub struct Function {
    /// Its name.
    pub name: String,
    /// `scalar` or `aggregate`.
    pub kind: &'static str,
    syntax: String,
    /// What it computes.
    pub description: String,
    example: Option<String>,
}

impl Function {
    fn documented(name: &str, kind: &'static str, doc: Option<&Documentation>) -> Self {
        Function {
            name: name.to_string(),
            kind,
            syntax: doc.map_or_else(|| format!("{name}(…)"), |d| d.syntax_example.clone()),
            description: doc.map_or_else(String::new, |d| d.description.clone()),
            example: doc.and_then(|d| d.sql_example.clone()),
        }
    }
}

/// The differentiation functions, which carry no DataFusion documentation.
const MARKERS: &[(&str, &str, &str, &str)] = &[
    (
        "grad",
        "grad(f, x) | grad(f, x1, x2, …)",
        "The derivative of f with respect to x at each row (DOUBLE, or a tensor of x's shape); \
         with several variables all partials in one reverse sweep, as a struct with one field \
         per variable.",
        "SELECT grad(x * x * y, x) FROM (VALUES (3.0, 2.0)) t(x, y); -- 12.0",
    ),
    (
        "jvp",
        "jvp(f, x1, t1 [, x2, t2 …])",
        "Forward mode: the derivative of f in the direction of the tangents, Σ ∂f/∂xᵢ·tᵢ.",
        "SELECT jvp(x * y, x, 1.0, y, 0.5) FROM (VALUES (2.0, 5.0)) t(x, y); -- 6.0",
    ),
    (
        "vjp",
        "vjp(f, x1, u [, x2 …])",
        "Reverse mode with the cotangent u: u·∂f/∂xᵢ (a struct for several variables).",
        "SELECT vjp(sin(x), x, 2.0) FROM (VALUES (0.0)) t(x); -- 2.0",
    ),
    (
        "differentiate_sql",
        "differentiate_sql(expr, wrt [, dialect])",
        "The derivative of the SQL expression text expr with respect to the column wrt, as \
         SQL text of dialect (datafusion, duckdb, postgres, sqlite or generic).",
        "SELECT differentiate_sql('x * y + sin(x)', 'x', 'duckdb'); -- (cos(x) + y)",
    ),
];

/// datafusion-grad's SQL functions: the differentiation functions, then the
/// tensor functions and aggregates by name.
pub fn functions() -> Vec<Function> {
    let mut tensor: Vec<Function> = crate::tensor::functions()
        .iter()
        .map(|f| Function::documented(f.name(), "scalar", f.documentation()))
        .chain(
            crate::tensor::aggregates()
                .iter()
                .map(|a| Function::documented(a.name(), "aggregate", a.documentation())),
        )
        .collect();
    tensor.sort_by(|a, b| a.name.cmp(&b.name));
    MARKERS
        .iter()
        .map(|(name, syntax, description, example)| Function {
            name: name.to_string(),
            kind: "scalar",
            syntax: syntax.to_string(),
            description: description.to_string(),
            example: Some(example.to_string()),
        })
        .chain(tensor)
        .collect()
}

/// The first sentence of `text` (up to the first `. ` or the end).
pub fn first_sentence(text: &str) -> String {
    let text = text.trim();
    match text.find(". ") {
        Some(end) => text[..=end].to_string(),
        None => text.to_string(),
    }
}

/// `\h NAME`: the syntax, description and example of one of our functions,
/// or of one of the session's documented functions (DataFusion's own).
fn describe_function(shell: &Shell, name: &str) -> Result<String> {
    let lower = name.to_ascii_lowercase();
    let function = match functions().into_iter().find(|f| f.name == lower) {
        Some(f) => f,
        None => {
            let state = shell.ctx.state();
            let doc = |kind: &'static str, doc: Option<&Documentation>| {
                Function::documented(&lower, kind, doc)
            };
            match (
                state.scalar_functions().get(&lower),
                state.aggregate_functions().get(&lower),
                state.window_functions().get(&lower),
            ) {
                (Some(f), _, _) => doc("scalar", f.documentation()),
                (_, Some(f), _) => doc("aggregate", f.documentation()),
                (_, _, Some(f)) => doc("window", f.documentation()),
                _ => return Err(CliError::UnknownFunction(name.to_string()).into()),
            }
        }
    };
    let mut text = format!("{} ({} function)\n", function.syntax, function.kind);
    if !function.description.is_empty() {
        text.push_str(&format!("  {}\n", function.description));
    }
    if let Some(example) = &function.example {
        for line in example.lines() {
            text.push_str(&format!("  {line}\n"));
        }
    }
    Ok(text.trim_end().to_string())
}

//! `dfgrad`: a command-line SQL shell for differentiable SQL on Apache DataFusion.
//!
//! Every session is a [`crate::session_context`], so the `grad`,
//! `jvp` and `vjp` SQL functions are available next to everything DataFusion
//! offers. The flags, meta-commands and output formats follow `datafusion-cli`'s.
//!
//! # Usage
//!
//! ```text
//! dfgrad [OPTIONS]
//!
//!   -c, --command <SQL>      Run SQL (repeatable; several `;`-separated statements allowed)
//!   -f, --file <FILE>        Run the statements in FILE (repeatable)
//!   -r, --rc <FILE>          Run the statements and meta-commands of FILE first
//!                            (repeatable); without -r, ~/.dfgradrc (if it exists)
//!                            runs before piped input or the interactive shell
//!       --format <FORMAT>    Output format: automatic (default: a table; the rows of
//!                            an unbounded source streamed as CSV), table, csv, tsv,
//!                            json, ndjson
//!       --maxrows <N|inf>    The most rows a table shows (default 40)
//!   -b, --batch-size <N>     Rows per batch of query execution
//!   -m, --memory-limit <SIZE>
//!                            Memory limit of query execution (e.g. 512m, 2g), for
//!                            DataFusion's memory pool and the results held to print
//!       --mem-pool-type <TYPE>
//!                            greedy (default) or fair (operators that can spill share
//!                            the pool fairly)
//!   -p, --data-path <DIR>    Run in DIR: relative paths are read from it
//!       --table <NAME=PATH>  Register a file, or a directory of files (a partitioned
//!                            data set), as table NAME (repeatable); the format is
//!                            taken from the extension: .csv, .parquet, .json/.ndjson
//!                            (newline-delimited JSON), .arrow/.ipc/.feather. A
//!                            directory's data files (in it and its KEY=VALUE
//!                            partition directories) must share one extension (a
//!                            mix is refused); other files are ignored
//!   -q, --quiet              Do not print the "N row(s) fetched. Elapsed ..." lines
//!       --rewrite <DIALECT>  Print the SQL with grad/jvp/vjp replaced by their
//!                            derivatives, for datafusion, duckdb, postgres, sqlite or
//!                            generic, instead of running it
//!       --substrait <FILE>   Write the differentiated plan of the query (-c/-f: exactly
//!                            one statement) to FILE as a Substrait plan (protobuf),
//!                            instead of running it
//!       --substrait-json     Print that Substrait plan as JSON to stdout instead
//!       --substrait-profile <PROFILE>
//!                            Shape the plan for datafusion (default) or acero (Apache
//!                            Arrow's engine, pyarrow.substrait); what Acero cannot run
//!                            with DataFusion's results is refused
//!       --from-substrait <FILE>
//!                            Read a Substrait plan (protobuf or JSON) from FILE; its
//!                            grad/jvp/vjp calls are differentiated, and it is run (printed
//!                            in --format), or re-emitted with --substrait/--substrait-json
//!       --ballista <URL>     Run on the Ballista cluster at URL (df://HOST:PORT), or on
//!                            an in-process one (standalone); needs the `ballista` feature
//! ```
//!
//! Sessions have `information_schema` (`SHOW TABLES`, `SHOW COLUMNS FROM t`)
//! and DataFusion's dynamic file catalog: `SELECT * FROM 'data.parquet'` (or a
//! `.csv`, `.json` file, or a directory `'dir/'`) reads the file without
//! registering it. DataFusion's settings are also read from `DATAFUSION_*`
//! environment variables, as datafusion-cli does.
//!
//! The rc files run first, then all `-c` commands, in order, then all `-f`
//! files, in order. Execution stops at the first failing statement: the message
//! is printed to stderr on one line as `Error: <message>` (for datafusion-grad's
//! refusals `Error: [kind] …`) and the exit status is non-zero. Statements are
//! split at `;`, except inside quoted strings/identifiers and comments; the last
//! one needs no `;`; empty statements are skipped. A panic in DataFusion or a
//! file reader (e.g. on a corrupt Parquet file) is such an error too, not a crash.
//!
//! Without `-c` and `-f`, with stdin piped (not a terminal), the statements read
//! from stdin run like a `-f` file, each as soon as its `;` is read.
//!
//! Without `-c` and `-f` on a terminal, `dfgrad` starts an interactive shell (prompt
//! `dfgrad> `). Input may span several lines and runs when a line ends with `;`;
//! `\q` or `quit` exits, as does Ctrl-D. Ctrl-C clears the current input or cancels
//! a running query. Errors (panics included) are printed and the shell goes on.
//! History is kept in memory only.
//!
//! In the shell, in piped input and in rc files, a line starting with `\` where a
//! statement would start is a meta-command: `\?` (list them), `\q` (quit), `\d`
//! (list tables), `\d NAME` (describe a table), `\h` (datafusion-grad's functions
//! with a line of documentation each), `\h NAME` (a function's syntax,
//! description and example), `\quiet [true|false]`, `\pset format FORMAT`.
//!
//! Results are written to stdout. In `table` mode (and `automatic`) at most
//! `--maxrows` rows are shown (three rows of dots mark the rest), and a summary
//! line with the row count and elapsed time goes to stderr (unless `--quiet`);
//! statements without result columns (e.g. `CREATE TABLE`) print no table. In
//! `csv`, `tsv`, `json` and `ndjson` modes only the data is printed, and
//! statements without result columns print nothing. (DataFusion's `INSERT`
//! returns a one-row `count` result, which is printed.) CSV and TSV cells of
//! struct (several-variable `grad`), list and tensor columns hold their value
//! as JSON text. JSON has no NaN or infinities: `json` and `ndjson` (and those
//! cells) write them as the strings `"NaN"`, `"inf"` and `"-inf"` (as `table`
//! and `csv` print them), SQL NULL as `null`.
//!
//! # Examples
//!
//! ```text
//! $ dfgrad -c "SELECT grad(x * x, x) AS d FROM (VALUES (3.0)) t(x)"
//! +-----+
//! | d   |
//! +-----+
//! | 6.0 |
//! +-----+
//!
//! $ dfgrad --format csv \
//!     -c "CREATE TABLE t(x DOUBLE) AS VALUES (1.0), (2.0)" \
//!     -c "SELECT x, grad(sin(x), x) AS dsin FROM t"
//!
//! $ dfgrad --table points=data/points.csv --format ndjson -f analysis.sql
//! $ dfgrad -p data -c "SELECT avg(grad(x * x, x)) FROM 'points.csv'"
//!
//! $ dfgrad --table t=t.csv --substrait plan.pb --substrait-profile acero \
//!     -c "SELECT grad(avg((w * x - y) * (w * x - y)), w) AS dw FROM t GROUP BY w"
//! $ dfgrad --table t=t.csv --from-substrait plan.pb --format csv
//!
//! $ dfgrad
//! dfgrad> SELECT jvp(x * y, x, 1.0)
//!    ...> FROM (VALUES (2.0, 5.0)) t(x, y);
//! dfgrad> \h grad
//! ```

// The parts with unit tests are public (hidden from the docs) for
// tests/unit/cli_*.rs.
#[doc(hidden)]
pub mod commands;
mod memory;
#[doc(hidden)]
pub mod print;
mod progress;
#[doc(hidden)]
pub mod shell;
#[doc(hidden)]
pub mod tables;

use std::any::Any;
use std::future::Future;
use std::io::{self, IsTerminal};
use std::num::NonZeroUsize;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use clap::{Parser, ValueEnum};
use datafusion::error::DataFusionError;
use datafusion::execution::memory_pool::{
    FairSpillPool, GreedyMemoryPool, MemoryPool, TrackConsumersPool,
};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use futures::FutureExt;

use crate::export::{rewrite_sql, SqlDialect};
use crate::GradError;
use print::{parse_maxrows, Format, MaxRows, Printer};
use shell::{split_statements, Flow, Shell};

/// Stack size of the thread that parses, plans and differentiates statements:
/// DataFusion recurses over expression trees, which overflows default stacks on
/// deeply nested SQL. Only the pages actually touched are committed.
const SHELL_STACK_SIZE: usize = 256 * 1024 * 1024;

/// Stack size of the runtime's worker threads, which evaluate the (possibly
/// deeply nested) physical expressions.
const WORKER_STACK_SIZE: usize = 64 * 1024 * 1024;

/// The rc file run before piped input or the shell when no `-r` is given,
/// in the home directory.
const DEFAULT_RC: &str = ".dfgradrc";

/// Any error, printed as `Error: <message>`.
#[doc(hidden)]
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// Result with the CLI's [`Error`].
#[doc(hidden)]
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(
    name = "dfgrad",
    version,
    about = "Differentiable SQL shell on Apache DataFusion (grad, jvp and vjp SQL functions)"
)]
struct Args {
    /// SQL to execute (repeatable, run in order; may hold several `;`-separated statements)
    #[arg(
        short = 'c',
        long = "command",
        value_name = "SQL",
        allow_hyphen_values = true
    )]
    commands: Vec<String>,

    /// File of `;`-separated SQL statements to execute (repeatable, run in order after -c)
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    files: Vec<PathBuf>,

    /// File of statements and meta-commands to run first (repeatable); without
    /// -r, ~/.dfgradrc runs before piped input or the interactive shell
    #[arg(short = 'r', long = "rc", value_name = "FILE")]
    rc: Vec<PathBuf>,

    /// Output format (automatic: a table, or the rows of an unbounded source
    /// streamed as CSV; csv/tsv write struct and list cells as JSON; json/ndjson
    /// write NaN and infinities as the strings "NaN", "inf", "-inf", and NULL
    /// as null)
    #[arg(long, value_enum, default_value_t = Format::Automatic)]
    format: Format,

    /// The most rows a table shows: a number, or inf for all
    #[arg(long, value_name = "N|inf", default_value = "40", value_parser = parse_maxrows)]
    maxrows: MaxRows,

    /// Rows per batch of query execution (DataFusion's
    /// datafusion.execution.batch_size)
    #[arg(short = 'b', long = "batch-size", value_name = "N", value_parser = parse_batch_size)]
    batch_size: Option<usize>,

    /// Memory limit of query execution, e.g. 512m or 2g (DataFusion's memory
    /// pool; the results held for printing count too); no limit by default
    #[arg(short = 'm', long = "memory-limit", value_name = "SIZE", value_parser = parse_memory_size)]
    memory_limit: Option<usize>,

    /// Memory pool with -m: greedy (first come, first served) or fair (each
    /// spilling operator gets an equal share)
    #[arg(long = "mem-pool-type", value_enum, default_value_t = PoolType::Greedy)]
    mem_pool_type: PoolType,

    /// Directory to run in: relative paths (of -f, --table and queried files)
    /// are read from it
    #[arg(short = 'p', long = "data-path", value_name = "DIR", value_parser = parse_data_path)]
    data_path: Option<PathBuf>,

    /// Register a file or a directory of files as a table (repeatable);
    /// format by extension: .csv, .parquet, .json/.ndjson, .arrow/.ipc/.feather
    /// (a directory's data files must share one extension)
    #[arg(long = "table", value_name = "NAME=PATH", value_parser = parse_table_arg)]
    tables: Vec<(String, PathBuf)>,

    /// Do not print row counts and timings
    #[arg(short, long)]
    quiet: bool,

    /// Print each command and file with every grad/jvp/vjp replaced by its
    /// derivative, as SQL of DIALECT (datafusion, duckdb, postgres, sqlite,
    /// generic), instead of running it
    #[arg(long, value_name = "DIALECT", value_parser = parse_dialect)]
    rewrite: Option<SqlDialect>,

    /// Write the differentiated plan of the query (-c/-f, exactly one
    /// statement) to FILE as a Substrait plan (protobuf), instead of running it
    #[arg(long, value_name = "FILE")]
    substrait: Option<PathBuf>,

    /// Print the differentiated plan of the query as Substrait JSON to
    /// stdout, instead of running it
    #[arg(long = "substrait-json")]
    substrait_json: bool,

    /// Substrait profile of --substrait/--substrait-json: datafusion
    /// (default) or acero
    #[arg(long = "substrait-profile", value_name = "PROFILE")]
    substrait_profile: Option<String>,

    /// Read a Substrait plan (protobuf or JSON) from FILE, differentiate its
    /// grad/jvp/vjp calls and run it (or re-emit it with --substrait or
    /// --substrait-json)
    #[arg(long = "from-substrait", value_name = "FILE")]
    from_substrait: Option<PathBuf>,

    /// Run the queries on the Ballista cluster whose scheduler is at URL
    /// (`df://HOST:PORT`), or on an in-process one (`standalone`); the
    /// derivatives are taken here, and recursive queries are iterated from
    /// here, one distributed query per step (needs the `ballista` feature)
    #[arg(long, value_name = "URL")]
    ballista: Option<String>,
}

impl Args {
    /// Whether any Substrait flag was given.
    fn substrait_mode(&self) -> bool {
        self.substrait.is_some()
            || self.substrait_json
            || self.substrait_profile.is_some()
            || self.from_substrait.is_some()
    }
}

/// DataFusion's memory pools (`--mem-pool-type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PoolType {
    /// First come, first served
    Greedy,
    /// An equal share for each operator that can spill
    Fair,
}

/// The CLI's own refusals, each a one-sentence message.
#[doc(hidden)]
#[derive(Debug)]
pub enum CliError {
    /// A line starting with `\` that is no meta-command.
    UnknownCommand(String),
    /// A meta-command given an argument it does not take.
    CommandArgument {
        command: String,
        expected: &'static str,
        got: String,
    },
    /// `\h NAME` of a function the session does not have.
    UnknownFunction(String),
    /// `\pset format` of an unknown format.
    UnknownFormat(String),
    /// `automatic` output of a query over an unbounded source that produces
    /// its result only at the end.
    UnboundedFinalResult,
    /// Flags that cannot go together.
    Conflict(&'static str),
    /// A file that cannot be read.
    Read { path: PathBuf, reason: String },
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CliError::UnknownCommand(line) => write!(
                f,
                "unknown meta-command '{line}': \\? lists the meta-commands"
            ),
            CliError::CommandArgument {
                command,
                expected,
                got,
            } => match got.is_empty() {
                true => write!(f, "{command} takes {expected}"),
                false => write!(f, "{command} takes {expected}, not '{got}'"),
            },
            CliError::UnknownFunction(name) => write!(
                f,
                "there is no function named '{name}': \\h lists datafusion-grad's functions, \
                 SHOW FUNCTIONS all of them"
            ),
            CliError::UnknownFormat(name) => write!(
                f,
                "unknown output format '{name}': expected one of {}",
                Format::all_names()
            ),
            CliError::UnboundedFinalResult => write!(
                f,
                "the query produces its result only once its source ends, but the source is \
                 unbounded"
            ),
            CliError::Conflict(message) => write!(f, "{message}"),
            CliError::Read { path, reason } => {
                write!(f, "cannot read '{}': {reason}", path.display())
            }
        }
    }
}

impl std::error::Error for CliError {}

fn parse_dialect(s: &str) -> Result<SqlDialect, String> {
    s.parse().map_err(|e: crate::GradError| e.to_string())
}

/// Parses a `--table` value of the form `NAME=PATH`.
#[doc(hidden)]
pub fn parse_table_arg(value: &str) -> Result<(String, PathBuf), String> {
    match value.split_once('=') {
        Some((name, path)) if !name.trim().is_empty() && !path.is_empty() => {
            Ok((name.trim().to_string(), PathBuf::from(path)))
        }
        _ => Err(format!("expected NAME=PATH, got '{value}'")),
    }
}

/// Parses a `-b` value: a positive number of rows.
#[doc(hidden)]
pub fn parse_batch_size(value: &str) -> Result<usize, String> {
    match value.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("expected a positive number of rows, got '{value}'")),
    }
}

/// Parses a `-m` value: a number of bytes with an optional unit, `k`, `m`,
/// `g` or `t` (powers of 1024; `kb`, `mb`, … too), as datafusion-cli does.
#[doc(hidden)]
pub fn parse_memory_size(value: &str) -> Result<usize, String> {
    let lower = value.trim().to_ascii_lowercase();
    let digits = lower.len() - lower.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    let (number, unit) = lower.split_at(digits);
    let shift = match unit {
        "" | "b" => 0,
        "k" | "kb" => 10,
        "m" | "mb" => 20,
        "g" | "gb" => 30,
        "t" | "tb" => 40,
        _ => {
            return Err(format!(
                "expected a size such as 512m or 2g (units b, k, m, g, t), got '{value}'"
            ))
        }
    };
    let number: usize = number.parse().map_err(|_| {
        format!("expected a size such as 512m or 2g (units b, k, m, g, t), got '{value}'")
    })?;
    number
        .checked_mul(1 << shift)
        .filter(|&bytes| bytes > 0)
        .ok_or_else(|| format!("the memory limit '{value}' is zero or too large"))
}

/// Parses a `-p` value: an existing directory.
fn parse_data_path(value: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(value);
    match path.is_dir() {
        true => Ok(path),
        false => Err(format!("'{value}' is not a directory")),
    }
}

/// Runs `dfgrad` with the process's arguments and returns its exit status:
/// the whole `main` of the `dfgrad` binary (`src/bin/dfgrad.rs`). It owns
/// the process: it installs a panic hook and tunes glibc's `malloc` (see
/// `memory`) before it starts a thread, so call it first thing in `main`.
pub fn main() -> ExitCode {
    memory::keep_freed_memory();
    let args = match Args::try_parse() {
        Ok(args) => args,
        // --help and --version
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            eprintln!("Error: {}", usage_error(&e));
            return ExitCode::from(2);
        }
    };
    install_panic_hook();
    // Run everything on a thread with a large stack: DataFusion recurses over
    // expression trees, which overflows default stacks on deeply nested SQL.
    let shell = std::thread::Builder::new()
        .name("dfgrad".to_string())
        .stack_size(SHELL_STACK_SIZE)
        .spawn(move || run(args));
    let outcome = match shell {
        Ok(handle) => match handle.join() {
            Ok(outcome) => outcome,
            // A panic outside the statements (which catch their own).
            Err(payload) => Err(panic_error(payload.as_ref())),
        },
        Err(e) => Err(e.into()),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            print_error(e.as_ref());
            ExitCode::FAILURE
        }
    }
}

/// A refused command line as one sentence: clap's message without its
/// `error: ` prefix, usage and tips, pointing to `--help`.
fn usage_error(e: &clap::Error) -> String {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or("").trim();
    let first = first.strip_prefix("error: ").unwrap_or(first);
    format!("{first} (dfgrad --help lists the options)")
}

/// Prints `err` to stderr as one line, `Error: <message>` (see [`error_line`]).
pub(crate) fn print_error(err: &(dyn std::error::Error + 'static)) {
    eprintln!("Error: {}", error_line(err));
}

/// The message of `err` on one line. A [`GradError`] anywhere in its chain of
/// sources is the message, `[kind] …`, without the wrappers that DataFusion's
/// analyzer and optimizer put around it (`datafusion_grad` / `caused by` /
/// `External error:`); other messages have their line breaks joined, with
/// a hint (`crate::error::hint`) where DataFusion's message lacks the fix.
pub(crate) fn error_line(err: &(dyn std::error::Error + 'static)) -> String {
    let mut source = Some(err);
    while let Some(e) = source {
        if let Some(grad) = e.downcast_ref::<GradError>() {
            return one_line(&grad.to_string());
        }
        source = e.source();
    }
    let line = one_line(&err.to_string());
    let hint = err.downcast_ref::<DataFusionError>().and_then(|e| {
        crate::error::hint(e).or_else(|| {
            matches!(e.find_root(), DataFusionError::ResourcesExhausted(_)).then_some(
                "raise dfgrad's memory limit (-m/--memory-limit), or try --mem-pool-type fair",
            )
        })
    });
    match hint {
        Some(hint) => format!("{line} (hint: {hint})"),
        None => line,
    }
}

/// `message` with DataFusion's `\ncaused by\n` written as `: ` and other
/// line breaks (with the indentation around them) as one space.
#[doc(hidden)]
pub fn one_line(message: &str) -> String {
    message
        .replace("\ncaused by\n", ": ")
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The message and location of the last panic, recorded by the hook of
/// [`install_panic_hook`] for [`panic_error`].
static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

/// Replaces Rust's panic hook, which prints `thread '…' panicked at …` to
/// stderr, by one that records the message for [`panic_error`]: a panic below
/// us (in DataFusion, Arrow or a file reader) is caught by [`catch_panic`] and
/// reported as an error. With `RUST_BACKTRACE` set (not `0`), Rust's hook
/// runs too, for its backtrace.
fn install_panic_hook() {
    let default_hook = std::panic::take_hook();
    let backtrace = std::env::var_os("RUST_BACKTRACE").is_some_and(|v| v != "0");
    std::panic::set_hook(Box::new(move |info| {
        let message = payload_message(info.payload());
        let recorded = match info.location() {
            Some(location) => format!(
                "a panic at {}:{}:{}: {message}",
                crate_relative(location.file()),
                location.line(),
                location.column()
            ),
            None => format!("a panic: {message}"),
        };
        *LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()) = Some(recorded);
        if backtrace {
            default_hook(info);
        }
    }));
}

/// `file` from its crate's directory on, e.g. `parquet-59.3.2/src/lib.rs`
/// for a file of a dependency in Cargo's registry (other paths unchanged).
#[doc(hidden)]
pub fn crate_relative(file: &str) -> &str {
    file.split_once("/registry/src/")
        .and_then(|(_, index)| index.split_once('/'))
        .map_or(file, |(_, in_crate)| in_crate)
}

/// The message a panic was raised with.
fn payload_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_string()
    }
}

/// The error a caught panic becomes: its message and location as the panic
/// hook recorded them (or the payload's message).
fn panic_error(payload: &(dyn Any + Send)) -> Error {
    let recorded = LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()).take();
    let panic = recorded.unwrap_or_else(|| format!("a panic: {}", payload_message(payload)));
    format!(
        "Internal error: {panic} (a bug in dfgrad or a library below it, e.g. a file reader \
         given malformed data; please report it)"
    )
    .into()
}

/// Runs `future`, turning a panic inside it, or inside a task it waits for
/// (DataFusion resumes their panics), into an error.
pub(crate) async fn catch_panic<F: Future>(future: F) -> Result<F::Output> {
    AssertUnwindSafe(future)
        .catch_unwind()
        .await
        .map_err(|payload| panic_error(payload.as_ref()))
}

/// Builds the Tokio runtime (what `#[tokio::main]` would build, but with large
/// worker stacks, since query execution also recurses over expressions) and runs
/// the CLI on it.
fn run(args: Args) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(WORKER_STACK_SIZE)
        .build()?;
    runtime.block_on(catch_panic(run_async(args)))?
}

/// A client session of the Ballista cluster at `url` (`standalone`: one
/// started in this process).
#[cfg(feature = "ballista")]
async fn ballista_context(url: &str) -> Result<SessionContext> {
    Ok(match url {
        "standalone" => crate::ballista::standalone().await?,
        _ => crate::ballista::remote(url).await?,
    })
}

#[cfg(not(feature = "ballista"))]
async fn ballista_context(_url: &str) -> Result<SessionContext> {
    Err(datafusion::error::DataFusionError::Configuration(
        "--ballista needs dfgrad built with the `ballista` cargo feature \
         (cargo build --release --features ballista)"
            .to_string(),
    )
    .into())
}

/// A local session as the flags ask: `information_schema` on, DataFusion's
/// dynamic file catalog (`SELECT * FROM 'file.parquet'`), settings from
/// `DATAFUSION_*` environment variables, `-b` and `-m`.
fn local_context(args: &Args) -> Result<SessionContext> {
    let mut config = progress::install(SessionConfig::from_env()?.with_information_schema(true));
    if let Some(rows) = args.batch_size {
        config = config.with_batch_size(rows);
    }
    let mut runtime = RuntimeEnvBuilder::new();
    if let Some(limit) = args.memory_limit {
        // The largest consumers are named when the pool is exhausted.
        let top = NonZeroUsize::new(3).expect("3 is not zero");
        let pool: Arc<dyn MemoryPool> = match args.mem_pool_type {
            PoolType::Greedy => {
                Arc::new(TrackConsumersPool::new(GreedyMemoryPool::new(limit), top))
            }
            PoolType::Fair => Arc::new(TrackConsumersPool::new(FairSpillPool::new(limit), top)),
        };
        runtime = runtime.with_memory_pool(pool);
    }
    let ctx = SessionContext::new_with_config_rt(config, runtime.build_arc()?);
    crate::register(&ctx);
    Ok(tables::with_url_tables(ctx))
}

/// A Ballista client session with `information_schema` on and `-b`.
async fn cluster_context(url: &str, args: &Args) -> Result<SessionContext> {
    if args.memory_limit.is_some() {
        return Err(CliError::Conflict(
            "-m/--memory-limit bounds this process's memory pool, but with --ballista the \
             queries run on the cluster's executors, whose memory is set where they start",
        )
        .into());
    }
    let ctx = ballista_context(url).await?;
    {
        let state = ctx.state_ref();
        let mut state = state.write();
        let config = state.config_mut();
        config.options_mut().catalog.information_schema = true;
        if let Some(rows) = args.batch_size {
            *config = config.clone().with_batch_size(rows);
        }
    }
    Ok(ctx)
}

/// `~/.dfgradrc`, if there is one.
fn default_rc() -> Option<PathBuf> {
    let home = std::env::var_os("HOME")?;
    let rc = PathBuf::from(home).join(DEFAULT_RC);
    rc.is_file().then_some(rc)
}

/// Moves to `-p`, builds the session, registers the `--table`s, runs the rc
/// files, then the `-c` commands and `-f` files, or piped input or the
/// interactive shell when there are none.
async fn run_async(args: Args) -> Result<()> {
    if let Some(dir) = &args.data_path {
        std::env::set_current_dir(dir).map_err(|e| CliError::Read {
            path: dir.clone(),
            reason: e.to_string(),
        })?;
    }
    let ctx = match &args.ballista {
        Some(url) => cluster_context(url, &args).await?,
        None => local_context(&args)?,
    };
    for (name, path) in &args.tables {
        tables::register_table(&ctx, name, path).await?;
    }
    let printer = Printer {
        format: args.format,
        quiet: args.quiet,
        maxrows: args.maxrows,
    };
    let mut shell = Shell { ctx, printer };
    let reads_stdin = args.commands.is_empty()
        && args.files.is_empty()
        && args.rewrite.is_none()
        && !args.substrait_mode();
    let rc = match (args.rc.is_empty(), reads_stdin) {
        (false, _) => args.rc.clone(),
        (true, true) => default_rc().into_iter().collect(),
        (true, false) => Vec::new(),
    };
    for path in &rc {
        let file = std::fs::File::open(path).map_err(|e| CliError::Read {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        if shell.run_lines(io::BufReader::new(file)).await? == Flow::Quit {
            return Ok(());
        }
    }
    if args.substrait_mode() {
        if args.rewrite.is_some() {
            return Err(CliError::Conflict(
                "--rewrite cannot be combined with the Substrait flags",
            )
            .into());
        }
        return run_substrait(&shell.ctx, &args, shell.printer).await;
    }
    if args.commands.is_empty() && args.files.is_empty() {
        return match args.rewrite {
            Some(_) => Err(CliError::Conflict("--rewrite needs -c or -f").into()),
            None if io::stdin().is_terminal() => shell.repl().await,
            None => shell.run_lines(io::stdin().lock()).await.map(|_| ()),
        };
    }
    let sources = read_sources(&args)?;
    for sql in &sources {
        match args.rewrite {
            Some(dialect) => {
                let text = rewrite_sql(&shell.ctx, sql, dialect).await?;
                match sources.len() {
                    1 => println!("{text}"),
                    _ => println!("{}", terminated(&text)),
                }
            }
            None => shell.run_statements(sql).await?,
        }
    }
    Ok(())
}

/// `sql` ending with `;`, so that the rewrites of several `-c`/`-f` sources
/// printed one after another are one runnable script (on a line of its own
/// after a trailing `--` comment).
fn terminated(sql: &str) -> String {
    let sql = sql.trim_end();
    if sql.ends_with(';') {
        return sql.to_string();
    }
    match sql.lines().last().is_some_and(|l| l.contains("--")) {
        true => format!("{sql}\n;"),
        false => format!("{sql};"),
    }
}

/// The SQL of the `-c` commands, then of the `-f` files, in order.
fn read_sources(args: &Args) -> Result<Vec<String>> {
    let mut sources = args.commands.clone();
    for file in &args.files {
        let sql = std::fs::read_to_string(file).map_err(|e| CliError::Read {
            path: file.clone(),
            reason: e.to_string(),
        })?;
        sources.push(sql);
    }
    Ok(sources)
}

/// `--substrait`, `--substrait-json`, `--from-substrait`: exports the plan
/// of the one query of `-c`/`-f`, or imports the plan of `--from-substrait`
/// and runs it (or exports it again).
#[cfg(feature = "substrait")]
async fn run_substrait(ctx: &SessionContext, args: &Args, printer: Printer) -> Result<()> {
    use std::time::Instant;

    use crate::substrait::{
        from_substrait, logical_to_substrait, plan_from_bytes_or_json, plan_to_bytes, plan_to_json,
        to_substrait, Profile,
    };
    use arrow::datatypes::SchemaRef;

    let profile: Profile = args
        .substrait_profile
        .as_deref()
        .unwrap_or("datafusion")
        .parse()?;
    let export = args.substrait.is_some() || args.substrait_json;
    let plan = match &args.from_substrait {
        Some(path) => {
            if !args.commands.is_empty() || !args.files.is_empty() {
                return Err(
                    "--from-substrait runs the plan in its file; it takes no -c or -f".into(),
                );
            }
            let data = std::fs::read(path).map_err(|e| CliError::Read {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            let start = Instant::now();
            let plan = plan_from_bytes_or_json(&data)?;
            let df = from_substrait(ctx, &plan).await?;
            if !export {
                let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
                let batches = df.collect().await?;
                return printer.print_collected(&schema, &batches, start);
            }
            logical_to_substrait(&ctx.state(), df.logical_plan(), profile).await?
        }
        None => {
            if !export {
                return Err("--substrait-profile needs --substrait or --substrait-json".into());
            }
            let mut statements = Vec::new();
            for sql in read_sources(args)? {
                statements.extend(split_statements(&sql));
            }
            if statements.len() != 1 {
                return Err(format!(
                    "--substrait and --substrait-json export exactly one query (-c or -f), got {} statements",
                    statements.len()
                )
                .into());
            }
            to_substrait(ctx, &statements[0], profile).await?
        }
    };
    if let Some(path) = &args.substrait {
        std::fs::write(path, plan_to_bytes(&plan))
            .map_err(|e| format!("cannot write '{}': {e}", path.display()))?;
    }
    if args.substrait_json {
        println!("{}", plan_to_json(&plan)?);
    }
    Ok(())
}

/// Without the `substrait` feature, the Substrait flags are an error.
#[cfg(not(feature = "substrait"))]
async fn run_substrait(_ctx: &SessionContext, _args: &Args, _printer: Printer) -> Result<()> {
    Err("dfgrad was built without the `substrait` feature".into())
}

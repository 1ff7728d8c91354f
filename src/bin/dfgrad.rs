//! `dfgrad`: a command-line SQL shell for differentiable SQL on Apache DataFusion.
//!
//! Every session is a [`datafusion_grad::session_context`], so the `grad`,
//! `jvp` and `vjp` SQL functions are available next to everything DataFusion
//! offers. The flags follow `datafusion-cli`'s conventions.
//!
//! # Usage
//!
//! ```text
//! dfgrad [OPTIONS]
//!
//!   -c, --command <SQL>      Run SQL (repeatable; several `;`-separated statements allowed)
//!   -f, --file <FILE>        Run the statements in FILE (repeatable)
//!       --format <FORMAT>    Output format: table (default), csv, json, ndjson
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
//! All `-c` commands run first, in order, then all `-f` files, in order. Execution
//! stops at the first failing statement: the message is printed to stderr on one
//! line as `Error: <message>` (for datafusion-grad's refusals `Error: [kind] …`)
//! and the exit status is non-zero. Statements are split at `;`, except inside
//! quoted strings/identifiers and comments; the last one needs no `;`; empty
//! statements are skipped. A panic in DataFusion or a file reader (e.g. on a corrupt
//! Parquet file) is such an error too, not a crash.
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
//! Results are written to stdout. In `table` mode a summary line with the row count
//! and elapsed time goes to stderr (unless `--quiet`); statements without result
//! columns (e.g. `CREATE TABLE`) print no table. In `csv`, `json` and `ndjson` modes
//! only the data is printed, and statements without result columns print nothing.
//! (DataFusion's `INSERT` returns a one-row `count` result, which is printed.)
//! JSON has no NaN or infinities: `json` and `ndjson` write them as the strings
//! `"NaN"`, `"inf"` and `"-inf"` (as `table` and `csv` print them), SQL NULL as `null`.
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
//!
//! $ dfgrad --table t=t.csv --substrait plan.pb --substrait-profile acero \
//!     -c "SELECT grad(avg((w * x - y) * (w * x - y)), w) AS dw FROM t GROUP BY w"
//! $ dfgrad --table t=t.csv --from-substrait plan.pb --format csv
//!
//! $ dfgrad
//! dfgrad> SELECT jvp(x * y, x, 1.0)
//!    ...> FROM (VALUES (2.0, 5.0)) t(x, y);
//! ```

use std::any::Any;
use std::collections::BTreeMap;
use std::future::Future;
use std::io::{self, BufRead, IsTerminal, Write};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Instant;

use arrow::array::{Array, AsArray, Float64Array, RecordBatch};
use arrow::datatypes::{DataType, FieldRef, Float64Type, SchemaRef};
use arrow::error::ArrowError;
use arrow::json::writer::{make_encoder, Encoder, EncoderFactory, EncoderOptions, NullableEncoder};
use arrow::util::pretty::pretty_format_batches;
use clap::{Parser, ValueEnum};
use datafusion::datasource::file_format::options::ArrowReadOptions;
use datafusion::error::DataFusionError;
use datafusion::prelude::{CsvReadOptions, JsonReadOptions, ParquetReadOptions, SessionContext};
use datafusion_grad::export::{rewrite_sql, SqlDialect};
use datafusion_grad::GradError;
use futures::FutureExt;
use rustyline::error::ReadlineError;
use rustyline::DefaultEditor;

/// Stack size of the thread that parses, plans and differentiates statements:
/// DataFusion recurses over expression trees, which overflows default stacks on
/// deeply nested SQL. Only the pages actually touched are committed.
const SHELL_STACK_SIZE: usize = 256 * 1024 * 1024;

/// Stack size of the runtime's worker threads, which evaluate the (possibly
/// deeply nested) physical expressions.
const WORKER_STACK_SIZE: usize = 64 * 1024 * 1024;

/// Prompt of the interactive shell.
const PROMPT: &str = "dfgrad> ";

/// Prompt for the continuation lines of a multi-line statement.
const CONTINUATION_PROMPT: &str = "   ...> ";

/// Any error, printed as `Error: <message>`.
type Error = Box<dyn std::error::Error + Send + Sync>;

/// Result with the CLI's [`Error`].
type Result<T, E = Error> = std::result::Result<T, E>;

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

    /// Output format (json/ndjson write NaN and infinities as the strings
    /// "NaN", "inf", "-inf", and NULL as null)
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,

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

fn parse_dialect(s: &str) -> Result<SqlDialect, String> {
    s.parse()
        .map_err(|e: datafusion_grad::GradError| e.to_string())
}

/// Output format of query results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    /// An ASCII table
    Table,
    /// CSV with a header line
    Csv,
    /// A JSON array of objects
    Json,
    /// One JSON object per line
    Ndjson,
}

/// Parses a `--table` value of the form `NAME=PATH`.
fn parse_table_arg(value: &str) -> Result<(String, PathBuf), String> {
    match value.split_once('=') {
        Some((name, path)) if !name.trim().is_empty() && !path.is_empty() => {
            Ok((name.trim().to_string(), PathBuf::from(path)))
        }
        _ => Err(format!("expected NAME=PATH, got '{value}'")),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
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

/// Prints `err` to stderr as one line, `Error: <message>` (see [`error_line`]).
fn print_error(err: &(dyn std::error::Error + 'static)) {
    eprintln!("Error: {}", error_line(err));
}

/// The message of `err` on one line. A [`GradError`] anywhere in its chain of
/// sources is the message, `[kind] …`, without the wrappers that DataFusion's
/// analyzer and optimizer put around it (`datafusion_grad` / `caused by` /
/// `External error:`); other messages have their line breaks joined, with
/// a hint (`datafusion_grad::error::hint`) where DataFusion's message lacks the fix.
fn error_line(err: &(dyn std::error::Error + 'static)) -> String {
    let mut source = Some(err);
    while let Some(e) = source {
        if let Some(grad) = e.downcast_ref::<GradError>() {
            return one_line(&grad.to_string());
        }
        source = e.source();
    }
    let line = one_line(&err.to_string());
    match err
        .downcast_ref::<DataFusionError>()
        .and_then(datafusion_grad::error::hint)
    {
        Some(hint) => format!("{line} (hint: {hint})"),
        None => line,
    }
}

/// `message` with DataFusion's `\ncaused by\n` written as `: ` and other
/// line breaks (with the indentation around them) as one space.
fn one_line(message: &str) -> String {
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
fn crate_relative(file: &str) -> &str {
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
async fn catch_panic<F: Future>(future: F) -> Result<F::Output> {
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
        "standalone" => datafusion_grad::ballista::standalone().await?,
        _ => datafusion_grad::ballista::remote(url).await?,
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

/// Registers the `--table`s, then runs the `-c` commands and `-f` files, or the
/// interactive shell when there are none.
async fn run_async(args: Args) -> Result<()> {
    let ctx = match &args.ballista {
        Some(url) => ballista_context(url).await?,
        None => datafusion_grad::session_context(),
    };
    for (name, path) in &args.tables {
        register_table(&ctx, name, path).await?;
    }
    let printer = Printer {
        format: args.format,
        quiet: args.quiet,
    };
    if args.substrait_mode() {
        if args.rewrite.is_some() {
            return Err("--rewrite cannot be combined with the Substrait flags".into());
        }
        return run_substrait(&ctx, &args, printer).await;
    }
    if args.commands.is_empty() && args.files.is_empty() {
        return match args.rewrite {
            Some(_) => Err("--rewrite needs -c or -f".into()),
            None if io::stdin().is_terminal() => repl(&ctx, printer).await,
            None => run_piped(&ctx, printer).await,
        };
    }
    for sql in &read_sources(&args)? {
        match args.rewrite {
            Some(dialect) => println!("{}", rewrite_sql(&ctx, sql, dialect).await?),
            None => run_statements(&ctx, printer, sql).await?,
        }
    }
    Ok(())
}

/// The SQL of the `-c` commands, then of the `-f` files, in order.
fn read_sources(args: &Args) -> Result<Vec<String>> {
    let mut sources = args.commands.clone();
    for file in &args.files {
        let sql = std::fs::read_to_string(file)
            .map_err(|e| format!("cannot read '{}': {e}", file.display()))?;
        sources.push(sql);
    }
    Ok(sources)
}

/// `--substrait`, `--substrait-json`, `--from-substrait`: exports the plan
/// of the one query of `-c`/`-f`, or imports the plan of `--from-substrait`
/// and runs it (or exports it again).
#[cfg(feature = "substrait")]
async fn run_substrait(ctx: &SessionContext, args: &Args, printer: Printer) -> Result<()> {
    use datafusion_grad::substrait::{
        from_substrait, logical_to_substrait, plan_from_bytes_or_json, plan_to_bytes, plan_to_json,
        to_substrait, Profile,
    };

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
            let data = std::fs::read(path)
                .map_err(|e| format!("cannot read '{}': {e}", path.display()))?;
            let start = Instant::now();
            let plan = plan_from_bytes_or_json(&data)?;
            let df = from_substrait(ctx, &plan).await?;
            if !export {
                let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
                let batches = df.collect().await?;
                return printer.print(&schema, &batches, start);
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

/// The file formats `--table` can register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TableFormat {
    Csv,
    Parquet,
    Json,
    Arrow,
}

impl TableFormat {
    /// The format of a file with extension `ext` (without the dot, any case).
    fn from_extension(ext: &str) -> Option<Self> {
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
async fn register_table(ctx: &SessionContext, name: &str, path: &Path) -> Result<()> {
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

/// `sql` split at its `;`s (see [`split_terminated`]).
#[derive(Debug, PartialEq, Eq)]
struct Split<'a> {
    /// The statements ended by `;`, trimmed, without those holding only
    /// whitespace and comments.
    complete: Vec<String>,
    /// What follows the last `;` that ends a statement, as written.
    rest: &'a str,
    /// Whether `rest` holds anything besides whitespace and comments.
    rest_has_content: bool,
}

/// Splits `sql` at `;`, ignoring `;` inside single-quoted strings,
/// double-quoted identifiers, `--` line comments and `/* */` block comments.
fn split_terminated(sql: &str) -> Split<'_> {
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum State {
        Normal,
        SingleQuoted,
        DoubleQuoted,
        LineComment,
        BlockComment,
    }

    let mut complete = Vec::new();
    // Byte offset where the current statement starts.
    let mut start = 0;
    // Whether the current statement holds anything besides whitespace and comments.
    let mut has_content = false;
    let mut state = State::Normal;
    let mut chars = sql.char_indices().peekable();

    while let Some((i, c)) = chars.next() {
        let next = chars.peek().map(|&(_, c)| c);
        match state {
            State::Normal => match c {
                ';' => {
                    if has_content {
                        complete.push(sql[start..i].trim().to_string());
                    }
                    start = i + 1;
                    has_content = false;
                }
                '\'' => {
                    state = State::SingleQuoted;
                    has_content = true;
                }
                '"' => {
                    state = State::DoubleQuoted;
                    has_content = true;
                }
                '-' if next == Some('-') => {
                    chars.next();
                    state = State::LineComment;
                }
                '/' if next == Some('*') => {
                    chars.next();
                    state = State::BlockComment;
                }
                c if !c.is_whitespace() => has_content = true,
                _ => {}
            },
            // A doubled quote ('' or "") leaves and re-enters the quoted state.
            State::SingleQuoted if c == '\'' => state = State::Normal,
            State::DoubleQuoted if c == '"' => state = State::Normal,
            State::LineComment if c == '\n' => state = State::Normal,
            State::BlockComment if c == '*' && next == Some('/') => {
                chars.next();
                state = State::Normal;
            }
            _ => {}
        }
    }
    Split {
        complete,
        rest: &sql[start..],
        rest_has_content: has_content,
    }
}

/// Splits `sql` into statements at `;` (see [`split_terminated`]); the last
/// statement needs no `;`. Statements are trimmed; those holding only
/// whitespace and comments are dropped.
fn split_statements(sql: &str) -> Vec<String> {
    let split = split_terminated(sql);
    let mut statements = split.complete;
    if split.rest_has_content {
        statements.push(split.rest.trim().to_string());
    }
    statements
}

/// Runs every statement of `sql` in order, stopping at the first error.
async fn run_statements(ctx: &SessionContext, printer: Printer, sql: &str) -> Result<()> {
    for statement in split_statements(sql) {
        run_statement(ctx, printer, &statement).await?;
    }
    Ok(())
}

/// Plans, executes and prints a single statement; a panic while planning or
/// executing it is an error.
async fn run_statement(ctx: &SessionContext, printer: Printer, sql: &str) -> Result<()> {
    let start = Instant::now();
    let (schema, batches) = catch_panic(async {
        let df = ctx.sql(sql).await?;
        let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
        Ok::<_, Error>((schema, df.collect().await?))
    })
    .await??;
    printer.print(&schema, &batches, start)
}

/// Runs the statements piped into stdin (which is not a terminal) as they
/// arrive, like a `-f` file: each once its `;` is read, the last one also
/// without `;`, stopping at the first failing statement.
async fn run_piped(ctx: &SessionContext, printer: Printer) -> Result<()> {
    // What was read after the last statement that ended with `;`.
    let mut pending = String::new();
    for line in io::stdin().lock().lines() {
        pending.push_str(&line?);
        pending.push('\n');
        let split = split_terminated(&pending);
        for statement in &split.complete {
            run_statement(ctx, printer, statement).await?;
        }
        pending = split.rest.to_string();
    }
    run_statements(ctx, printer, &pending).await
}

/// Writes query results to stdout (and the summary line to stderr).
#[derive(Debug, Clone, Copy)]
struct Printer {
    format: Format,
    quiet: bool,
}

impl Printer {
    /// Prints `batches` of a statement started at `start`.
    fn print(&self, schema: &SchemaRef, batches: &[RecordBatch], start: Instant) -> Result<()> {
        let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
        let mut out = io::stdout().lock();
        if !schema.fields().is_empty() {
            // Without batches, print an empty one so the header still appears.
            let empty;
            let batches = if batches.is_empty() {
                empty = [RecordBatch::new_empty(Arc::clone(schema))];
                &empty[..]
            } else {
                batches
            };
            write_batches(&mut out, self.format, batches)?;
        }
        out.flush()?;
        if self.format == Format::Table && !self.quiet {
            eprintln!(
                "{rows} row(s) fetched. Elapsed {:.3} seconds.",
                start.elapsed().as_secs_f64()
            );
        }
        Ok(())
    }
}

/// Writes non-empty `batches` to `out` in `format`.
fn write_batches(out: &mut impl Write, format: Format, batches: &[RecordBatch]) -> Result<()> {
    match format {
        Format::Table => writeln!(out, "{}", pretty_format_batches(batches)?)?,
        Format::Csv => {
            let mut writer = arrow::csv::WriterBuilder::new()
                .with_header(true)
                .build(&mut *out);
            for batch in batches {
                writer.write(batch)?;
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

/// What the shell read.
#[derive(Debug)]
enum ReplInput {
    /// A complete statement (or several), ending with `;`.
    Sql(String),
    /// `\q`, `quit` or end of input.
    Quit,
}

/// Reads lines until one ends with `;` (or the user quits).
fn read_statement(editor: &mut DefaultEditor) -> Result<ReplInput> {
    let mut buffer = String::new();
    loop {
        let prompt = if buffer.is_empty() {
            PROMPT
        } else {
            CONTINUATION_PROMPT
        };
        match editor.readline(prompt) {
            Ok(line) => {
                let trimmed = line.trim();
                if buffer.is_empty() {
                    if trimmed.is_empty() {
                        continue;
                    }
                    if matches!(trimmed, "\\q" | "quit" | "quit;") {
                        return Ok(ReplInput::Quit);
                    }
                }
                if !buffer.is_empty() {
                    buffer.push('\n');
                }
                buffer.push_str(&line);
                if trimmed.ends_with(';') {
                    editor.add_history_entry(buffer.as_str())?;
                    return Ok(ReplInput::Sql(buffer));
                }
            }
            // Ctrl-C: drop the current input and start over.
            Err(ReadlineError::Interrupted) => {
                buffer.clear();
            }
            Err(ReadlineError::Eof) => return Ok(ReplInput::Quit),
            Err(e) => return Err(e.into()),
        }
    }
}

/// The interactive shell: errors are printed and the shell goes on.
async fn repl(ctx: &SessionContext, printer: Printer) -> Result<()> {
    let mut editor = DefaultEditor::new()?;
    loop {
        let sql = match read_statement(&mut editor)? {
            ReplInput::Sql(sql) => sql,
            ReplInput::Quit => return Ok(()),
        };
        tokio::select! {
            result = run_statements(ctx, printer, &sql) => {
                if let Err(e) = result {
                    print_error(e.as_ref());
                }
            }
            _ = tokio::signal::ctrl_c() => {
                eprintln!("^C\nQuery cancelled.");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }

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
            crate_relative(
                "/root/.cargo/registry/src/index.crates.io-1949/parquet-59.3.2/src/a.rs"
            ),
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

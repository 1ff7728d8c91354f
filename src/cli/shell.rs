//! Running statements: splitting SQL at `;`, executing and printing each
//! statement, statements read line by line (piped stdin, rc files) and the
//! interactive shell, both with meta-commands (`\d`, `\h`, …).

use std::io::BufRead;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::execution_plan::EmissionType;
use datafusion::physical_plan::{execute_stream, ExecutionPlanProperties};
use datafusion::prelude::SessionContext;
use futures::StreamExt;
use rustyline::error::ReadlineError;
use rustyline::DefaultEditor;

use super::commands::{Meta, MetaOutcome};
use super::print::{write_batches, Format, MaxRows, Printer};
use super::{catch_panic, print_error, CliError, Error, Result};

/// Prompt of the interactive shell.
const PROMPT: &str = "dfgrad> ";

/// Prompt for the continuation lines of a multi-line statement.
const CONTINUATION_PROMPT: &str = "   ...> ";

/// A session and how it prints: what statements and meta-commands run in.
pub(crate) struct Shell {
    pub(crate) ctx: SessionContext,
    pub(crate) printer: Printer,
}

/// Whether to go on reading input after a meta-command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    Continue,
    Quit,
}

impl Shell {
    /// Runs every statement of `sql` in order, stopping at the first error.
    pub(crate) async fn run_statements(&self, sql: &str) -> Result<()> {
        for statement in split_statements(sql) {
            self.run_statement(&statement).await?;
        }
        Ok(())
    }

    /// Plans, executes and prints a single statement; a panic while planning or
    /// executing it is an error.
    pub(crate) async fn run_statement(&self, sql: &str) -> Result<()> {
        super::progress::start();
        let result = catch_panic(self.execute(sql)).await;
        super::progress::finish();
        result?
    }

    async fn execute(&self, sql: &str) -> Result<()> {
        let start = Instant::now();
        let df = self.ctx.sql(sql).await?;
        let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
        let mut printer = self.printer;
        // As datafusion-cli: plans, explanations and descriptions are shown whole.
        if matches!(
            df.logical_plan(),
            LogicalPlan::Explain(_) | LogicalPlan::Analyze(_) | LogicalPlan::DescribeTable(_)
        ) {
            printer.maxrows = MaxRows::Unlimited;
        }
        let task_ctx = Arc::new(df.task_ctx());
        let plan = df.create_physical_plan().await?;
        if printer.format == Format::Automatic && plan.boundedness().is_unbounded() {
            if plan.pipeline_behavior() == EmissionType::Final {
                return Err(CliError::UnboundedFinalResult.into());
            }
            let stream = execute_stream(plan, task_ctx)?;
            return stream_csv(stream, !schema.fields().is_empty()).await;
        }
        // The rows shown are held in memory: they count against -m.
        let reservation = MemoryConsumer::new("dfgrad query results")
            .register(&self.ctx.runtime_env().memory_pool);
        let limit = match printer.is_table() {
            true => printer.maxrows.rows(),
            false => usize::MAX,
        };
        let mut stream = execute_stream(plan, task_ctx)?;
        let mut batches: Vec<RecordBatch> = Vec::new();
        let mut kept = 0;
        let mut rows = 0;
        while let Some(batch) = stream.next().await {
            let batch = batch?;
            rows += batch.num_rows();
            if kept < limit && batch.num_rows() > 0 {
                let batch = batch.slice(0, batch.num_rows().min(limit - kept));
                reservation.try_grow(batch.get_array_memory_size())?;
                kept += batch.num_rows();
                batches.push(batch);
            }
        }
        super::progress::finish();
        printer.print(&schema, &batches, rows, start)
    }

    /// Runs the statements and meta-commands of `input` (piped stdin, an rc
    /// file) as they arrive: each statement once its `;` is read, the last one
    /// also without `;`; a line starting with `\` between statements is a
    /// meta-command. Stops at the first error; `\q` stops reading.
    pub(crate) async fn run_lines(&mut self, input: impl BufRead) -> Result<Flow> {
        // What was read after the last statement that ended with `;`.
        let mut pending = String::new();
        for line in input.lines() {
            let line = line?;
            let split = split_terminated(&pending);
            if !split.rest_has_content && !split.in_block_comment {
                if let Some(meta) = Meta::parse(&line) {
                    if self.run_meta(meta?).await? == Flow::Quit {
                        return Ok(Flow::Quit);
                    }
                    continue;
                }
            }
            pending.push_str(&line);
            pending.push('\n');
            let split = split_terminated(&pending);
            for statement in &split.complete {
                self.run_statement(statement).await?;
            }
            pending = split.rest.to_string();
        }
        self.run_statements(&pending).await?;
        Ok(Flow::Continue)
    }

    /// Runs a meta-command.
    pub(crate) async fn run_meta(&mut self, meta: Meta) -> Result<Flow> {
        Ok(match super::commands::run(self, meta).await? {
            MetaOutcome::Done => Flow::Continue,
            MetaOutcome::Quit => Flow::Quit,
        })
    }

    /// The interactive shell: errors are printed and the shell goes on.
    pub(crate) async fn repl(&mut self) -> Result<()> {
        let mut editor = DefaultEditor::new()?;
        loop {
            let sql = match read_statement(&mut editor)? {
                ReplInput::Sql(sql) => sql,
                ReplInput::Meta(line) => {
                    let outcome = match Meta::parse(&line) {
                        Some(Ok(meta)) => self.run_meta(meta).await,
                        Some(Err(e)) => Err(e.into()),
                        None => Ok(Flow::Continue),
                    };
                    match outcome {
                        Ok(Flow::Quit) => return Ok(()),
                        Ok(Flow::Continue) => {}
                        Err(e) => print_error(e.as_ref()),
                    }
                    continue;
                }
                ReplInput::Quit => return Ok(()),
            };
            tokio::select! {
                result = self.run_statements(&sql) => {
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
}

/// Prints the rows of an unbounded source's `stream` as CSV as they arrive
/// (`automatic` format; datafusion-cli does the same).
async fn stream_csv(
    mut stream: datafusion::execution::SendableRecordBatchStream,
    columns: bool,
) -> Result<()> {
    let mut header = true;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        if !columns || batch.num_rows() == 0 {
            continue;
        }
        let mut out = std::io::stdout().lock();
        write_batches(&mut out, Format::Csv, &[batch], header)?;
        std::io::Write::flush(&mut out)?;
        header = false;
    }
    Ok(())
}

/// What the shell read.
#[derive(Debug)]
enum ReplInput {
    /// A complete statement (or several), ending with `;`.
    Sql(String),
    /// A line starting with `\`, typed where a statement would start.
    Meta(String),
    /// `quit` or end of input.
    Quit,
}

/// Reads lines until one ends with `;` (or the user quits, or types a
/// meta-command).
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
                    if matches!(trimmed, "quit" | "quit;" | "exit" | "exit;") {
                        return Ok(ReplInput::Quit);
                    }
                    if trimmed.starts_with('\\') {
                        editor.add_history_entry(trimmed)?;
                        return Ok(ReplInput::Meta(trimmed.to_string()));
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
            Err(e) => return Err(Error::from(e)),
        }
    }
}

/// `sql` split at its `;`s (see [`split_terminated`]).
#[derive(Debug, PartialEq, Eq)]
pub struct Split<'a> {
    /// The statements ended by `;`, trimmed, without those holding only
    /// whitespace and comments.
    pub complete: Vec<String>,
    /// What follows the last `;` that ends a statement, as written.
    pub rest: &'a str,
    /// Whether `rest` holds anything besides whitespace and comments.
    pub rest_has_content: bool,
    /// Whether `rest` ends inside a `/* */` comment.
    pub in_block_comment: bool,
}

/// Splits `sql` at `;`, ignoring `;` inside single-quoted strings,
/// double-quoted identifiers, `--` line comments and `/* */` block comments.
pub fn split_terminated(sql: &str) -> Split<'_> {
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
        in_block_comment: state == State::BlockComment,
    }
}

/// Splits `sql` into statements at `;` (see [`split_terminated`]); the last
/// statement needs no `;`. Statements are trimmed; those holding only
/// whitespace and comments are dropped.
pub fn split_statements(sql: &str) -> Vec<String> {
    let split = split_terminated(sql);
    let mut statements = split.complete;
    if split.rest_has_content {
        statements.push(split.rest.trim().to_string());
    }
    statements
}

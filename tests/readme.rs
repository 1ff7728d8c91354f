//! Every SQL snippet of README.md runs, so the README cannot drift from
//! what the code does (issue 26).
//!
//! - Each ```` ```sql ```` block (also one indented in a list item) is run by
//!   `dfgrad -f` in a fresh session and must succeed — unless the line just
//!   before its fence is `<!-- fails: TEXT -->`: then it must fail, with TEXT
//!   in its one-line error.
//! - Each `$ cargo run --release --bin dfgrad -- ARGS` command of a
//!   ```` ```console ```` block is run (as `dfgrad ARGS`, through `sh`) and
//!   must print exactly the lines shown below it.

use std::process::Command;

use crate::common::{assert_one_error_line, path_str, piped};

const README: &str = include_str!("../README.md");

/// The command prefix of the README's console examples, and what runs it here.
const CARGO_RUN: &str = "cargo run --release --bin dfgrad --";

/// A fenced block of the README.
#[derive(Debug)]
struct Block {
    /// The line of its opening fence (1-based).
    line: usize,
    /// Its language (`sql`, `console`, …).
    lang: String,
    /// Its text, without the fence's indentation.
    text: String,
    /// The text its error must hold, for a block marked `<!-- fails: TEXT -->`.
    fails: Option<String>,
}

/// The fenced blocks of `markdown`.
fn blocks(markdown: &str) -> Vec<Block> {
    let lines: Vec<&str> = markdown.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let trimmed = lines[i].trim_start();
        let Some(lang) = trimmed.strip_prefix("```") else {
            i += 1;
            continue;
        };
        let indent = lines[i].len() - trimmed.len();
        let fails = i
            .checked_sub(1)
            .map(|p| lines[p].trim())
            .and_then(|p| p.strip_prefix("<!-- fails:"))
            .and_then(|p| p.strip_suffix("-->"))
            .map(|text| text.trim().to_string());
        let start = i;
        let mut text = String::new();
        i += 1;
        while i < lines.len() && lines[i].trim_start() != "```" {
            let line = lines[i];
            let cut = indent.min(line.len() - line.trim_start().len());
            text.push_str(&line[cut..]);
            text.push('\n');
            i += 1;
        }
        assert!(i < lines.len(), "README.md:{}: unclosed block", start + 1);
        blocks.push(Block {
            line: start + 1,
            lang: lang.trim().to_string(),
            text,
            fails,
        });
        i += 1;
    }
    blocks
}

#[test]
fn every_sql_block_runs() {
    let sql: Vec<Block> = blocks(README)
        .into_iter()
        .filter(|b| b.lang == "sql")
        .collect();
    assert!(sql.len() >= 4, "too few SQL blocks found: {sql:?}");
    assert!(sql.iter().any(|b| b.fails.is_some()), "{sql:?}");
    let dir = tempfile::tempdir().unwrap();
    for block in &sql {
        let file = dir.path().join(format!("block{}.sql", block.line));
        std::fs::write(&file, &block.text).unwrap();
        let run = piped(&["-q", "--format", "csv", "-f", path_str(&file)], "");
        let at = format!("README.md:{}", block.line);
        match &block.fails {
            None => assert!(
                run.status.success(),
                "{at} failed: {}\n{}",
                run.stderr,
                block.text
            ),
            Some(expected) => {
                assert!(!run.status.success(), "{at} should fail: {}", run.stdout);
                assert_one_error_line(&run.stderr);
                assert!(
                    run.stderr.contains(expected.as_str()),
                    "{at}: expected {expected:?} in {}",
                    run.stderr
                );
            }
        }
    }
}

#[test]
fn every_console_example_prints_what_it_shows() {
    let console: Vec<Block> = blocks(README)
        .into_iter()
        .filter(|b| b.lang == "console")
        .collect();
    assert!(!console.is_empty());
    let mut commands = 0;
    for block in &console {
        for (command, shown) in examples(&block.text) {
            let at = format!("README.md:{}", block.line);
            let args = command
                .strip_prefix(CARGO_RUN)
                .unwrap_or_else(|| panic!("{at}: a console example runs `{CARGO_RUN}`"));
            let script = format!("'{}' {args}", env!("CARGO_BIN_EXE_dfgrad"));
            let output = Command::new("sh")
                .args(["-c", &script])
                .env_remove("RUST_BACKTRACE")
                .output()
                .expect("failed to run sh");
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success(),
                "{at}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            let printed: Vec<&str> = stdout.lines().map(str::trim_end).collect();
            let shown: Vec<&str> = shown.iter().map(|l| l.trim_end()).collect();
            assert_eq!(printed, shown, "{at}");
            commands += 1;
        }
    }
    assert!(commands >= 1);
}

/// The `$ ` commands of a console block (a command goes on while a quote is
/// open) with the lines shown after each.
fn examples(text: &str) -> Vec<(String, Vec<String>)> {
    let mut examples: Vec<(String, Vec<String>)> = Vec::new();
    let mut open_quote = false;
    for line in text.lines() {
        match (open_quote, line.strip_prefix("$ ")) {
            (false, Some(command)) => examples.push((command.to_string(), Vec::new())),
            (true, _) => {
                let (command, _) = examples.last_mut().expect("a command");
                command.push('\n');
                command.push_str(line);
            }
            (false, None) => {
                if let Some((_, shown)) = examples.last_mut() {
                    shown.push(line.to_string());
                }
                continue;
            }
        }
        let command = &examples.last().expect("a command").0;
        open_quote = command.matches('"').count() % 2 == 1;
    }
    examples
}

#[test]
fn blocks_are_found_with_their_marks() {
    let text = "a\n<!-- fails: [kind] -->\n  ```sql\n  SELECT 1;\n    x\n  ```\n```console\n$ cmd \"a\nb\"\nout\n```\n";
    let found = blocks(text);
    assert_eq!(found.len(), 2);
    assert_eq!(found[0].lang, "sql");
    assert_eq!(found[0].text, "SELECT 1;\n  x\n");
    assert_eq!(found[0].fails.as_deref(), Some("[kind]"));
    assert_eq!(found[1].fails, None);
    assert_eq!(
        examples(&found[1].text),
        vec![("cmd \"a\nb\"".to_string(), vec!["out".to_string()])]
    );
}

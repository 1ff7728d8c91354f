//! Every SQL snippet of README.md and of the reference pages in docs/ runs,
//! so the documentation cannot drift from what the code does (issues 26, 46).
//!
//! - Each ```` ```sql ```` block (also one indented in a list item) is run by
//!   `dfgrad -f` in a fresh session and must succeed — unless the line just
//!   before its fence is `<!-- fails: TEXT -->`: then it must fail, with TEXT
//!   in its one-line error.
//! - Each `$ cargo run --features test-build --bin dfgrad -- ARGS` command of a
//!   ```` ```console ```` block is run (as `dfgrad ARGS`, through `sh`) and
//!   must print exactly the lines shown below it.

use std::process::Command;

use crate::common::{assert_one_error_line, path_str, piped};

/// A page's path in the repository, with its text.
macro_rules! page {
    ($path:literal) => {
        ($path, include_str!(concat!("../", $path)))
    };
}

/// Every page whose examples are checked, with its path for error locations:
/// the README and each page of `docs/` (`every_docs_page_is_checked` fails
/// if a page of `docs/` is missing here).
const PAGES: &[(&str, &str)] = &[
    page!("README.md"),
    page!("docs/README.md"),
    page!("docs/sql-reference.md"),
    page!("docs/relational.md"),
    page!("docs/recursion.md"),
    page!("docs/tensors.md"),
    page!("docs/export.md"),
    page!("docs/python.md"),
    page!("docs/cli.md"),
    page!("docs/ballista.md"),
    page!("docs/errors.md"),
    // Measurement records: no `sql` or `console` block today (its commands
    // are `sh` blocks, not run here), but one added later runs like the rest.
    page!("docs/benchmarks.md"),
];

/// The command prefix of the pages' console examples, and what runs it here.
const CARGO_RUN: &str = "cargo run --features test-build --bin dfgrad --";

/// A fenced block of a page.
#[derive(Debug)]
struct Block {
    /// Where its opening fence is: `page:line` (1-based).
    at: String,
    /// Its language (`sql`, `console`, …).
    lang: String,
    /// Its text, without the fence's indentation.
    text: String,
    /// The text its error must hold, for a block marked `<!-- fails: TEXT -->`.
    fails: Option<String>,
}

/// The fenced blocks of every page in [`PAGES`].
fn all_blocks() -> Vec<Block> {
    PAGES
        .iter()
        .flat_map(|(page, markdown)| blocks(page, markdown))
        .collect()
}

/// The fenced blocks of `markdown`, the text of `page`.
fn blocks(page: &str, markdown: &str) -> Vec<Block> {
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
        assert!(i < lines.len(), "{page}:{}: unclosed block", start + 1);
        blocks.push(Block {
            at: format!("{page}:{}", start + 1),
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
    let sql: Vec<Block> = all_blocks()
        .into_iter()
        .filter(|b| b.lang == "sql")
        .collect();
    assert!(sql.len() >= 4, "too few SQL blocks found: {sql:?}");
    assert!(sql.iter().any(|b| b.fails.is_some()), "{sql:?}");
    let dir = tempfile::tempdir().unwrap();
    for (n, block) in sql.iter().enumerate() {
        let file = dir.path().join(format!("block{n}.sql"));
        std::fs::write(&file, &block.text).unwrap();
        let run = piped(&["-q", "--format", "csv", "-f", path_str(&file)], "");
        let at = &block.at;
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
    let console: Vec<Block> = all_blocks()
        .into_iter()
        .filter(|b| b.lang == "console")
        .collect();
    assert!(!console.is_empty());
    let mut commands = 0;
    for block in &console {
        for (command, shown) in examples(&block.text) {
            let at = &block.at;
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
    let found = blocks("page.md", text);
    assert_eq!(found.len(), 2);
    assert_eq!(found[0].at, "page.md:3");
    assert_eq!(found[1].at, "page.md:7");
    assert_eq!(found[0].lang, "sql");
    assert_eq!(found[0].text, "SELECT 1;\n  x\n");
    assert_eq!(found[0].fails.as_deref(), Some("[kind]"));
    assert_eq!(found[1].fails, None);
    assert_eq!(
        examples(&found[1].text),
        vec![("cmd \"a\nb\"".to_string(), vec!["out".to_string()])]
    );
}

/// Every page of `docs/` is in [`PAGES`], so none has examples left unrun.
#[test]
fn every_docs_page_is_checked() {
    let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs");
    let mut pages = 0;
    for entry in std::fs::read_dir(&docs).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if !name.ends_with(".md") {
            continue;
        }
        let page = format!("docs/{name}");
        assert!(
            PAGES.iter().any(|(p, _)| *p == page),
            "{page} is not in tests/readme.rs's PAGES: its examples would not run"
        );
        pages += 1;
    }
    assert_eq!(
        pages + 1,
        PAGES.len(),
        "PAGES names a page that is not there"
    );
}

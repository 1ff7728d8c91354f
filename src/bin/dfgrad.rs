//! `dfgrad`: a command-line SQL shell for differentiable SQL on Apache
//! DataFusion, in datafusion-cli's conventions. Its flags, meta-commands and
//! output formats are documented in [`datafusion_grad::cli`] (and in
//! `docs/cli.md`); the shell itself lives in the library, so this binary
//! compiles in seconds on top of it.

fn main() -> std::process::ExitCode {
    datafusion_grad::cli::main()
}

//! The library's unit tests, compiled into the suite so that the library is
//! compiled once (not a second time as its own test harness). Each file
//! tests the module of `src/` it is named after (`engine_sign.rs`:
//! `src/engine/sign.rs`), through its public items; what only these tests
//! need is public and hidden from the docs.

mod ballista_kept;
mod cli;
mod cli_commands;
mod cli_print;
mod cli_shell;
mod cli_tables;
mod engine_graph;
mod engine_guard;
mod engine_sign;
mod exec_contraction_groups;
mod exec_contraction_numbering;
mod exec_shared;
mod exec_split_scan_local_reader;
mod exec_split_scan_zip;
mod export_tidy;
mod options;
mod plan_cross_joins;
mod plan_free_variables;
mod plan_lineage;
mod plan_reverse_block;
mod reserved;
mod tensor_cuda;
mod tensor_kernels;
mod tensor_linalg;
mod tensor_shape;

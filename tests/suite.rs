//! The integration tests, compiled as one crate: each file of `tests/` is a
//! module here, so the test build compiles and links DataFusion's generic
//! code once instead of once per file (about two minutes of a 2-core machine
//! each), and the tests of all files run in parallel. One file's tests:
//! `cargo test --test suite -- cli::`. (`tests/sqllogictests.rs` has its own
//! harness and stays a crate of its own.)

#[path = "aggregate_properties.rs"]
mod aggregate_properties;
#[path = "api.rs"]
mod api;
#[path = "arrow_ffi.rs"]
mod arrow_ffi;
#[path = "ballista.rs"]
mod ballista;
#[path = "broadcast.rs"]
mod broadcast;
#[path = "checkpoints.rs"]
mod checkpoints;
#[path = "cli.rs"]
mod cli;
/// Helpers shared by the test modules (running `dfgrad`, comparing numbers).
mod common;
#[path = "contraction.rs"]
mod contraction;
#[path = "cuda.rs"]
mod cuda;
#[path = "export.rs"]
mod export;
/// Random expressions and their planning time, shared with the planning benchmark.
#[path = "../benches/expressions/mod.rs"]
mod expressions;
/// The expression families of the rewrite benchmark.
#[path = "../benches/families/mod.rs"]
mod families;
#[path = "group_join.rs"]
mod group_join;
#[path = "invariant.rs"]
mod invariant;
#[path = "layers.rs"]
mod layers;
#[path = "planning.rs"]
mod planning;
#[path = "properties.rs"]
mod properties;
#[path = "readme.rs"]
mod readme;
#[path = "relational_properties.rs"]
mod relational_properties;
#[path = "shared.rs"]
mod shared;
#[path = "sizes.rs"]
mod sizes;
#[path = "substrait.rs"]
mod substrait;
#[path = "tensor_properties.rs"]
mod tensor_properties;
#[path = "training.rs"]
mod training;
/// The library's unit tests (`tests/unit/`), one file per module of `src/`.
#[path = "unit/mod.rs"]
mod unit;

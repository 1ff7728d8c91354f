//! The architecture as a test: the top-level modules of `src/` form layers
//! (foundation, primitives, engine, plan and exec, physical planning,
//! frontends; see `src/lib.rs`), and a module may use (`crate::…`, outside
//! comments and its unit tests) only modules of its own layer or below,
//! with no two modules of one layer using each other — what a derivative
//! *is* (`plan`) and how it *runs* (`exec`) meet only in
//! `physical_planner`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Each top-level module of `src/` and its layer (lower uses nothing higher).
/// `lib` stands for the crate root's own functions (`crate::register`,
/// `crate::session_context`: everything installed); Ballista's client builds
/// on them.
const LAYERS: &[(&str, u8)] = &[
    ("error", 0),
    ("reserved", 0),
    ("options", 0),
    ("tensor", 1),
    ("rules", 1),
    ("engine", 2),
    ("plan", 3),
    ("exec", 3),
    ("physical_planner", 4),
    ("marker", 5),
    ("export", 5),
    ("table_factor", 5),
    ("substrait", 5),
    ("lib", 6),
    ("ballista", 6),
    ("cli", 7),
];

fn layer(module: &str) -> u8 {
    LAYERS
        .iter()
        .find(|(m, _)| *m == module)
        .unwrap_or_else(|| panic!("top-level module `{module}` has no layer in tests/layers.rs"))
        .1
}

/// The Rust files under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`None` for the binaries).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    match first.as_str() {
        "bin" => None,
        "lib.rs" => Some("lib".to_string()),
        f => Some(f.trim_end_matches(".rs").to_string()),
    }
}

/// The top-level modules the code of `text` names as `crate::NAME` (comments
/// and `#[cfg(test)]` modules left out). A name that is not a module is one
/// of the crate root's own items.
fn uses(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let code = line.split("//").next().unwrap();
        let test_module = lines.get(i + 1).is_some_and(|l| l.starts_with("mod tests"));
        if line.starts_with("#[cfg(test)]") && test_module {
            break;
        }
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if name.is_empty() {
                continue;
            }
            let module = if LAYERS.iter().any(|(m, _)| *m == name) {
                name
            } else {
                "lib".to_string()
            };
            found.insert(module);
        }
    }
    found
}

#[test]
fn modules_use_only_their_layer_and_below() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut wrong = Vec::new();
    for file in &files {
        let Some(module) = module_of(&src, file) else {
            continue;
        };
        let text = fs::read_to_string(file).unwrap();
        for used in uses(&text) {
            if used == module {
                continue;
            }
            if layer(&used) > layer(&module) {
                wrong.push(format!(
                    "{} (layer {}) uses crate::{used} (layer {})",
                    file.strip_prefix(&src).unwrap().display(),
                    layer(&module),
                    layer(&used)
                ));
            }
            graph.entry(module.clone()).or_default().insert(used);
        }
    }
    assert!(wrong.is_empty(), "upward uses:\n{}", wrong.join("\n"));
    let mut circles = Vec::new();
    for (a, used) in &graph {
        for b in used {
            if a < b && graph.get(b).is_some_and(|u| u.contains(a)) {
                circles.push(format!("{a} <-> {b}"));
            }
        }
    }
    assert!(circles.is_empty(), "modules using each other: {circles:?}");
    for (a, b) in [("plan", "exec"), ("exec", "plan")] {
        assert!(
            !graph.get(a).is_some_and(|u| u.contains(b)),
            "{a} uses {b}: they meet only in physical_planner"
        );
    }
    // The test sees what it claims to: the engine uses the rules, the plan
    // layer the engine, the markers the plan layer.
    for (from, to) in [
        ("engine", "rules"),
        ("plan", "engine"),
        ("marker", "plan"),
        ("physical_planner", "plan"),
        ("physical_planner", "exec"),
    ] {
        assert!(
            graph[from].contains(to),
            "{from} does not use {to}: {graph:?}"
        );
    }
}

#[test]
fn the_scanner_finds_uses_outside_comments_and_tests() {
    let text = "use crate::engine::call::as_marker; // crate::plan\n\
                fn f() { crate::register(x); }\n\
                #[cfg(test)]\nmod tests { use crate::export; }\n";
    let found: Vec<String> = uses(text).into_iter().collect();
    assert_eq!(found, ["engine", "lib"]);
}

//! The crates' import graphs have no circle: a room imports only rooms below it.
//!
//! Each crate's top-level modules (`src/<room>.rs` or `src/<room>/`) are the nodes; an edge
//! `a -> b` is any `crate::b` path (in a `use` or inline) in a file of room `a`, outside
//! comments and `#[cfg(test)]` modules. The test fails naming the rooms of every circle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.expect("directory entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The text of a file without its comments and without its `#[cfg(test)]` modules (test
/// code may reach any room).
fn code(text: &str) -> String {
    let text: String = text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n");
    let mut out = String::new();
    let mut rest = text.as_str();
    // `#[cfg(test)]` and `#[cfg(all(test, ...))]`: items only tests compile.
    let next = |s: &str| ["#[cfg(test)]", "#[cfg(all(test,"].iter().filter_map(|m| s.find(m)).min();
    while let Some(at) = next(rest) {
        out.push_str(&rest[..at]);
        let attr_end = rest[at..].find(")]").map_or(rest.len(), |e| at + e + 2);
        let after = &rest[attr_end..];
        // The item the attribute covers: up to its `;`, or its braces' end.
        let (semi, brace) = (after.find(';'), after.find('{'));
        let end = match (semi, brace) {
            (Some(s), Some(b)) if s < b => s + 1,
            (_, Some(b)) => {
                let mut depth = 0usize;
                let mut end = after.len();
                for (i, c) in after[b..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = b + i + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            (Some(s), None) => s + 1,
            (None, None) => after.len(),
        };
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// The rooms `text` names through `crate::room` paths, `use crate::{a, b::c}` included.
fn named_rooms(text: &str) -> BTreeSet<String> {
    let mut rooms = BTreeSet::new();
    let ident = |s: &str| s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>();
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // A group: each item's first segment, nested groups skipped by depth.
            let (mut depth, mut item_start) = (0usize, true);
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && !c.is_whitespace() => {
                        item_start = false;
                        let name = ident(&group[i..]);
                        if !name.is_empty() {
                            rooms.insert(name);
                        }
                    }
                    _ => {}
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                rooms.insert(name);
            }
        }
    }
    rooms
}

/// The items the crate root re-exports (`pub use room::{A, b}` in lib.rs), with their rooms,
/// so that `crate::A` counts as an import of `room`.
fn reexports(src: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Ok(lib) = std::fs::read_to_string(src.join("lib.rs")) else { return out };
    for line in code(&lib).lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("pub use ").or_else(|| line.strip_prefix("pub(crate) use ")) else {
            continue;
        };
        let rest = rest.trim_end_matches(';');
        let Some((room, items)) = rest.split_once("::") else { continue };
        let items = items.trim_start_matches('{').trim_end_matches('}');
        for item in items.split(',') {
            let name = item.trim().rsplit("::").next().unwrap_or("").split(" as ").last().unwrap_or("").trim();
            if !name.is_empty() {
                out.insert(name.to_string(), room.to_string());
            }
        }
    }
    out
}

/// The room graph of the crate whose sources are in `src`.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let names = reexports(src);
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(src).expect("under src");
        let first = rel.components().next().expect("a component").as_os_str().to_string_lossy().into_owned();
        let room = first.trim_end_matches(".rs").to_string();
        // The crate root, and files only tests compile (`#[cfg(test)] mod owner_tests;`).
        let name = f.file_name().expect("a file name").to_string_lossy();
        if room == "lib" || room == "main" || name.ends_with("tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&f).expect("readable source");
        let edges = g.entry(room.clone()).or_default();
        let named = named_rooms(&code(&text)).into_iter().map(|r| names.get(&r).cloned().unwrap_or(r));
        edges.extend(named.filter(|r| *r != room));
    }
    g
}

/// The strongly connected components of more than one room (Tarjan's algorithm).
fn circles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on.insert(v);
        for w in s.g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.g.contains_key(w) {
                continue;
            }
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = s.stack.pop().expect("on the stack");
                s.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = State {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

#[test]
fn the_parser_sees_paths_groups_and_nested_groups() {
    let rooms = named_rooms("use crate::{zone::{Zone, Watermark}, mem_map, sync::fence};\nlet x = crate::pcp::CAP;");
    assert_eq!(rooms.into_iter().collect::<Vec<_>>(), ["mem_map", "pcp", "sync", "zone"]);
    let mut g = BTreeMap::new();
    g.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    g.insert("b".to_string(), BTreeSet::from(["c".to_string()]));
    g.insert("c".to_string(), BTreeSet::from(["a".to_string()]));
    g.insert("d".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(circles(&g), vec![vec!["a".to_string(), "b".to_string(), "c".to_string()]]);
}

#[test]
fn no_crate_has_a_circle_of_rooms() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for src in ["crates/zonal/src", "crates/numab/src", "src"] {
        let g = graph(&root.join(src));
        let found = circles(&g);
        assert!(found.is_empty(), "{src}: rooms that import each other in a circle: {found:?}\nits graph: {g:#?}");
    }
}

#!/usr/bin/env python3
"""Fails when modules of one folder import each other in a circle (`use super::a` in b and
`use super::b` in a, or a longer loop): a circle means neither can be understood, changed or
tested without the other, and layers that should point one way do not.

    python3 scripts/import-circles.py [SRC_DIR]     (default: src)

Reads `use super::NAME` and `super::NAME::` paths of each file against its siblings, and
`crate::PATH::NAME` where PATH is the folder's own module path (at the crate's root, where
`main.rs` or `lib.rs` sits, `crate::NAME` names a sibling). A folder's `mod.rs` is the
folder's own module, whose children may name it only as `super`, which is not counted: the
parent owns its children."""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "src")
circles = []
for folder in sorted({p.parent for p in root.rglob("*.rs")}):
    siblings = {}
    for path in folder.glob("*.rs"):
        if path.name == "mod.rs":
            continue
        siblings[path.stem] = path
    for sub in folder.iterdir():
        if sub.is_dir() and (sub / "mod.rs").exists():
            siblings[sub.name] = sub / "mod.rs"
    graph = {}
    # The folder's path from the crate's root, as `crate::` paths spell it.
    prefix = "".join(part + "::" for part in folder.relative_to(root).parts)
    crate_path = re.escape("crate::" + prefix)
    for name, path in siblings.items():
        text = path.read_text()
        used = set(re.findall(r"\bsuper::([a-z_][a-z0-9_]*)", text))
        used |= set(re.findall(r"\b" + crate_path + r"([a-z_][a-z0-9_]*)", text))
        for group in re.findall(r"use\s+" + crate_path + r"\{([^}]*)\}", text):
            used |= set(re.findall(r"(?:^|[,\s{])([a-z_][a-z0-9_]*)", group))
        # `use super::{a, b::c}` lists
        for group in re.findall(r"use\s+super::\{([^}]*)\}", text):
            used |= set(re.findall(r"(?:^|[,\s{])([a-z_][a-z0-9_]*)", group))
        graph[name] = sorted(u for u in used if u in siblings and u != name)

    # Every cycle, found by depth-first search from each module in order.
    def walk(start, node, trail):
        for nxt in graph.get(node, []):
            if nxt == start:
                circles.append((folder, trail + [start]))
            elif nxt not in trail and nxt > start:
                walk(start, nxt, trail + [nxt])

    for name in sorted(graph):
        walk(name, name, [name])

for folder, cycle in circles:
    print(f"{folder}: {' -> '.join(cycle)}")
if circles:
    print(f"{len(circles)} circle(s) of imports")
    sys.exit(1)
print("no circle of imports")

#!/usr/bin/env python3
"""Fails if the file-level import graph of `src/` has a cycle, or if `src/backend/` imports
`crate::model` (the backend knows nothing of model files; `runner` sits above both).

The graph: one node per library source file (the module tree under `src/lib.rs`); an edge
from a file to the file of every module its `use` declarations and inline `crate::` paths
name (`crate::`, `super::`, `self::` and child-module paths, groups `{...}` expanded), and of
every `crate::`, `super::` and `self::` path written in an expression or a type.
A name a module re-exports (`pub use x::Name`) resolves to the file it comes from, and
re-exports themselves are not edges (they forward names, they run no code). Inline
`mod name { ... }` blocks (tests, helpers) belong to their file.

Usage: python3 scripts/check_imports.py [SRC_DIR]   (default: src/ next to this script)
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def module_files(src: pathlib.Path) -> dict[tuple[str, ...], pathlib.Path]:
    """Module path (without `crate`) -> file, for the library tree under lib.rs."""
    files = {(): src / "lib.rs"}
    for path in sorted(src.rglob("*.rs")):
        rel = path.relative_to(src)
        if rel.parts in (("lib.rs",), ("main.rs",)):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "mod":
            parts.pop()
        files[tuple(parts)] = path
    return files


def strip_comments(text: str) -> str:
    """Comments and string contents removed, and `pub(in path)` visibilities (they name a
    module, they use nothing of it)."""
    text = re.sub(r"\bpub\(in\s+[\w:]+\)", "pub", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    return re.sub(r"//[^\n]*", "", text)


def expand(tree: str) -> list[str]:
    """`a::{b, c::{d, e}}` -> [`a::b`, `a::c::d`, `a::c::e`] (aliases dropped)."""
    tree = re.sub(r"\s+as\s+\w+", "", tree)
    tree = re.sub(r"\s+", "", tree)
    if "{" not in tree:
        return [tree]
    head, rest = tree.split("{", 1)
    body = rest[: rest.rindex("}")]
    items, depth, cur = [], 0, ""
    for ch in body:
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    items.append(cur)
    out = []
    for item in filter(None, items):
        for leaf in expand(item):
            out.append(head + leaf if leaf != "self" else head.rstrip(":"))
    return out


USE = re.compile(r"\b(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);")
INLINE = re.compile(r"\bcrate(?:::\w+)+")
# `super::x::f()` / `self::x::T` in code (not in `use`, handled above): relative to the
# enclosing file module and inline module.
RELATIVE = re.compile(r"(?<![\w:])(?:super|self)(?:::(?:super|\w+))+")
MOD_BLOCK = re.compile(r"\bmod\s+(\w+)\s*\{")


def inline_module_at(text: str, pos: int) -> list[str]:
    """Names of the inline `mod x { ... }` blocks enclosing `pos`."""
    stack = []
    for m in MOD_BLOCK.finditer(text[:pos]):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += text[i] == "{"
            depth -= text[i] == "}"
            i += 1
        if i > pos:
            stack.append(m.group(1))
    return stack


class Graph:
    def __init__(self, src: pathlib.Path):
        self.files = module_files(src)
        self.text = {m: strip_comments(p.read_text()) for m, p in self.files.items()}
        self.reexports: dict[tuple[str, ...], dict[str, list[str]]] = {}
        for mod, text in self.text.items():
            names = {}
            for m in USE.finditer(text):
                if m.group(1) and not inline_module_at(text, m.start()):
                    for path in expand(m.group(2)):
                        segs = path.split("::")
                        names[segs[-1]] = self.absolute(mod, [], segs)
            self.reexports[mod] = names

    def absolute(self, mod, inline, segs):
        """A use path as absolute segments from the crate root (None if external)."""
        segs = [s for s in segs if s]
        here = list(mod) + list(inline)
        if segs[0] == "crate":
            return segs[1:]
        if segs[0] in ("super", "self"):
            base = here
            while segs and segs[0] in ("super", "self"):
                if segs.pop(0) == "super":
                    base = base[:-1]
            return base + segs
        if tuple(here + segs[:1]) in self.files or (inline and segs[0] == "*"):
            return here + segs
        if tuple(list(mod) + segs[:1]) in self.files:
            return list(mod) + segs
        return None

    def resolve(self, segs, seen=()):
        """The file module a path's item lives in, following re-exports."""
        for n in range(len(segs), -1, -1):
            mod = tuple(segs[:n])
            if mod in self.files:
                rest = segs[n:]
                if rest and rest[0] in self.reexports.get(mod, {}) and mod not in seen:
                    target = self.reexports[mod][rest[0]]
                    if target is not None:
                        return self.resolve(target + rest[1:], seen + (mod,))
                return mod
        return None

    def edges(self):
        out = {m: set() for m in self.files}
        for mod, text in self.text.items():
            paths = []
            for m in USE.finditer(text):
                if m.group(1) and not inline_module_at(text, m.start()):
                    continue  # a re-export forwards names; it is not a dependency
                inline = inline_module_at(text, m.start())
                for path in expand(m.group(2)):
                    paths.append(self.absolute(mod, inline, path.split("::")))
            for m in INLINE.finditer(text):
                paths.append(m.group(0).split("::")[1:])
            uses = [(m.start(), m.end()) for m in USE.finditer(text)]
            for m in RELATIVE.finditer(text):
                if any(a <= m.start() < b for a, b in uses):
                    continue
                inline = inline_module_at(text, m.start())
                paths.append(self.absolute(mod, inline, m.group(0).split("::")))
            for segs in filter(None, paths):
                target = self.resolve(segs)
                if target is not None and target != mod:
                    out[mod].add(target)
        return out


def cycles(edges):
    """Strongly connected components with more than one file (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


# Cycles known and being untied, each exactly as it stands (a cycle that grows, shrinks into
# another or appears elsewhere fails): the GPU backend's aggregate (`GpuBackend`, built in
# ctx.rs) holds the families' state types while those files also `impl GpuBackend`; it goes
# once the families take `GpuCtx` and their state types live in leaf files (issue 36 item 3).
ALLOWED_CYCLES = [
    {
        "src/backend/gpu/mod.rs",
        "src/backend/gpu/batch.rs",
        "src/backend/gpu/ctx.rs",
        "src/backend/gpu/graphs.rs",
        "src/backend/gpu/ops/sample/mod.rs",
        "src/backend/gpu/qweight.rs",
        "src/backend/gpu/types.rs",
    },
]


def main() -> int:
    src = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "src"
    g = Graph(src)
    edges = g.edges()
    name = lambda m: str(g.files[m].relative_to(src.parent))
    failed = False
    for comp in cycles(edges):
        if {name(m) for m in comp} in ALLOWED_CYCLES:
            print("known import cycle (ALLOWED_CYCLES): " + ", ".join(name(m) for m in comp))
            continue
        failed = True
        print("import cycle among: " + ", ".join(name(m) for m in comp))
        for a in comp:
            for b in sorted(edges[a] & set(comp)):
                print(f"    {name(a)} -> {name(b)}")
    for mod in sorted(edges):
        if mod[:1] == ("backend",):
            for target in sorted(edges[mod]):
                if target[:1] == ("model",):
                    failed = True
                    print(f"{name(mod)} imports {name(target)}: the backend must not use crate::model")
    if not failed:
        n_edges = sum(len(v) for v in edges.values())
        known = " but the known ones" if any({name(m) for m in c} in ALLOWED_CYCLES for c in cycles(edges)) else ""
        print(f"imports ok: {len(edges)} files, {n_edges} edges, no cycle{known}, backend free of model")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

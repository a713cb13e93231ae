"""The import graph of ``src/labelrl`` has no circles, and package ``__init__`` modules hold no logic.

The graph is read from the source (``ast``), not from ``sys.modules``, so it counts every
``import`` and ``from … import`` wherever it stands: at module level, inside a function (a
deferred import of a module that imports you back is still a circle: the two modules cannot be
understood, tested or moved one without the other), and under ``if TYPE_CHECKING:`` (an
annotation-only dependency is still a dependency; hiding one half of a circle there would pass
the check without breaking the circle).

Edges, one per imported labelrl module:

* ``import labelrl.a.b`` → ``labelrl.a.b``;
* ``from labelrl.a import b`` → ``labelrl.a.b`` when ``b`` is a submodule;
* ``from labelrl.a import name`` → the submodule that defines ``name`` when the package
  ``labelrl.a`` only re-exports it (its ``__init__`` imports it from ``labelrl.a.m``, eagerly or
  under ``TYPE_CHECKING`` for ``lazy_exports``); otherwise → ``labelrl.a`` itself;
* relative imports are resolved against the importing module's package first.

Importing ``labelrl.a.b`` also runs ``labelrl/a/__init__.py`` first; that implicit step is not an
edge, or every submodule would "import" its own package, which imports it back.

Why re-exports are followed rather than counted as edges to the package: a package's
``__init__`` imports its submodules to re-export their names, so any submodule that took a name
"via the package" would form a circle with the ``__init__`` that is only an artefact of where
the name is re-exported. Following the re-export to the defining module keeps the real
dependency (importer → definer) and drops the artefact. A name the ``__init__`` defines itself
still makes an edge to the package, so logic left in an ``__init__`` is not hidden.

Circles are the strongly connected components of more than one module (Tarjan's algorithm),
each printed with the import lines that form it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "labelrl"

# An ``__init__`` that defines functions or classes stays under this many lines; longer logic
# belongs in a named module that the ``__init__`` re-exports from.
INIT_LOGIC_MAX_LINES = 120


@dataclass(frozen=True)
class ImportLine:
    """One import statement: where it stands and the labelrl module it makes the importer need."""

    source: str  # importing module, e.g. "labelrl.ladder.arms"
    target: str  # imported labelrl module
    line: int
    text: str


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name → file, for every module of the package (``__init__`` as the package)."""
    modules = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _is_package(module: str, files: dict[str, Path]) -> bool:
    return files[module].name == "__init__.py"


def _absolute(module: str, files: dict[str, Path], level: int, name: str | None) -> str:
    """The absolute module a (possibly relative) ``from`` clause names."""
    if level == 0:
        return name or ""
    base = module.split(".") if _is_package(module, files) else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _raw_imports(module: str, files: dict[str, Path]) -> list[tuple[str, str | None, int, str]]:
    """(module, imported name or None, line, source text) for every import in the module."""
    text = files[module].read_text(encoding="utf-8")
    found = []
    for node in ast.walk(ast.parse(text)):
        line = ast.get_source_segment(text, node) if isinstance(node, (ast.Import, ast.ImportFrom)) else None
        if isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno, line) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, files, node.level, node.module)
            found += [(base, alias.name, node.lineno, line) for alias in node.names]
    return found


def _reexports(files: dict[str, Path]) -> dict[str, dict[str, str]]:
    """Package → {name it re-exports → the submodule of that package the name comes from}."""
    table: dict[str, dict[str, str]] = {}
    for module in files:
        if not _is_package(module, files):
            continue
        names = table.setdefault(module, {})
        for base, name, _, _ in _raw_imports(module, files):
            if name and base.startswith(module + ".") and base in files:
                names[name] = base
    return table


def import_lines(files: dict[str, Path] | None = None) -> list[ImportLine]:
    """Every import of a labelrl module by a labelrl module, resolved as the module docstring says."""
    files = files or module_files()
    reexports = _reexports(files)
    lines = []
    for module in files:
        for base, name, lineno, text in _raw_imports(module, files):
            for target in _targets(base, name, files, reexports):
                if target != module:
                    lines.append(ImportLine(module, target, lineno, text))
    return lines


def _targets(base: str, name: str | None, files: dict[str, Path], reexports: dict[str, dict[str, str]]) -> list[str]:
    if base not in files:
        return []
    if name is None:
        return [base]
    if f"{base}.{name}" in files:
        return [f"{base}.{name}"]
    seen = set()
    while name in reexports.get(base, {}) and base not in seen:  # follow a chain of re-exports
        seen.add(base)
        base = reexports[base][name]
    return [base]


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of ``graph`` (node → successors), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def circles(lines: list[ImportLine]) -> list[list[str]]:
    graph: dict[str, set[str]] = {}
    for item in lines:
        graph.setdefault(item.source, set()).add(item.target)
    return [c for c in strongly_connected(graph) if len(c) > 1]


def _describe(component: list[str], lines: list[ImportLine], files: dict[str, Path]) -> str:
    members = set(component)
    out = [" ↔ ".join(component)]
    for item in sorted(set(lines), key=lambda i: (i.source, i.line, i.target)):
        if item.source in members and item.target in members:
            where = files[item.source].relative_to(ROOT)
            out.append(f"    {where}:{item.line}: {item.text.splitlines()[0]}  (→ {item.target})")
    return "\n".join(out)


def test_no_import_circles():
    files = module_files()
    lines = import_lines(files)
    found = circles(lines)
    report = "\n".join(_describe(c, lines, files) for c in found)
    assert not found, f"{len(found)} import circle(s) in src/labelrl; move the shared names down a level:\n{report}"


def test_graph_sees_deferred_relative_and_submodule_imports(tmp_path):
    """The checker itself: a circle closed only by a function-level relative import, and one
    closed by ``from package import submodule``, are both found; a submodule taking a name
    that its package merely re-exports is not a circle."""
    pkg = tmp_path / PACKAGE
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("from labelrl.a.one import ONE\n")
    (pkg / "a" / "one.py").write_text("ONE = 1\n\ndef f():\n    from .two import TWO\n    return TWO\n")
    (pkg / "a" / "two.py").write_text("from labelrl.a import one\nTWO = 2\n")
    (pkg / "a" / "three.py").write_text("from labelrl.a import ONE\n")
    (pkg / "b.py").write_text("from labelrl import c\n")
    (pkg / "c.py").write_text("import labelrl.b\n")
    files = module_files(tmp_path)
    lines = import_lines(files)
    assert circles(lines) == [["labelrl.a.one", "labelrl.a.two"], ["labelrl.b", "labelrl.c"]]
    assert ImportLine("labelrl.a.three", "labelrl.a.one", 1, "from labelrl.a import ONE") in lines


def _defines_logic(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for node in tree.body)


def test_package_inits_hold_no_long_logic():
    """``report/__init__`` defines nothing; any other ``__init__`` that defines functions or
    classes is short (the logic of a package lives in its named modules)."""
    files = module_files()
    assert not _defines_logic(files[f"{PACKAGE}.report"]), "labelrl/report/__init__.py should only re-export"
    long_ones = []
    for module, path in files.items():
        n_lines = len(path.read_text(encoding="utf-8").splitlines())
        if path.name == "__init__.py" and _defines_logic(path) and n_lines > INIT_LOGIC_MAX_LINES:
            long_ones.append(f"{path.relative_to(ROOT)} ({n_lines} lines)")
    assert not long_ones, f"__init__ modules with logic over {INIT_LOGIC_MAX_LINES} lines: {long_ones}"

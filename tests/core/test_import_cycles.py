"""No import cycles among the modules of the first-party packages.

The graph is read from source with ``ast``; nothing is imported. Its nodes are the modules
of the installed packages in ``PACKAGES`` (``pkg/__init__.py`` is the module ``pkg``). Its
edges are the import statements that execute when a module runs: at module level and inside
functions and classes alike (a deferred import still needs the other module; moving an import
into a function does not remove a cycle, it hides it), except the bodies of
``if TYPE_CHECKING:`` (their ``else`` branches do run).

Which module an import statement is an edge to:

- ``import a.b.c`` is an edge to ``a.b.c`` only. Python also runs ``a/__init__.py`` and
  ``a/b/__init__.py`` on the way, but a package's ``__init__`` importing its own submodules
  and a submodule importing a sibling through the package path (``mstar.x.y`` doing
  ``import mstar.x.z``) is not a cycle: the parents are only partly initialised, and nothing
  is read from them. Counting the parents would make every such pair a false cycle.
- ``from p import n`` is an edge to ``p.n`` when ``p.n`` is a module (``n`` may be a
  submodule), else to ``p`` (``n`` is a name defined in, or re-exported by, ``p``). So a
  submodule that imports a name from its own package's ``__init__`` while that ``__init__``
  imports the submodule *is* a cycle: the name is read from a half-run module.
- Relative imports are resolved against the importing module's package (a package's
  ``__init__`` is its own package): in ``mstar/x/y.py``, ``from . import z`` is
  ``mstar.x.z`` (or ``mstar.x``), ``from ..w import v`` is ``mstar.w.v`` or ``mstar.w``.
- A target outside these packages (another distribution, the standard library) is no edge;
  a dotted name longer than any module falls back to its longest prefix that is a module.

A cycle is a strongly connected component of more than one module (Tarjan's algorithm); each
is listed with the import lines that make it. ``KNOWN_CYCLES`` lists the ones this test
tolerates for now, each with the reason; an entry that no longer matches a cycle fails too,
so the list shrinks with the code.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGES = (
    "mstar",
    "mstar_orpheus",
    "mstar_qwen3tts",
    "mstar_qwen3omni",
    "mstar_vjepa2",
    "mstar_toy",
)

# frozenset of the cycle's modules -> why it is tolerated. Empty: no cycle is tolerated.
KNOWN_CYCLES: dict[frozenset[str], str] = {}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    path: Path
    line: int


def package_modules(name: str, root: Path) -> dict[str, Path]:
    """Every module of the package ``name`` whose directory is ``root``: dotted name -> file."""
    modules: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if not all(part.isidentifier() for part in parts):
            continue  # not importable by name (e.g. a data directory with a dash)
        modules[".".join((name, *parts))] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _executed_imports(tree: ast.AST):
    """Import nodes that run: everywhere but the bodies of ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _known(dotted: str, modules: dict[str, Path]) -> str | None:
    """``dotted`` if it is a module, else its longest prefix that is; None outside the graph."""
    parts = dotted.split(".")
    while parts:
        name = ".".join(parts)
        if name in modules:
            return name
        parts.pop()
    return None


def import_edges(modules: dict[str, Path]) -> list[Edge]:
    edges: list[Edge] = []
    for source, path in modules.items():
        is_package = path.name == "__init__.py"
        package = source if is_package else source.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in _executed_imports(tree):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [_known(alias.name, modules) for alias in node.names]
            else:
                if node.level:
                    base = package.split(".")
                    if node.level - 1 >= len(base):
                        raise AssertionError(f"{path}:{node.lineno}: relative import beyond top")
                    base = base[: len(base) - (node.level - 1)]
                    origin = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    origin = node.module or ""
                for alias in node.names:
                    submodule = f"{origin}.{alias.name}"
                    targets.append(
                        submodule if submodule in modules else _known(origin, modules)
                    )
            for target in targets:
                if target is not None and target != source:
                    edges.append(Edge(source, target, path, node.lineno))
    return edges


def strongly_connected(nodes: list[str], edges: list[Edge]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components of more than one node, each sorted."""
    successors: dict[str, list[str]] = {node: [] for node in nodes}
    for edge in edges:
        if edge.target not in successors[edge.source]:
            successors[edge.source].append(edge.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(successors[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(successors[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components)


def describe(component: list[str], edges: list[Edge], roots: list[Path]) -> str:
    members = set(component)
    lines = [" <-> ".join(component)]
    for edge in sorted(set(edges), key=lambda e: (e.source, e.line, e.target)):
        if edge.source in members and edge.target in members:
            path = edge.path
            for root in roots:
                if path.is_relative_to(root.parent):
                    path = path.relative_to(root.parent)
                    break
            lines.append(f"    {path}:{edge.line}: {edge.source} -> {edge.target}")
    return "\n".join(lines)


def find_cycles(packages: dict[str, Path]) -> tuple[list[list[str]], list[Edge]]:
    modules: dict[str, Path] = {}
    for name, root in packages.items():
        modules.update(package_modules(name, root))
    edges = import_edges(modules)
    return strongly_connected(sorted(modules), edges), edges


def installed_packages() -> dict[str, Path]:
    found = {}
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)  # a top-level find_spec imports nothing
        assert spec is not None and spec.submodule_search_locations, f"{name} is not installed"
        (location,) = spec.submodule_search_locations
        found[name] = Path(location)
    return found


def test_first_party_packages_have_no_import_cycles():
    packages = installed_packages()
    cycles, edges = find_cycles(packages)
    found = {frozenset(c): c for c in cycles}
    new = [c for key, c in found.items() if key not in KNOWN_CYCLES]
    stale = [sorted(key) for key in KNOWN_CYCLES if key not in found]
    report = [describe(c, edges, list(packages.values())) for c in new]
    assert not new, (
        f"{len(new)} import cycle(s); move what both sides need into a module both import "
        "(a deferred import inside a function still counts):\n" + "\n".join(report)
    )
    assert not stale, f"KNOWN_CYCLES entries that are no longer cycles, remove them: {stale}"


def _write(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_checker_reports_cycles_and_ignores_what_does_not_execute(tmp_path):
    root = tmp_path / "pkg"
    _write(
        root,
        {
            # __init__ importing its submodules, which import siblings via the package path:
            # no cycle (only the module actually imported is an edge)
            "__init__.py": "from .sub import thing\nfrom . import other\n",
            "sub/__init__.py": "from .leaf import thing\n",
            "sub/leaf.py": "import pkg.other\nthing = 1\n",
            "other.py": "import pkg.c\n",
            # a cycle through a function-level import and a relative `from . import`
            "a.py": "def f():\n    from .b import g\n    return g\n",
            "b.py": "from . import a\ndef g():\n    return a\n",
            # TYPE_CHECKING imports are not edges, their else branches are
            "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .d import x\n",
            "d.py": "import typing\nif typing.TYPE_CHECKING:\n    pass\nelse:\n    from .e import y\nx = 1\n",
            "e.py": "from pkg.d import x\ny = 2\n",
            # a name read from the parent package's __init__, which imports this module
            "p/__init__.py": "from .q import value\nlimit = 3\n",
            "p/q.py": "from pkg.p import limit\nvalue = limit\n",
        },
    )
    cycles, edges = find_cycles({"pkg": root})
    assert cycles == [["pkg.a", "pkg.b"], ["pkg.d", "pkg.e"], ["pkg.p", "pkg.p.q"]]
    text = describe(cycles[0], edges, [root])
    assert "pkg/a.py:2: pkg.a -> pkg.b" in text and "pkg/b.py:1: pkg.b -> pkg.a" in text


@pytest.mark.parametrize(
    ("module", "statement", "target"),
    [
        ("pkg.x.y", "from . import z", "pkg.x.z"),
        ("pkg.x.y", "from . import name", "pkg.x"),
        ("pkg.x", "from . import z", "pkg.x.z"),
        ("pkg.x.y", "from ..w import v", "pkg.w.v"),
        ("pkg.x.y", "from ..w import name", "pkg.w"),
        ("pkg.x.y", "from .. import w", "pkg.w"),
        ("pkg.x.y", "import pkg.w.v", "pkg.w.v"),
        ("pkg.x.y", "import pkg.w.v.attr", "pkg.w.v"),
    ],
)
def test_relative_and_submodule_imports_resolve(tmp_path, module, statement, target):
    names = ["pkg", "pkg.x", "pkg.x.y", "pkg.x.z", "pkg.w", "pkg.w.v"]
    modules = {}
    for name in names:
        is_package = name in ("pkg", "pkg.x", "pkg.w")
        parts = name.split(".")
        path = tmp_path.joinpath(*parts, "__init__.py") if is_package else tmp_path.joinpath(
            *parts[:-1], f"{parts[-1]}.py"
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(statement + "\n" if name == module else "", encoding="utf-8")
        modules[name] = path
    assert [e.target for e in import_edges(modules)] == [target]

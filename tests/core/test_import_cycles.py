"""No import cycles among the modules of the first-party packages.

The import graph comes from grimp (the engine of import-linter), built from source: nothing
is imported. Its nodes are the modules of the installed packages in ``PACKAGES``
(``pkg/__init__.py`` is the module ``pkg``), all in one graph, so a cycle across two
distributions counts too. Its edges are the import statements that execute when a module
runs: at module level and inside functions, methods and ``try`` blocks alike (a deferred
import still needs the other module; moving an import into a function does not remove a
cycle, it hides it), except the bodies of ``if TYPE_CHECKING:`` (annotations only; their
``else`` branches do run).

Which module an import statement is an edge to (grimp's rules, checked below on a fixture):

- ``import a.b.c`` is an edge to ``a.b.c`` only, not to the parents Python runs on the way:
  a package's ``__init__`` importing its submodules while one of them imports a sibling
  through the package path is not a cycle (nothing is read from the half-run parent).
- ``from p import n`` is an edge to ``p.n`` when that is a module, else to ``p``. So a
  submodule that reads a name from its own package's ``__init__`` while that ``__init__``
  imports the submodule *is* a cycle.
- Relative imports resolve against the importing module's package; a target outside these
  packages (another distribution, the standard library) is no edge.

A cycle is a strongly connected component of more than one module (Tarjan's algorithm); each
is listed with the import lines that make it. ``KNOWN_CYCLES`` lists the ones this test
tolerates for now, each with the reason; an entry that no longer matches a cycle fails too,
so the list shrinks with the code.
"""

from __future__ import annotations

import grimp
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


def build_graph(*packages: str) -> grimp.ImportGraph:
    # cache_dir=None: no .grimp_cache directory written into the working tree
    return grimp.build_graph(*packages, exclude_type_checking_imports=True, cache_dir=None)


def strongly_connected(graph: grimp.ImportGraph) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components of more than one module, each sorted."""
    nodes = sorted(graph.modules)
    successors = {node: sorted(graph.find_modules_directly_imported_by(node)) for node in nodes}
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


def describe(graph: grimp.ImportGraph, component: list[str]) -> str:
    """The cycle's modules, then each import line between two of them."""
    members = set(component)
    lines = [" <-> ".join(component)]
    for source in component:
        for target in sorted(graph.find_modules_directly_imported_by(source) & members):
            details = graph.get_import_details(importer=source, imported=target)
            for d in sorted(details, key=lambda d: d["line_number"]):
                lines.append(
                    f"    {source}:{d['line_number']}: {d['line_contents']}  (-> {target})"
                )
    return "\n".join(lines)


def test_first_party_packages_have_no_import_cycles():
    graph = build_graph(*PACKAGES)
    assert set(PACKAGES) <= graph.modules
    found = {frozenset(c): c for c in strongly_connected(graph)}
    new = [c for key, c in found.items() if key not in KNOWN_CYCLES]
    stale = [sorted(key) for key in KNOWN_CYCLES if key not in found]
    report = [describe(graph, c) for c in new]
    assert not new, (
        f"{len(new)} import cycle(s); move what both sides need into a module both import "
        "(a deferred import inside a function still counts):\n" + "\n".join(report)
    )
    assert not stale, f"KNOWN_CYCLES entries that are no longer cycles, remove them: {stale}"


FIXTURE = {
    # __init__ importing its submodules, which import siblings via the package path:
    # no cycle (only the module actually imported is an edge)
    "__init__.py": "from .sub import thing\nfrom . import other\n",
    "sub/__init__.py": "from .leaf import thing\n",
    "sub/leaf.py": "import cyclefx.other\nthing = 1\n",
    "other.py": "import cyclefx.c\n",
    # a cycle through a function-level import and a relative `from . import`
    "a.py": "def f():\n    from .b import g\n    return g\n",
    "b.py": "from . import a\ndef g():\n    return a\n",
    # TYPE_CHECKING imports are not edges, their else branches are
    "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .d import x\n",
    "d.py": "import typing\nif typing.TYPE_CHECKING:\n    pass\nelse:\n    from .e import y\nx = 1\n",
    "e.py": "from cyclefx.d import x\ny = 2\n",
    # a name read from the parent package's __init__, which imports this module
    "p/__init__.py": "from .q import value\nlimit = 3\n",
    "p/q.py": "from cyclefx.p import limit\nvalue = limit\n",
    # a method-level import and one inside try/except
    "f.py": "class K:\n    def m(self):\n        import cyclefx.g\n",
    "g.py": "try:\n    import cyclefx.f\nexcept ImportError:\n    pass\n",
    # relative imports resolve to the submodule, else to the package defining the name
    "w/__init__.py": "name = 0\n",
    "w/v.py": "",
    "x/__init__.py": "",
    "x/y.py": "from ..w import v\nfrom ..w import name\n",
}


@pytest.fixture
def fixture_graph(tmp_path, monkeypatch) -> grimp.ImportGraph:
    for relative, text in FIXTURE.items():
        path = tmp_path / "cyclefx" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    return build_graph("cyclefx")


def test_checker_reports_cycles_and_ignores_what_does_not_execute(fixture_graph):
    cycles = strongly_connected(fixture_graph)
    assert cycles == [
        ["cyclefx.a", "cyclefx.b"],
        ["cyclefx.d", "cyclefx.e"],
        ["cyclefx.f", "cyclefx.g"],
        ["cyclefx.p", "cyclefx.p.q"],
    ]
    text = describe(fixture_graph, cycles[0])
    assert "cyclefx.a:2:" in text and "(-> cyclefx.b)" in text
    assert "cyclefx.b:1:" in text and "(-> cyclefx.a)" in text
    assert fixture_graph.find_modules_directly_imported_by("cyclefx.x.y") == {
        "cyclefx.w.v",
        "cyclefx.w",
    }

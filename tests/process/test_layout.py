"""The layout's rules, checked on the source (issue 16): the folders draw the architecture.

* no import cycle between two modules of ``nvpair`` (imports under ``TYPE_CHECKING`` and
  inside functions count: a callee that names its caller's class knows its caller);
* no cycle between the subpackages (``http``, ``facade``, ``routing``, ...): they form layers;
* the routing policy touches no reactor and no transport;
* the proxy's runtime code never imports the shipped testing kit;
* no module over 400 lines and no folder over 15 modules, in the package and in the tests.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from twisted.trial.unittest import TestCase

import nvpair

ROOT = Path(nvpair.__file__).parent
TESTS = Path(__file__).parents[1]
MAX_LINES = 400
MAX_MODULES = 15
# What a routing module may import from twisted.internet: Deferreds, and the interfaces it
# types a clock with.  Reactors, protocols, endpoints and transports stay out.
ROUTING_MAY_IMPORT = {"twisted.internet.defer", "twisted.internet.interfaces"}


def moduleName(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources() -> dict[str, Path]:
    return {moduleName(p): p for p in sorted(ROOT.rglob("*.py"))}


def importsOf(name: str, path: Path, known: set[str]) -> Iterator[str]:
    """Every module ``name`` imports (anywhere in its file), as full dotted names; names
    inside ``nvpair`` are resolved to the module (``from pkg import module`` names the
    module, ``from module import thing`` the module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                yield candidate if candidate in known else base


def graph() -> dict[str, set[str]]:
    found = sources()
    known = set(found)
    edges: dict[str, set[str]] = {}
    for name, path in found.items():
        edges[name] = {m for m in importsOf(name, path, known) if m in known and m != name}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    onStack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        onStack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in onStack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                onStack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def unit(module: str) -> str:
    """The layer a module belongs to: its subpackage (``nvpair.proxy.http``), or the module
    itself at the top of a package (``nvpair.proxy.service``)."""
    parts = module.split(".")
    if len(parts) >= 3 and (ROOT.parent / Path(*parts[:3])).is_dir():
        return ".".join(parts[:3])
    return module


class LayoutTests(TestCase):
    def test_cyclesFound(self) -> None:
        """The cycle finder finds a cycle, so the checks below can fail."""
        self.assertEqual(
            cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}), [["a", "b", "c"]]
        )
        self.assertEqual(cycles({"a": {"b"}, "b": set()}), [])

    def test_importsResolved(self) -> None:
        """The import reader sees TYPE_CHECKING and function-level imports of modules."""
        edges = graph()
        self.assertIn("nvpair.proxy.service", edges["nvpair.proxy.tap"])
        self.assertTrue(any(m.startswith("nvpair.proxy.") for m in edges["nvpair.proxy.service"]))

    def test_noModuleCycles(self) -> None:
        self.assertEqual(cycles(graph()), [])

    def test_noPackageCycles(self) -> None:
        layers: dict[str, set[str]] = {}
        for module, targets in graph().items():
            layers.setdefault(unit(module), set()).update(
                unit(t) for t in targets if unit(t) != unit(module)
            )
        self.assertEqual(cycles(layers), [])

    def test_routingIsPolicy(self) -> None:
        found = sources()
        known = set(found)
        offending = {
            (name, m)
            for name, path in found.items()
            if name.startswith("nvpair.proxy.routing")
            for m in importsOf(name, path, known)
            if (m.startswith("twisted.internet") and m not in ROUTING_MAY_IMPORT)
            or m.startswith(("nvpair.proxy.dispatch", "nvpair.proxy.http", "nvpair.proxy.facade"))
        }
        self.assertEqual(offending, set())

    def test_kitNotImportedByRuntime(self) -> None:
        edges = graph()
        offending = {
            (m, t)
            for m, targets in edges.items()
            if not m.startswith("nvpair.proxy.testing")
            for t in targets
            if t.startswith("nvpair.proxy.testing")
        }
        self.assertEqual(offending, set())

    def test_moduleSize(self) -> None:
        """The package's modules and the tests' modules alike."""
        long = {
            str(path.relative_to(ROOT.parent)): n
            for top in (ROOT, TESTS)
            for path in sorted(top.rglob("*.py"))
            if (n := len(path.read_text().splitlines())) > MAX_LINES
        }
        self.assertEqual(long, {})

    def test_folderSize(self) -> None:
        """The package's folders and the tests' folders alike."""
        folders = [
            folder
            for top in (ROOT, TESTS)
            for folder in [top, *(p for p in top.rglob("*") if p.is_dir())]
        ]
        crowded = {
            str(folder.relative_to(ROOT.parent)): n
            for folder in folders
            if (n := len([p for p in folder.glob("*.py") if p.name != "__init__.py"])) > MAX_MODULES
        }
        self.assertEqual(crowded, {})

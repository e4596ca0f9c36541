"""The layout's rules, checked on the source (issue 16): the folders draw the architecture.

* no import cycle between two modules of ``nvpair`` (imports under ``TYPE_CHECKING`` and
  inside functions count: a callee that names its caller's class knows its caller);
* no cycle between the subpackages (``http``, ``facade``, ``routing``, ...): they form layers;
* the routing policy (and standalone's flow control) touches no reactor and no transport;
* what routing, the broker's library (``nvpair.supervisor``), the engine table, the JSON-RPC
  wire format and the interfaces load, transitively, holds no HTTP parser (``httptools``),
  no reactor and no ``runtime`` (issue 26), checked on the source and in a fresh interpreter;
* the proxy's runtime code never imports the shipped testing kit;
* no module over 400 lines and no folder over 15 modules, in the package and in the tests.
* no module of the tests imports a test module (``tests.….test_*``): what tests share lives
  in ``tests/support/`` or a folder's kit.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from twisted.trial.unittest import TestCase

import nvpair

ROOT = Path(nvpair.__file__).parent
TESTS = Path(__file__).parents[1]
MAX_LINES = 400
MAX_MODULES = 15
# The pure policy: what a request is and where it goes, what is known of each node, and
# standalone's flow control.
POLICY = (
    "nvpair.proxy.routing",
    "nvpair.proxy.nodestate",
    "nvpair.proxy.placement",
    "nvpair.proxy.flow",
)
# What a routing module may import from twisted.internet: Deferreds, and the interfaces it
# types a clock with.  Reactors, protocols, endpoints and transports stay out.
ROUTING_MAY_IMPORT = {"twisted.internet.defer", "twisted.internet.interfaces"}
# Modules whose import closure must stay free of ``CONCRETE``: pure policy, the broker's
# library, and the leaves everything depends on (prefixes: every module under them).
LEAN = (
    "nvpair.proxy.routing",
    "nvpair.proxy.nodestate",
    "nvpair.proxy.placement",
    "nvpair.proxy.flow",
    "nvpair.supervisor",
    "nvpair.proxy.engines",
    "nvpair.proxy.errorshape",
    "nvpair.proxy.broker.jsonrpc",
    "nvpair.proxy.interfaces",
    "nvpair.proxy.http.interfaces",
    "nvpair.proxy.dispatch.interfaces",
    "nvpair.proxy.ops.interfaces",
    "nvpair.proxy.cluster.interfaces",
)
# What those closures never hold: the HTTP parser, a reactor, the process runtime.
CONCRETE = (
    "httptools",
    "twisted.internet.reactor",
    "twisted.internet.posixbase",
    "twisted.internet.selectreactor",
    "twisted.internet.pollreactor",
    "twisted.internet.epollreactor",
    "twisted.internet.asyncioreactor",
    "twisted.internet.default",
    "nvpair.proxy.runtime",
)


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
    yield from _importsIn(name, path, ast.parse(path.read_text(), str(path)), known)


def _importsIn(name: str, path: Path, tree: ast.AST, known: set[str]) -> Iterator[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
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


def isTestModule(module: str) -> bool:
    """Whether ``module`` is a test module of the tests (``tests.<folder>.test_<name>``)."""
    parts = module.split(".")
    return parts[0] == "tests" and parts[-1].startswith("test_")


def testModulesImported(module: str, source: str, isPackage: bool = False) -> set[str]:
    """The test modules that ``module`` (of the tests, with text ``source``) imports
    anywhere: ``import tests.a.test_b``, ``from tests.a.test_b import x``, ``from tests.a
    import test_b`` and their relative forms."""
    package = module if isPackage else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        found.update(name for name in names if isTestModule(name))
    return found


def isConcrete(module: str) -> bool:
    return any(module == c or module.startswith(c + ".") for c in CONCRETE)


def leanModules() -> list[str]:
    return sorted(m for m in sources() if any(m == p or m.startswith(p + ".") for p in LEAN))


def runtimeImports(name: str, path: Path, known: set[str]) -> Iterator[str]:
    """What loading ``name`` imports: ``importsOf`` without the ``if TYPE_CHECKING:``
    blocks (never run); function-level imports count (they run when called)."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _typeChecking(node.test):
            node.body = []
    yield from _importsIn(name, path, tree, known)


def _typeChecking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def closure(roots: Iterable[str]) -> dict[str, str]:
    """Every module loading ``roots`` imports, transitively through ``nvpair``'s modules
    (and each package ``__init__`` on the way), mapped to one module that imports it."""
    found = sources()
    known = set(found)
    edges: dict[str, set[str]] = {}
    seen: dict[str, str] = {}
    todo = [(r, r) for r in roots]
    while todo:
        module, by = todo.pop()
        if module in seen:
            continue
        seen[module] = by
        if module not in found:
            continue
        if module not in edges:
            edges[module] = set(runtimeImports(module, found[module], known))
            parts = module.split(".")
            edges[module].update(".".join(parts[:i]) for i in range(1, len(parts)))
        todo.extend((m, module) for m in edges[module])
    return seen


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


_PROBE = """
import importlib, sys
importlib.import_module(sys.argv[1])
print(" ".join(sorted(sys.modules)))
"""


def loadedConcrete(modules: list[str]) -> set[str]:
    """The ``CONCRETE`` modules in ``sys.modules`` of fresh interpreters that each import
    one of ``modules`` (run side by side, each bounded by a deadline)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _PROBE, m], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for m in modules
    ]
    found: set[str] = set()
    for module, proc in zip(modules, procs, strict=True):
        out, err = proc.communicate(timeout=120)
        if proc.returncode != 0:
            raise AssertionError(f"importing {module} failed: {err.decode()[-400:]}")
        found.update(m for m in out.decode().split() if isConcrete(m))
    return found


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
            if name.startswith(POLICY)
            for m in importsOf(name, path, known)
            if (m.startswith("twisted.internet") and m not in ROUTING_MAY_IMPORT)
            or m.startswith(("nvpair.proxy.dispatch", "nvpair.proxy.http", "nvpair.proxy.facade"))
        }
        self.assertEqual(offending, set())

    def test_closureFindsConcrete(self) -> None:
        """The closure reader follows imports through modules and skips TYPE_CHECKING
        blocks, so the checks below can fail: the request rules load llhttp, the service
        loads the runtime, and the routing interfaces' typing-only imports do not count."""
        self.assertIn("httptools", closure(["nvpair.proxy.http.reader"]))
        self.assertIn("nvpair.proxy.runtime.logs", closure(["nvpair.proxy.service"]))
        self.assertNotIn("nvpair.proxy.engines", closure(["nvpair.proxy.placement.interfaces"]))
        self.assertIn("httptools", loadedConcrete(["nvpair.proxy.http.rules"]))

    def test_leanClosures(self) -> None:
        """Routing, the supervisor library, the engine table, the JSON-RPC format and the
        interfaces load no HTTP parser, no reactor and no runtime, transitively."""
        modules = leanModules()
        self.assertIn("nvpair.proxy.placement.policies", modules)
        self.assertIn("nvpair.supervisor.process", modules)
        offending = {
            (root, m, by) for root in modules for m, by in closure([root]).items() if isConcrete(m)
        }
        self.assertEqual(offending, set())

    def test_leanClosuresLoaded(self) -> None:
        """The same, seen from a fresh interpreter: importing each module alone leaves none
        of them in ``sys.modules``."""
        self.assertEqual(loadedConcrete(leanModules()), set())

    def test_runtimeLoadsNoSeam(self) -> None:
        """The process runtime (its logs) loads no seam module: the log switch it provides
        is declared in a leaf (``logswitch``)."""
        loaded = closure(["nvpair.proxy.runtime.logs"])
        self.assertIn("nvpair.proxy.logswitch", loaded)
        seams = {m for m in loaded if m.endswith("interfaces") and m.startswith("nvpair.")}
        self.assertEqual(seams, set())

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

    def test_testImportsFound(self) -> None:
        """The reader finds a test module imported in every form, at the top or inside a
        function, and nothing else, so the check below can fail."""
        source = (
            "import tests.a.test_b\n"
            "from tests.a.test_c import Fake\n"
            "from tests.a import test_d, kit\n"
            "from .test_e import Case\n"
            "from . import test_f\n"
            "from tests.support.harness import freePort\n"
            "def f() -> None:\n"
            "    from ..b.test_g import helper\n"
        )
        self.assertEqual(
            testModulesImported("tests.a.test_z", source),
            {f"tests.{m}" for m in ("a.test_b", "a.test_c", "a.test_d", "a.test_e", "a.test_f")}
            | {"tests.b.test_g"},
        )
        self.assertEqual(testModulesImported("tests.a.test_z", "import tests.a.kit\n"), set())

    def test_noTestModuleImports(self) -> None:
        """No module of the tests imports a test module: shared fakes, cases and helpers
        live in ``tests/support/`` (or a folder's kit), so a test module is only run."""
        offending = {
            (name, imported)
            for path in sorted(TESTS.rglob("*.py"))
            for name in [moduleName(path)]
            for imported in testModulesImported(name, path.read_text(), path.name == "__init__.py")
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

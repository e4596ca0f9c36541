"""The benchmarks stay importable: every ``bench`` module imports against the code as it is
now (a renamed or moved name breaks a benchmark silently otherwise, since no unit test
runs them)."""

from __future__ import annotations

import importlib
import pkgutil

from twisted.trial.unittest import SynchronousTestCase

import bench

# Third-party packages only some benchmarks use, installed where those run (not by CI).
OPTIONAL = {"llama_cpp", "matplotlib"}


class BenchImportTests(SynchronousTestCase):
    """Each benchmark module imports (its ``__main__`` modules are not run)."""

    def test_everyModuleImports(self) -> None:
        """Every module under ``bench`` imports, or lacks only an optional package."""
        names = [
            info.name
            for info in pkgutil.walk_packages(bench.__path__, "bench.")
            if not info.name.endswith("__main__")
        ]
        self.assertIn("bench.routing.direct", names)
        for name in names:
            try:
                importlib.import_module(name)
            except ModuleNotFoundError as e:
                self.assertIn(e.name, OPTIONAL, name)

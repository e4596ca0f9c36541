"""The floor run of ``.ci/run`` installs exactly the floors ``pyproject.toml`` declares."""

from __future__ import annotations

import os
import re
import tomllib

from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.http.refusal import Refusal
from nvpair.proxy.http.rules import originForm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def normalName(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def release(version: str) -> tuple[int, ...]:
    """A release number without trailing zero parts (``24.10.0`` and ``24.10`` are equal)."""
    parts = [int(p) for p in version.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


class FloorTests(SynchronousTestCase):
    """``.ci/floor-constraints.txt`` pins every runtime dependency at its declared floor."""

    def floors(self) -> dict[str, tuple[int, ...]]:
        """Each runtime dependency of ``pyproject.toml`` and its ``>=`` floor."""
        with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
            dependencies = tomllib.load(f)["project"]["dependencies"]
        out: dict[str, tuple[int, ...]] = {}
        for spec in dependencies:
            match = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)", spec)
            self.assertIsNotNone(match, f"{spec!r} is not 'name>=floor'")
            assert match is not None
            out[normalName(match[1])] = release(match[2])
        return out

    def pins(self) -> dict[str, tuple[int, ...]]:
        """Each ``name==version`` line of the constraints file."""
        out: dict[str, tuple[int, ...]] = {}
        with open(os.path.join(ROOT, ".ci", "floor-constraints.txt")) as f:
            for line in f:
                line = line.split("#", 1)[0].strip()
                if line:
                    name, sep, version = line.partition("==")
                    self.assertEqual(sep, "==", line)
                    out[normalName(name)] = release(version)
        return out

    def test_constraintsPinTheFloors(self) -> None:
        """Same dependencies, and each pinned at exactly its declared floor."""
        self.assertEqual(self.pins(), self.floors())

    def test_testToolsAreNotRuntime(self) -> None:
        """``treq`` is a test dependency only: not a runtime one, and the package never
        imports it (an installation without the test extra has no ``treq``)."""
        self.assertNotIn("treq", self.floors())
        importing = []
        for folder, _, files in os.walk(os.path.join(ROOT, "nvpair")):
            for name in files:
                if name.endswith(".py"):
                    with open(os.path.join(folder, name)) as f:
                        if re.search(r"^\s*(import|from)\s+treq\b", f.read(), re.MULTILINE):
                            importing.append(name)
        self.assertEqual(importing, [])


class HttptoolsFloorTests(SynchronousTestCase):
    """What the httptools floor (0.8) is for: before it, ``parse_url`` cut a target longer
    than 65,535 bytes short and the proxy would forward a different path."""

    def test_longAbsoluteTargetExactOrRefused(self) -> None:
        """An absolute-form target of 60,000 and of 70,000 bytes is either forwarded exactly
        (origin form) or refused with 400, never shortened."""
        for size in (60_000, 70_000):
            path = b"/" + b"a" * size
            try:
                target, authority = originForm(b"http://engine.local" + path + b"?q=1")
            except Refusal as refusal:
                self.assertEqual(refusal.status, 400, size)
            else:
                self.assertEqual((target, authority), (path + b"?q=1", b"engine.local"), size)

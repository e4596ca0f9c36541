"""Port rules and the persisted per-engine port (spec §8, protocol §4 and §7)."""

from __future__ import annotations

import json
import os
import tempfile

from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.engines import ENGINES, LLAMACPP, LMSTUDIO, OLLAMA
from nvpair.proxy.facade.ports import PortError, PortStore, requestedPort


class RequestedPortTests(SynchronousTestCase):
    """0 is the standalone default, 1..65535 as given, anything else rejected."""

    def test_zeroIsStandaloneDefault(self) -> None:
        """Port 0 resolves to each engine's standalone port (§8 table)."""
        self.assertEqual(requestedPort(OLLAMA, 0), 11435)
        self.assertEqual(requestedPort(LMSTUDIO, 0), 1234)
        self.assertEqual(requestedPort(LLAMACPP, 0), 8080)

    def test_inRange(self) -> None:
        """1 and 65535 and anything between are used as given."""
        for port in (1, 80, 65535):
            self.assertEqual(requestedPort(OLLAMA, port), port)

    def test_rejected(self) -> None:
        """Negative, too large, non-integers (incl. booleans, floats, strings) are rejected."""
        for value in (-1, 65536, 10**9, 1.0, 8080.5, "8080", None, True, False, [1]):
            self.assertRaises(PortError, requestedPort, OLLAMA, value)


class PortStoreTests(SynchronousTestCase):
    """Reading and atomically writing ``<state-dir>/<port file>``."""

    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="nvpair-ports-")
        self.store = PortStore(self.dir)

    def write(self, name: str, data: bytes) -> None:
        with open(os.path.join(self.dir, name), "wb") as f:
            f.write(data)

    def test_fileNames(self) -> None:
        """Each engine has its own file name (§8 table)."""
        self.assertEqual(os.path.basename(self.store.path(OLLAMA)), "proxy-port.json")
        self.assertEqual(os.path.basename(self.store.path(LMSTUDIO)), "lmstudio-proxy-port.json")
        self.assertEqual(os.path.basename(self.store.path(LLAMACPP)), "llamacpp-proxy-port.json")

    def test_missing(self) -> None:
        """No file means no persisted port."""
        for engine in ENGINES.values():
            self.assertIsNone(self.store.load(engine))

    def test_roundTrip(self) -> None:
        """A saved port is loaded back, per engine, as ``{"port": N}``."""
        self.store.save(OLLAMA, 4242)
        self.store.save(LLAMACPP, 4343)
        self.assertEqual(self.store.load(OLLAMA), 4242)
        self.assertEqual(self.store.load(LLAMACPP), 4343)
        self.assertIsNone(self.store.load(LMSTUDIO))
        with open(self.store.path(OLLAMA)) as f:
            self.assertEqual(json.load(f), {"port": 4242})

    def test_createsStateDir(self) -> None:
        """Saving creates a missing state directory."""
        store = PortStore(os.path.join(self.dir, "a", "b"))
        store.save(OLLAMA, 5)
        self.assertEqual(store.load(OLLAMA), 5)

    def test_noTempLeftBehind(self) -> None:
        """After saves only the port files remain (temp files were renamed)."""
        for port in (1, 2, 3):
            self.store.save(LMSTUDIO, port)
        self.assertEqual(os.listdir(self.dir), ["lmstudio-proxy-port.json"])

    def test_failedWriteKeepsOldFile(self) -> None:
        """A save that fails before the rename leaves the old file intact and no temp file."""
        self.store.save(OLLAMA, 1111)

        def broken(*args: object, **kwargs: object) -> None:
            raise OSError(28, "No space left on device")

        self.patch(os, "fsync", broken)
        self.assertRaises(OSError, self.store.save, OLLAMA, 2222)
        self.assertEqual(self.store.load(OLLAMA), 1111)
        self.assertEqual(os.listdir(self.dir), ["proxy-port.json"])

    def test_writtenByRename(self) -> None:
        """The file is replaced by a rename of a temp file in the same directory."""
        calls: list[tuple[str, str]] = []
        real = os.replace

        def spy(src: str, dst: str) -> None:
            calls.append((src, dst))
            real(src, dst)

        self.patch(os, "replace", spy)
        self.store.save(OLLAMA, 7)
        self.assertEqual(len(calls), 1)
        self.assertEqual(os.path.dirname(calls[0][0]), self.dir)
        self.assertEqual(calls[0][1], self.store.path(OLLAMA))

    def test_corrupt(self) -> None:
        """An unreadable or invalid file raises ValueError naming the file."""
        cases = [
            b"{bad",
            b"[]",
            b'{"port": "80"}',
            b'{"port": 0}',
            b'{"port": 70000}',
            b'{"port": true}',
            b'{"prt": 80}',
            b"",
            b"\xff\xfe",
        ]
        for data in cases:
            self.write("proxy-port.json", data)
            with self.assertRaises(ValueError, msg=repr(data)) as cm:
                self.store.load(OLLAMA)
            self.assertIn("proxy-port.json", str(cm.exception))

    def test_unreadable(self) -> None:
        """A port file that cannot be read (a directory here) raises ValueError."""
        os.mkdir(os.path.join(self.dir, "proxy-port.json"))
        self.assertRaises(ValueError, self.store.load, OLLAMA)

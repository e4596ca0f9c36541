"""The log format of the real process: text when its stderr is a terminal (a pty), JSON when
it is a pipe; the same records either way."""

from __future__ import annotations

import json
import os
import pty
import sys
import tempfile
from typing import Any

from twisted.internet import defer, reactor
from twisted.internet.error import ProcessExitedAlready
from twisted.internet.interfaces import IReadDescriptor
from twisted.internet.protocol import ProcessProtocol
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase
from zope.interface import implementer

from nvpair.proxy.engines import ENGINES
from tests.support.cases.requestcase import asyncTest
from tests.support.harness import freePort, rawExchange, reservedPort
from tests.support.kitprocess import killAtCleanup
from tests.support.standaloneharness import StandaloneProxy, facadeEnabled


class _Ended(ProcessProtocol):
    """Fires ``ended`` with the exit code."""

    def __init__(self) -> None:
        self.ended: defer.Deferred[Any] = defer.Deferred()

    def processEnded(self, reason: Failure) -> None:
        self.ended.callback(getattr(reason.value, "exitCode", None))


@implementer(IReadDescriptor)
class _Terminal:
    """The master side of the child's pty: collects lines; ``waitFor`` a line with a text."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = b""
        self.lines: list[str] = []
        self.waiters: list[tuple[str, defer.Deferred[str]]] = []

    def fileno(self) -> int:
        return self.fd

    def logPrefix(self) -> str:
        return "pty"

    def doRead(self) -> None:
        try:
            data = os.read(self.fd, 65536)
        except OSError:
            data = b""  # EIO: the child side closed
        if not data:
            reactor.removeReader(self)
            return
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        for raw in lines:
            line = raw.rstrip(b"\r").decode("utf-8", "replace")
            self.lines.append(line)
            for waiter in list(self.waiters):
                if waiter[0] in line:
                    self.waiters.remove(waiter)
                    waiter[1].callback(line)

    def connectionLost(self, reason: Failure) -> None:
        pass

    def waitFor(self, text: str) -> defer.Deferred[str]:
        for line in self.lines:
            if text in line:
                return defer.succeed(line)
        d: defer.Deferred[str] = defer.Deferred()
        self.waiters.append((text, d))
        return d.addTimeout(30, reactor)


class TerminalTests(TestCase):
    """Standalone with stderr on a terminal or on a pipe."""

    timeout = 60

    @defer.inlineCallbacks
    def test_terminalGetsText(self):  # type: ignore[no-untyped-def]
        """On a pty, every line is a text line (none parses as JSON), facade-enabled among
        them with its engine and port."""
        master, slave = pty.openpty()
        self.addCleanup(os.close, master)
        stateDir = tempfile.mkdtemp(prefix="nvpair-pty-")
        port = freePort()
        with open(os.path.join(stateDir, ENGINES["llamacpp"].portFile), "w") as f:
            json.dump({"port": port}, f)
        twistd = os.path.join(os.path.dirname(sys.executable), "twistd")
        argv = [twistd, "--reactor=nvpair", "-n", "--pidfile=", "nvpair-proxy", "--standalone"]
        argv += ["--state-dir"]
        argv += [stateDir, "--ops-port", "0", "--engines", "llamacpp"]
        environ = {k: v for k, v in os.environ.items() if not k.startswith("NVPAIR_")}
        proto = _Ended()
        terminal = _Terminal(master)
        try:
            process = reactor.spawnProcess(
                proto,
                argv[0],
                argv,
                env=environ,
                path=stateDir,
                childFDs={0: "w", 1: "r", 2: slave},
            )
        finally:
            os.close(slave)
        reactor.addReader(terminal)
        self.addCleanup(lambda: reactor.removeReader(terminal))

        killAtCleanup(self, process, proto.ended)
        line = yield terminal.waitFor("facade-enabled")
        self.assertRegex(line, rf"^\S+Z INFO  facade-enabled engine=llamacpp port={port} ")
        try:
            process.signalProcess("TERM")
        except ProcessExitedAlready:
            pass
        yield proto.ended.addTimeout(30, reactor)
        self.assertGreater(len(terminal.lines), 1)
        for text in terminal.lines:
            if text.strip():
                self.assertFalse(text.startswith("{"), text)

    @defer.inlineCallbacks
    def test_pipeGetsJSON(self):  # type: ignore[no-untyped-def]
        """On a pipe (no ``--log-format``), every line is a JSON record."""
        proxy = StandaloneProxy(self, reactor, ("llamacpp",))
        proxy.environ.pop("NVPAIR_LOG_FORMAT", None)
        yield defer.Deferred.fromCoroutine(proxy.start())
        record = yield proxy.waitForLog(facadeEnabled("llamacpp"))
        self.assertEqual(record["port"], proxy.ports["llamacpp"])
        self.assertEqual(proxy.events("unparsed"), [])


# An 8-bit CSI (clear screen, red), an 8-bit OSC setting the terminal title, ended by ST.
HOSTILE_HOST = b"evil\x9b2J\x9b31m\x9d0;pwned\x9c.example"


class ControlCharacterTests(TestCase):
    """A ``Host`` carrying 8-bit CSI/OSC bytes reaches the log only escaped (issue 32)."""

    timeout = 60

    async def denied(self, form: str) -> tuple[StandaloneProxy, int]:
        """A standalone proxy writing ``form`` lines, after its ops listener refused the
        hostile ``Host`` (the facades' HTTP layer answers 400 to such a value before the
        rule; the ops listener has no such layer) and it stopped (every line read)."""
        opsPort = reservedPort(self)
        proxy = StandaloneProxy(
            self, reactor, ("llamacpp",), extra=("--log-format", form, "--ops-port", str(opsPort))
        )
        await proxy.start()
        await proxy.waitForLog(
            lambda r: r.get("event") == "ops-listening" or " ops-listening " in r.get("text", "")
        )
        raw = await rawExchange(
            opsPort,
            b"GET /status HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n\r\n"
            % (HOSTILE_HOST, opsPort),
            timeout=20,
        )
        self.assertTrue(raw.startswith(b"HTTP/1.1 403 "), raw[:100])
        self.assertEqual(await proxy.stop(), 0)
        return proxy, opsPort

    def assertNoRawControls(self, proxy: StandaloneProxy) -> None:
        for line in proxy.rawLines:
            text = line.decode("utf-8")
            self.assertFalse([c for c in text if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0], text)
            self.assertNotIn(b"\x9b", line)  # not even as a lone byte

    @asyncTest
    async def test_json(self) -> None:
        """JSON lines: ``host-denied`` names the host with its C1 characters as ``\\u``
        escapes (it parses back to the raw value); no line holds a raw control character."""
        proxy, opsPort = await self.denied("json")
        [record] = proxy.events("host-denied")
        self.assertEqual(record["host"], f"{HOSTILE_HOST.decode('latin-1')}:{opsPort}")
        [line] = [raw for raw in proxy.rawLines if b"host-denied" in raw]
        self.assertIn(b"evil\\u009b2J\\u009b31m\\u009d0;pwned\\u009c.example", line)
        self.assertNoRawControls(proxy)

    @asyncTest
    async def test_text(self) -> None:
        """Text lines: the same record with the host quoted and escaped; no line holds a
        raw control character."""
        proxy, _ = await self.denied("text")
        [line] = [raw for raw in proxy.rawLines if b"host-denied" in raw]
        self.assertIn(b'WARN  host-denied listener=ops host="evil\\u009b2J\\u009b31m', line)
        self.assertNoRawControls(proxy)

"""Unit tests of immediate writes and the response head held for its body (``fastwrite``, site).

``PinnedInternalsTests`` run ``sendNow`` on Twisted's own ``tcp.Server`` (over a fake socket
and a memory reactor) and pin what it relies on: a transport with nothing queued takes a
direct send, anything queued makes later bytes queue behind it, and a flushed transport is
idle again.  A Twisted release that changes the buffer internals fails these tests (and,
in production, falls back to the public ``write``).
"""

from __future__ import annotations

import socket
from typing import cast

from twisted.internet import tcp
from twisted.internet.protocol import Protocol
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactor, StringTransport
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer
from zope.interface.verify import verifyObject

from nvpair.proxy.http import fastwrite
from nvpair.proxy.http.fastwrite import sendNow
from nvpair.proxy.http.interfaces import IDoor, IServerRequest
from nvpair.proxy.http.site import FacadeSite


class RecordingTransport(StringTransport):
    """A transport that records each write separately."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)
        super().write(data)


@implementer(IDoor)
class Door:
    """A front door answering every request with ``body`` (HEAD: no body)."""

    def __init__(self, body: bytes, pushHeaders: bool = False) -> None:
        self.body = body
        self.pushHeaders = pushHeaders
        self.requests: list[IServerRequest] = []

    def handle(self, request: IServerRequest) -> None:
        self.requests.append(request)
        request.setResponseCode(200)
        request.setHeader(b"content-length", b"%d" % len(self.body))
        if self.pushHeaders:
            request.write(b"")
            return
        request.write(self.body)
        request.finish()

    def crashed(self, request: IServerRequest, error: Exception) -> None:
        raise AssertionError(f"the door crashed: {error!r}")


def serve(door: Door, raw: bytes) -> RecordingTransport:
    """Feed ``raw`` to a facade channel answering with ``door``."""
    site = FacadeSite(door, Clock(), 1 << 20, 30.0, 65536)
    channel = site.buildProtocol(None)
    transport = RecordingTransport()
    channel.makeConnection(transport)
    channel.dataReceived(raw)
    return transport


class SendNowTests(SynchronousTestCase):
    """``sendNow`` on anything but a plain TCP transport is an ordinary write."""

    def test_doorIsADoor(self) -> None:
        """The door fake of this module provides ``IDoor``."""
        verifyObject(IDoor, Door(b""))

    def test_otherTransportsWrite(self) -> None:
        """A non-TCP transport gets the bytes through ``write``."""
        transport = RecordingTransport()
        sendNow(transport, b"abc")
        self.assertEqual(transport.writes, [b"abc"])


class HeldHeadTests(SynchronousTestCase):
    """The response head leaves together with the first body bytes, or alone when none follow."""

    def test_headAndBodyInOneWrite(self) -> None:
        """Status line, headers and body go out as one write."""
        transport = serve(Door(b"hello"), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertEqual(len(transport.writes), 1)
        self.assertTrue(transport.writes[0].startswith(b"HTTP/1.1 200 OK\r\n"))
        self.assertTrue(transport.writes[0].endswith(b"\r\n\r\nhello"))

    def test_headWithoutBodyFlushed(self) -> None:
        """A HEAD answer's head is sent although no body follows it."""
        transport = serve(Door(b"hello"), b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertTrue(transport.value().startswith(b"HTTP/1.1 200 OK\r\n"))
        self.assertTrue(transport.value().endswith(b"\r\n\r\n"))

    def test_emptyWritePushesHeaders(self) -> None:
        """An empty write sends the head at once (the peer personality relies on it)."""
        transport = serve(Door(b"hello", pushHeaders=True), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertTrue(transport.value().startswith(b"HTTP/1.1 200 OK\r\n"))
        self.assertTrue(transport.value().endswith(b"\r\n\r\n"))


class UnknownInternalsTests(SynchronousTestCase):
    """A TCP transport without the buffer attributes ``sendNow`` reads gets a plain write."""

    def test_missingAttributesFallBack(self) -> None:
        """Missing Twisted internals never break a write: the data is queued as usual."""
        written: list[bytes] = []

        class Odd(tcp.Server):
            def __init__(self) -> None:
                pass

            TLS = False
            connected = True
            disconnecting = False

            def write(self, data: bytes) -> None:
                written.append(data)

        transport = Odd()
        self.patch(fastwrite, "_PLAIN", (*fastwrite._PLAIN, Odd))
        fastwrite.sendNow(transport, b"abc")
        self.assertEqual(written, [b"abc"])


class FakeSocket:
    """A non-blocking socket stand-in that takes up to ``window`` bytes per send."""

    def __init__(self) -> None:
        self.window = 1 << 20
        self.sent = b""

    def setblocking(self, flag: bool) -> None:
        pass

    def fileno(self) -> int:
        return 99

    def send(self, data: bytes) -> int:
        if not self.window:
            raise BlockingIOError()
        taken = bytes(data[: self.window])
        self.sent += taken
        return len(taken)

    def shutdown(self, how: int) -> None:
        pass

    def close(self) -> None:
        pass


class PinnedInternalsTests(SynchronousTestCase):
    """``sendNow`` on a real ``tcp.Server``: direct when idle, in order otherwise."""

    def setUp(self) -> None:
        self.reactor = MemoryReactor()
        self.socket = FakeSocket()
        # ``tcp.Server`` only calls the socket methods ``FakeSocket`` has; its port is not
        # used by anything these tests do.
        self.transport = tcp.Server(
            cast(socket.socket, self.socket),
            Protocol(),
            ("127.0.0.1", 5),
            cast(tcp.Port, None),
            1,
            self.reactor,
        )

    def queued(self) -> bool:
        return self.transport in self.reactor.getWriters()

    def test_idleSendsDirectly(self) -> None:
        """With nothing queued the bytes go to the socket at once, nothing is queued."""
        sendNow(self.transport, b"abc")
        self.assertEqual(self.socket.sent, b"abc")
        self.assertFalse(self.queued())

    def test_partialSendKeepsOrder(self) -> None:
        """What the kernel does not take is queued, later bytes queue behind it, and once
        the queue is flushed the transport sends directly again."""
        self.socket.window = 3
        sendNow(self.transport, b"abcdef")
        self.assertEqual(self.socket.sent, b"abc")
        self.assertTrue(self.queued())
        sendNow(self.transport, b"gh")
        self.assertEqual(self.socket.sent, b"abc")
        self.socket.window = 1 << 20
        self.transport.doWrite()
        self.assertEqual(self.socket.sent, b"abcdefgh")
        self.assertFalse(self.queued())
        sendNow(self.transport, b"ij")
        self.assertEqual(self.socket.sent, b"abcdefghij")

    def test_publicWriteQueuedFirst(self) -> None:
        """Bytes queued by a plain ``write`` are never overtaken."""
        self.transport.write(b"first")
        sendNow(self.transport, b"second")
        self.assertEqual(self.socket.sent, b"")
        self.transport.doWrite()
        self.assertEqual(self.socket.sent, b"firstsecond")

    def test_fullSocketQueues(self) -> None:
        """A socket that takes nothing leaves everything queued."""
        self.socket.window = 0
        sendNow(self.transport, b"abc")
        self.assertTrue(self.queued())
        self.socket.window = 10
        self.transport.doWrite()
        self.assertEqual(self.socket.sent, b"abc")

    def test_disconnectingNotDirect(self) -> None:
        """After ``loseConnection`` nothing is sent directly."""
        self.transport.loseConnection()
        sendNow(self.transport, b"late")
        self.assertEqual(self.socket.sent, b"")

    def test_switchOff(self) -> None:
        """With ``DIRECT`` off every write is queued (the benchmark's public side)."""
        self.patch(fastwrite, "DIRECT", False)
        sendNow(self.transport, b"abc")
        self.assertEqual(self.socket.sent, b"")
        self.assertTrue(self.queued())

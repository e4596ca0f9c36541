"""Unit tests of immediate writes and the response head held for its body (``fastwrite``, site)."""

from __future__ import annotations

from typing import Any

from twisted.internet import tcp
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy import fastwrite
from nvpair.proxy.fastwrite import sendNow
from nvpair.proxy.site import FacadeSite


class RecordingTransport(StringTransport):
    """A transport that records each write separately."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)
        super().write(data)


class Door:
    """A front door answering every request with ``body`` (HEAD: no body)."""

    def __init__(self, body: bytes, pushHeaders: bool = False) -> None:
        self.body = body
        self.pushHeaders = pushHeaders
        self.requests: list[Any] = []

    def handle(self, request: Any) -> None:
        self.requests.append(request)
        request.setResponseCode(200)
        request.setHeader(b"content-length", b"%d" % len(self.body))
        if self.pushHeaders:
            request.write(b"")
            return
        request.write(self.body)
        request.finish()


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

        class Odd(tcp.Server):  # type: ignore[misc]
            def __init__(self) -> None:
                pass

            TLS = False
            connected = True
            disconnecting = False

            def write(self, data: bytes) -> None:
                written.append(data)

        transport = Odd()
        original = fastwrite._PLAIN
        fastwrite._PLAIN = (*original, Odd)
        try:
            fastwrite.sendNow(transport, b"abc")
        finally:
            fastwrite._PLAIN = original
        self.assertEqual(written, [b"abc"])

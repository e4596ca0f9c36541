"""The first-byte switch of the real listener (protocol §8): a TLS first byte refused without a
cluster directory, plaintext from this host's non-loopback address closed without an answer.

``test_netns`` checks the same gate with a caller in a network namespace of its own.
"""

from __future__ import annotations

import socket

from twisted.internet import reactor
from twisted.trial.unittest import SkipTest, TestCase

from tests.support.harness import ProxyFixture, rawExchange


def lanAddress() -> str | None:
    """This host's non-loopback IPv4 address, if it has one (no packet is sent)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.1", 9))
        host = str(s.getsockname()[0])
    except OSError:
        return None
    finally:
        s.close()
    return None if host.startswith("127.") or host == "0.0.0.0" else host


class IngressTests(TestCase):
    """The first-byte switch of the real listener (protocol §8)."""

    timeout = 60

    async def test_tlsRefusedWhenNotMember(self) -> None:
        """Without a cluster directory a TLS first byte is closed without an answer."""
        proxy = ProxyFixture(self, reactor)
        await proxy.start()
        port = await proxy.enable("ollama")
        hello = b"\x16\x03\x01\x00\x05\x01\x00\x00\x01\x00"
        self.assertEqual(await rawExchange(port, hello), b"")
        answer = await rawExchange(
            port,
            b"GET /api/tags HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        )
        self.assertTrue(answer.startswith(b"HTTP/1.1 200 "), answer[:40])

    async def test_plaintextFromLanClosed(self) -> None:
        """A plaintext connection from a non-loopback address is closed without an answer."""
        host = lanAddress()
        if host is None:
            raise SkipTest("no non-loopback IPv4 address on this host")
        proxy = ProxyFixture(self, reactor)
        await proxy.start()
        port = await proxy.enable("llamacpp")
        answer = await rawExchange(port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", host)
        self.assertEqual(answer, b"")

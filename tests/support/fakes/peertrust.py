"""A cluster trust for one connection under test: it names the peer, dials none."""

from __future__ import annotations

from twisted.internet.interfaces import IOpenSSLClientConnectionCreator
from zope.interface import implementer

from nvpair.proxy.interfaces import IClusterTrust


@implementer(IClusterTrust)
class FakeTrust:
    """Answers ``peerNodeId`` for the one connection under test; a node that dials no peer."""

    nodeId = "node-b"
    fingerprint = None

    def __init__(self) -> None:
        self.pinned: str | None = "node-a"
        self.current = True
        self.asked: list[object] = []

    def pinFor(self, nodeId: str) -> str | None:
        return None

    def clientCreatorFor(self, nodeId: str) -> IOpenSSLClientConnectionCreator:
        raise AssertionError("the peer door never dials a peer")

    def peerNodeId(self, transport: object) -> str | None:
        self.asked.append(transport)
        return self.pinned

    def presentsCurrentIdentity(self, transport: object) -> bool:
        return self.current

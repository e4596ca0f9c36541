"""The seam between a peer request and the cluster trust that vouches for its connection."""

from __future__ import annotations

from zope.interface import Interface


class IPeerTrust(Interface):
    """What the peer door asks of the cluster trust (``ClusterTrust``) on every request."""

    def peerNodeId(transport: object) -> str | None:
        """The pinned node id behind a TLS connection's peer certificate, or None."""

    def presentsCurrentIdentity(transport: object) -> bool:
        """Whether the connection was made with this node's current certificate."""

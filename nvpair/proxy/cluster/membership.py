"""Cluster trust: membership, this node's TLS identity and peer pins (protocol §6, spec §7).

``ClusterTrust`` is the public face of the cluster personality: the live, last-good view of
the cluster directory (``cluster.directory``; its file formats in ``cluster.files``) together
with the pinned mutual-TLS connections built from it (``cluster.tls``).  Other modules import it
and the errors from here; the peer door sees it as ``interfaces.IPeerTrust``, the connector
to peers as ``interfaces.IClusterTrust``.
"""

from __future__ import annotations

from functools import cached_property

from twisted.internet.interfaces import (
    IOpenSSLClientConnectionCreator,
    IOpenSSLServerConnectionCreator,
)
from twisted.web.iweb import IPolicyForHTTPS
from zope.interface import implementer

from nvpair.proxy.cluster.directory import ClusterDirectory
from nvpair.proxy.cluster.tls import ClusterTLS
from nvpair.proxy.interfaces import IClusterTrust

__all__ = [
    "ClusterTrust",
]


@implementer(IClusterTrust)
class ClusterTrust(ClusterDirectory):
    """The live view of a cluster directory and the mutual-TLS connections built from it.

    The watching, the ``racyWindow`` and the state are ``ClusterDirectory``'s; the
    connections are ``ClusterTLS``'s.  Server side: ``serverContextFactory`` builds each
    connection from the current state.  When this node is not a member, or has no usable
    certificate, the connection it builds carries no certificate and rejects every peer, so
    its handshake fails (it never raises); a caller that already knows the connection is
    TLS may check ``isMember`` and close it early instead.
    """

    @cached_property
    def _tls(self) -> ClusterTLS:
        """The connections built from this directory's state (made on first use)."""
        return ClusterTLS(self)

    def _changed(self) -> None:
        """Record an applied change: bump the generation, drop cached contexts."""
        super()._changed()
        self._tls.dropContexts()

    @property
    def serverContextFactory(self) -> IOpenSSLServerConnectionCreator:
        """The server connection creator for the cluster personality (see the class doc)."""
        return self._tls.serverContextFactory

    def clientCreatorFor(self, nodeId: str) -> IOpenSSLClientConnectionCreator:
        """Return a creator reaching only ``nodeId`` (raises ``ClusterError`` subclasses)."""
        return self._tls.clientCreatorFor(nodeId)

    def policyForNode(self, nodeId: str) -> IPolicyForHTTPS:
        """Return an HTTPS policy reaching ``nodeId`` whatever netloc it is asked for."""
        return self._tls.policyForNode(nodeId)

    def peerNodeId(self, transport: object) -> str | None:
        """Return the pinned node id of a TLS connection's peer, or None (see ``ClusterTLS``)."""
        return self._tls.peerNodeId(transport)

    def presentsCurrentIdentity(self, transport: object) -> bool:
        """Whether a TLS connection was made with this node's current certificate."""
        return self._tls.presentsCurrentIdentity(transport)

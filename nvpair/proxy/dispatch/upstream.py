"""Reaching a node (protocol §4): direct plaintext engines, the local backend, and peers over mTLS.

One persistent connection pool serves every facade: the lean client of ``httpclient`` for
plaintext nodes and, over pinned mutual TLS, for peers (pooled by node id, pin and this
node's own identity).  A node's addresses are tried in order until one connects; the one
that connected is remembered per facade until a transport error makes dispatch forget it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from twisted.internet import defer
from twisted.internet.abstract import isIPAddress, isIPv6Address
from twisted.internet.endpoints import HostnameEndpoint, wrapClientTLS
from twisted.internet.error import ConnectError
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.web.client import URI
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse
from zope.interface import implementer

from nvpair.proxy.http.framing import isToken, serializeRequest
from nvpair.proxy.http.pool import ConnectionPool, DirectTCP
from nvpair.proxy.interfaces import IClusterTrust, IConnectingReactor, IUpstream

if TYPE_CHECKING:
    from nvpair.proxy.routing.nodes import Node

_BODY_METHODS = (b"POST", b"PUT", b"PATCH")
_VALID_METHODS: set[bytes] = set()  # methods found to be tokens (a few)
_VALID_TARGET = re.compile(rb"[\x21-\x7e]+")  # visible ASCII: no space, no control


class _Target:
    """A parsed plaintext node URL."""

    __slots__ = ("key", "host", "prefix", "endpoint")

    def __init__(
        self,
        key: tuple[object, ...],
        host: bytes,
        prefix: bytes,
        endpoint: Callable[[], IStreamClientEndpoint | DirectTCP],
    ) -> None:
        self.key = key
        self.host = host
        self.prefix = prefix
        self.endpoint = endpoint


class NotReachable(ConnectError):
    """A node address that cannot be dialled (e.g. a peer while this node is not a member)."""


def splitHostPort(address: str) -> tuple[str, int]:
    """Parse ``host:port`` or ``[v6]:port``."""
    if address.startswith("["):
        host, sep, port = address[1:].partition("]:")
    else:
        host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError("address must be host:port")
    return host, int(port)


@implementer(IUpstream)
class Upstream:
    """Opens requests to nodes over the shared pool."""

    def __init__(
        self,
        reactor: IConnectingReactor,
        dialTimeout: float,
        trust: IClusterTrust | None = None,
        maxPersistentPerHost: int = 64,
        idleTimeout: int = 90,
    ) -> None:
        self._reactor = reactor
        self._dialTimeout = dialTimeout
        self.trust = trust
        self.pool = ConnectionPool(reactor, maxPersistentPerHost, idleTimeout)
        self._targets: dict[str, _Target] = {}

    def request(
        self,
        node: Node | None,
        address: str | None,
        method: bytes,
        path: bytes,
        headers: Headers,
        body: bytes,
        connected: Callable[[], None] | None = None,
    ) -> defer.Deferred[IResponse]:
        """Send one request to ``address`` of ``node`` (an ``http://`` URL or a peer ``host:port``).

        ``connected`` is called once the connection is established (the dial is over).
        """
        if address is None:
            return defer.fail(NotReachable("no address"))
        try:
            if address.startswith("http://"):
                target = self._targets.get(address)
                if target is None:
                    target = self._target(address)
            else:
                assert node is not None  # a peer address belongs to a node
                target = self._peer(node.id, address)
            if method not in _VALID_METHODS:
                if not isToken(method):
                    raise ValueError("invalid method")
                if len(_VALID_METHODS) < 64:
                    _VALID_METHODS.add(method)
            if _VALID_TARGET.fullmatch(path) is None:
                raise ValueError("invalid request target")
        except Exception:
            return defer.fail()
        sendBody = body if body or method in _BODY_METHODS else None
        data = serializeRequest(method, target.prefix + path, target.host, headers, sendBody)
        return self.pool.request(target.key, target.endpoint, data, method, connected)

    def _peer(self, nodeId: str, address: str) -> _Target:
        """A peer facade at ``host:port`` over mutual TLS pinned to ``nodeId``; pooled under
        what authenticates it (node id, its pin, this node's identity and certificate), so
        a connection made under an old pin, certificate or node id is never reused: a trust
        change takes effect on the next request (old connections idle out).
        ``NotReachable`` when this node is not a member or has no pin for ``nodeId``."""
        trust = self.trust
        try:
            host, port = splitHostPort(address)
            if trust is None:
                raise NotReachable("not a cluster member")
            creator = trust.clientCreatorFor(nodeId)  # ClusterError: cannot reach peers now
            key = (
                "nvpair-peer",
                nodeId,
                trust.pinFor(nodeId),
                trust.nodeId,
                trust.fingerprint,
                host,
                port,
            )
        except Exception as e:
            raise NotReachable(str(e)) from None
        reactor, timeout = self._reactor, self._dialTimeout or 30.0

        def endpoint() -> IStreamClientEndpoint:
            return wrapClientTLS(creator, HostnameEndpoint(reactor, host, port, timeout=timeout))

        hostValue = (f"[{host}]:{port}" if ":" in host else f"{host}:{port}").encode("ascii")
        return _Target(key, hostValue, b"", endpoint)

    def _target(self, address: str) -> _Target:
        """Parse a plaintext node URL once: pool key, Host header, path prefix, endpoint."""
        uri = URI.fromBytes(address.encode("ascii"))
        if uri.scheme != b"http" or not uri.host:
            raise ValueError("not an http URL")
        hostValue = b"[%s]" % uri.host if b":" in uri.host else uri.host
        if uri.port != 80:
            hostValue = b"%s:%d" % (hostValue, uri.port)
        host = uri.host.decode("ascii")
        port = uri.port
        reactor, timeout = self._reactor, self._dialTimeout or 30.0

        endpoint: Callable[[], IStreamClientEndpoint | DirectTCP]
        if isIPAddress(host) or isIPv6Address(host):
            # An IP literal needs no name resolution: dial it directly, without the
            # endpoint's per-connection wrappers (memory per held stream).
            direct = DirectTCP(reactor, host, port, timeout)

            def endpoint() -> IStreamClientEndpoint | DirectTCP:
                return direct
        else:

            def endpoint() -> IStreamClientEndpoint | DirectTCP:
                return HostnameEndpoint(reactor, host, port, timeout=timeout)

        # The address's path, then the request's.
        target = _Target(("http", uri.host, port), hostValue, uri.path, endpoint)
        if len(self._targets) < 4096:
            self._targets[address] = target
        return target

    def close(self) -> defer.Deferred[None]:
        """Close every pooled connection."""
        return self.pool.closeCachedConnections()


_NONE: tuple[str, ...] = ()


def addressesFor(node: Node, localBackend: str | None, confirmed: str | None) -> tuple[str, ...]:
    """The addresses to try for ``node``, the confirmed one first; the local backend for self.

    The node's own tuple is returned when it is already in that order (no copy).
    """
    if node.isSelf:
        return (localBackend,) if localBackend else _NONE
    addresses: tuple[str, ...] = node.addresses
    if confirmed is None or not addresses or addresses[0] == confirmed:
        return addresses
    if confirmed not in addresses:
        return addresses
    reordered = list(addresses)
    reordered.remove(confirmed)
    return (confirmed, *reordered)

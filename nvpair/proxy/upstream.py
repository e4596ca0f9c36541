"""Reaching a node (protocol §4): direct plaintext engines, the local backend, and peers over mTLS.

One persistent connection pool serves every facade (the lean client of ``httpclient`` for
plaintext nodes; twisted.web's Agent over pinned TLS for peers).  A node's addresses are tried in
order until one connects; the one that connected is remembered per facade until a
transport error makes dispatch forget it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any
from weakref import WeakKeyDictionary

from twisted.internet import defer
from twisted.internet.abstract import isIPAddress, isIPv6Address
from twisted.internet.endpoints import HostnameEndpoint, wrapClientTLS
from twisted.internet.error import ConnectError
from twisted.internet.interfaces import IConsumer, IStreamClientEndpoint
from twisted.web.client import URI, Agent, HTTPConnectionPool
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgentEndpointFactory, IBodyProducer, IResponse
from zope.interface import implementer

from nvpair.proxy._interfaces import IUpstream
from nvpair.proxy.httpframing import isToken, serializeRequest
from nvpair.proxy.httppool import ConnectionPool, DirectTCP


@implementer(IBodyProducer)
class BytesProducer:
    """A request body already in memory, written in one go."""

    def __init__(self, body: bytes) -> None:
        self._body = body
        self.length = len(body)

    def startProducing(self, consumer: IConsumer) -> defer.Deferred[None]:
        consumer.write(self._body)
        return defer.succeed(None)

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


@implementer(IStreamClientEndpoint)
class _PinnedEndpoint:
    """A TLS endpoint to one peer facade, with the identity its connections are pooled under."""

    __slots__ = ("_inner", "poolKey")

    def __init__(self, inner: IStreamClientEndpoint, poolKey: tuple[Any, ...]) -> None:
        self._inner = inner
        self.poolKey = poolKey

    def connect(self, protocolFactory: Any) -> defer.Deferred[Any]:
        """Connect; the pool's factory is made quiet (no log line per connection)."""
        protocolFactory.noisy = False
        return self._inner.connect(protocolFactory)


class _PeerPool(HTTPConnectionPool):
    """The shared peer pool: keyed by what authenticated a connection, able to tell one
    request when its connection is ready, and able to count its idle connections.

    ``Agent`` keys a connection by scheme, host and port; a ``_PinnedEndpoint`` adds the
    peer's node id, its pin and this node's own identity, so a connection made under an old
    pin, an old certificate or another node id is never reused: a trust change takes effect
    on the next request (old connections idle out).  ``Agent.request`` asks the pool for a
    connection synchronously, so ``Upstream.request`` sets ``onConnected`` just around that
    call: the hook fires when a new connection is established, or at once for a cached one
    (the end of the dial, §5.1).
    """

    onConnected: Callable[[], None] | None = None

    def __init__(self, reactor: Any) -> None:
        super().__init__(reactor, persistent=True)
        self._handedOut: WeakKeyDictionary[Any, Any] = WeakKeyDictionary()

    def getConnection(self, key: Any, endpoint: IStreamClientEndpoint) -> Any:
        hook, self.onConnected = self.onConnected, None
        if isinstance(endpoint, _PinnedEndpoint):
            key = (key, endpoint.poolKey)
        d = super().getConnection(key, endpoint)
        d.addCallback(self._handOut, key, hook)
        return d

    def _handOut(self, protocol: Any, key: Any, hook: Callable[[], None] | None) -> Any:
        self._handedOut[protocol] = key
        if hook is not None:
            hook()
        return protocol

    def connectionCounts(self) -> tuple[int, int]:
        """(idle connections, keys with at least one): connections handed out before that
        are waiting for their next request now."""
        keys = [key for conn, key in list(self._handedOut.items()) if conn.state == "QUIESCENT"]
        return len(keys), len(set(keys))


_BODY_METHODS = (b"POST", b"PUT", b"PATCH")
_VALID_METHODS: set[bytes] = set()  # methods found to be tokens (a few)
_VALID_TARGET = re.compile(rb"[\x21-\x7e]+")  # visible ASCII: no space, no control


class _Target:
    """A parsed plaintext node URL."""

    __slots__ = ("key", "host", "prefix", "endpoint")

    def __init__(
        self,
        key: Any,
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


@implementer(IAgentEndpointFactory)
class _PeerEndpoints:
    """Endpoints to one peer node's facades: TLS presenting our certificate, pinned to its id."""

    def __init__(self, reactor: Any, nodeId: str, trust: Any, dialTimeout: float) -> None:
        self._reactor = reactor
        self._nodeId = nodeId
        self._trust = trust
        self._dialTimeout = dialTimeout

    def endpointForURI(self, uri: Any) -> IStreamClientEndpoint:
        """A pinned TLS endpoint; ``NotReachable`` when not a member, no certificate or no pin."""
        trust, nodeId = self._trust, self._nodeId
        try:
            creator = trust.clientCreatorFor(nodeId)
        except Exception as e:  # ClusterError: this node cannot reach peers right now
            raise NotReachable(str(e)) from None
        host = uri.host.decode("ascii")
        tcp = HostnameEndpoint(self._reactor, host, uri.port, timeout=self._dialTimeout)
        poolKey = ("nvpair-peer", nodeId, trust.pinFor(nodeId), trust.nodeId, trust.fingerprint)
        return _PinnedEndpoint(wrapClientTLS(creator, tcp), poolKey)


@implementer(IUpstream)
class Upstream:
    """Opens requests to nodes over the shared pool."""

    def __init__(
        self,
        reactor: Any,
        dialTimeout: float,
        trust: Any = None,
        maxPersistentPerHost: int = 64,
        idleTimeout: int = 90,
    ) -> None:
        self._reactor = reactor
        self._dialTimeout = dialTimeout
        self.trust = trust
        # Plaintext nodes (the hot path): the lean client.  Peers: twisted.web's Agent over
        # pinned TLS endpoints, pooled by node id + pin + own identity.
        self.pool = ConnectionPool(reactor, maxPersistentPerHost, idleTimeout)
        self.peerPool = _PeerPool(reactor)
        self.peerPool.maxPersistentPerHost = maxPersistentPerHost
        self.peerPool.cachedConnectionTimeout = idleTimeout
        self.peerPool.retryAutomatically = False
        self._peers: dict[str, Agent] = {}
        self._targets: dict[str, _Target] = {}

    def _peerAgent(self, nodeId: str) -> Agent:
        agent = self._peers.get(nodeId)
        if agent is None:
            if self.trust is None:
                raise NotReachable("not a cluster member")
            agent = Agent.usingEndpointFactory(
                self._reactor,
                _PeerEndpoints(self._reactor, nodeId, self.trust, self._dialTimeout or 30.0),
                pool=self.peerPool,
            )
            self._peers[nodeId] = agent
        return agent

    def request(
        self,
        node: Any,
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
        if address.startswith("http://"):
            target = self._targets.get(address)
            try:
                if target is None:
                    target = self._target(address)
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
            sent: defer.Deferred[Any] = self.pool.request(
                target.key, target.endpoint, data, method, connected
            )
            return sent
        producer = BytesProducer(body) if body or method in _BODY_METHODS else None
        try:
            host, port = splitHostPort(address)
            agent = self._peerAgent(node.id)
        except Exception as e:
            return defer.fail(NotReachable(str(e)))
        hostPart = f"[{host}]" if ":" in host else host
        url = f"https://{hostPart}:{port}".encode("ascii") + path
        pool = self.peerPool
        pool.onConnected = connected
        try:
            return agent.request(method, url, headers, producer)
        except NotReachable as e:
            return defer.fail(e)
        finally:
            pool.onConnected = None

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

        # The address's path, then the request's (what Agent sent for address + path).
        target = _Target(("http", uri.host, port), hostValue, uri.path, endpoint)
        if len(self._targets) < 4096:
            self._targets[address] = target
        return target

    def close(self) -> defer.Deferred[None]:
        """Close every pooled connection."""
        closing: defer.Deferred[Any] = defer.gatherResults(
            [self.pool.closeCachedConnections(), self.peerPool.closeCachedConnections()]
        )
        return closing.addCallback(lambda _: None)


_NONE: tuple[str, ...] = ()


def addressesFor(
    node: Any, localBackend: str | None, confirmed: str | None
) -> tuple[str, ...]:
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


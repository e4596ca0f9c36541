"""Pinned mutual TLS built from a cluster directory's current state (protocol §6, spec §7).

``ClusterTLS`` builds the connections of the cluster personality: a server connection
creator for the listener (client certificate required and pinned) and, per peer node, a
client creator whose server certificate must equal that node's pin.  There is no CA and no
hostname check: a certificate is trusted exactly when the SHA-256 of its DER is pinned,
whatever OpenSSL thinks of its chain or validity dates.  It also names the pinned node
behind an established connection and tells whether a connection still presents this node's
current certificate.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from OpenSSL import SSL, crypto
from twisted.internet.interfaces import (
    IOpenSSLClientConnectionCreator,
    IOpenSSLServerConnectionCreator,
)
from twisted.web.iweb import IPolicyForHTTPS
from zope.interface import implementer

from nvpair.proxy.cluster.directory import ClusterDirectory, Standing
from nvpair.proxy.cluster.files import Credentials, fingerprintOf

_Verify = Callable[[SSL.Connection, crypto.X509, int, int, int], bool]

_OPTIONS = (
    SSL.OP_NO_SSLv2
    | SSL.OP_NO_SSLv3
    | SSL.OP_NO_TLSv1
    | SSL.OP_NO_TLSv1_1
    | SSL.OP_NO_COMPRESSION
    | SSL.OP_CIPHER_SERVER_PREFERENCE
    | SSL.OP_NO_TICKET
    | SSL.OP_SINGLE_ECDH_USE
    | getattr(SSL, "OP_NO_RENEGOTIATION", 0)
)


class ClusterError(Exception):
    """The cluster personality cannot be used to reach a peer."""


class NotAMember(ClusterError):
    """This node is not a cluster member (no valid ``member.json``)."""


class NoCredentials(ClusterError):
    """This node is a member but has no usable certificate and key in ``tls/``."""


class NoPin(ClusterError):
    """The node id has no pin in ``pins.json``."""


def fingerprintOfCertificate(cert: crypto.X509 | x509.Certificate) -> str:
    """Fingerprint of a pyOpenSSL or cryptography certificate object."""
    if isinstance(cert, crypto.X509):
        cert = cert.to_cryptography()
    return fingerprintOf(cert.public_bytes(serialization.Encoding.DER))


@implementer(IOpenSSLServerConnectionCreator)
class _ServerCreator:
    """Builds server-side cluster TLS connections from the trust's current state."""

    def __init__(self, tls: ClusterTLS) -> None:
        self._tls = tls

    def serverConnectionForTLS(self, tlsProtocol: object) -> SSL.Connection:
        """Return a fresh server connection (one that fails its handshake when not a member)."""
        return SSL.Connection(self._tls._serverContext(), None)


@implementer(IOpenSSLClientConnectionCreator)
class _ClientCreator:
    """Builds client-side cluster TLS connections that accept only one node's pin."""

    def __init__(self, tls: ClusterTLS, nodeId: str) -> None:
        self._tls = tls
        self._nodeId = nodeId

    def clientConnectionForTLS(self, tlsProtocol: object) -> SSL.Connection:
        """Return a fresh client connection verifying the server against the node's pin."""
        return self._tls._clientConnection(self._nodeId)


@implementer(IPolicyForHTTPS)
class _NodePolicy:
    """An HTTPS policy that reaches one cluster node whatever the netloc."""

    def __init__(self, tls: ClusterTLS, nodeId: str) -> None:
        self._tls = tls
        self._nodeId = nodeId

    def creatorForNetloc(self, hostname: bytes, port: int) -> IOpenSSLClientConnectionCreator:
        """Return the pinned creator for the node (raises ``ClusterError`` subclasses)."""
        return self._tls.clientCreatorFor(self._nodeId)


class ClusterTLS:
    """The mutual-TLS connections of a ``ClusterDirectory``'s current state.

    Server side: ``serverContextFactory`` builds each connection from the current state.
    When the node is not a member, or has no usable certificate, the connection it builds
    carries no certificate and rejects every peer, so its handshake fails (it never
    raises).  Contexts are cached per directory generation; ``dropContexts`` releases them.
    """

    def __init__(self, directory: ClusterDirectory) -> None:
        self._directory = directory
        self._serverCtx: tuple[int, SSL.Context] | None = None
        self._clientCtx: tuple[int, SSL.Context] | None = None
        self._refusingServerCtx: SSL.Context | None = None
        self._refusingClientCtx: SSL.Context | None = None
        self._peerFingerprints: weakref.WeakKeyDictionary[object, str] = weakref.WeakKeyDictionary()
        self._localFingerprints: weakref.WeakKeyDictionary[object, str] = (
            weakref.WeakKeyDictionary()
        )
        self._serverCreator = _ServerCreator(self)

    @property
    def serverContextFactory(self) -> IOpenSSLServerConnectionCreator:
        """The server connection creator for the cluster personality."""
        return self._serverCreator

    def dropContexts(self) -> None:
        """Forget the cached contexts (the state they were built from has changed)."""
        self._serverCtx = None
        self._clientCtx = None

    def clientCreatorFor(self, nodeId: str) -> IOpenSSLClientConnectionCreator:
        """Return a creator that presents this node's certificate and accepts only ``nodeId``.

        Raises ``NotAMember``, ``NoCredentials`` or ``NoPin``.  The membership and the pin
        are checked again on each connection the creator builds.
        """
        self._requireClientUsable(nodeId)
        return _ClientCreator(self, nodeId)

    def policyForNode(self, nodeId: str) -> IPolicyForHTTPS:
        """Return an HTTPS policy reaching ``nodeId`` whatever netloc it is asked for."""
        self._requireClientUsable(nodeId)
        return _NodePolicy(self, nodeId)

    def peerNodeId(self, transport: object) -> str | None:
        """Return the pinned node id of an established connection's peer certificate.

        ``transport`` is anything with ``getPeerCertificate()`` (the TLS protocol, or a
        request's transport).  None when not a member, no certificate, or no pin any more.
        """
        if not self._directory.isMember:
            return None
        fp = _cachedFingerprint(self._peerFingerprints, transport, _peerCertificate)
        if fp is None:
            return None
        return self._directory.fingerprintAllowed(fp)

    def presentsCurrentIdentity(self, transport: object) -> bool:
        """Whether an established connection was made with this node's current certificate.

        ``transport`` is the TLS protocol (anything with ``getHandle()`` returning the
        ``SSL.Connection``).  False after a rotation, so a kept-alive connection made under
        the old certificate can be cut on its next request.
        """
        credentials = self._directory.credentials
        if credentials is None:
            return False
        fp = _cachedFingerprint(self._localFingerprints, transport, _localCertificate)
        return fp == credentials.fingerprint

    def _requireClientUsable(self, nodeId: str) -> None:
        """Raise the ``ClusterError`` that forbids reaching ``nodeId`` now, if any."""
        standing = self._directory.standing
        if standing in (Standing.OFF, Standing.NOT_MEMBER):
            raise NotAMember("this node is not a cluster member")
        if standing is Standing.NO_CREDENTIALS:
            raise NoCredentials("no usable certificate and key in tls/")
        if self._directory.pinFor(nodeId) is None:
            raise NoPin(f"no pin for node {nodeId!r}")

    def _serverContext(self) -> SSL.Context:
        """The server context of the current generation (or the refusing one)."""
        credentials = self._directory.credentials
        if not self._directory.isMember or credentials is None:
            if self._refusingServerCtx is None:
                self._refusingServerCtx = _serverContext(None, _refuseAll)
            return self._refusingServerCtx
        generation = self._directory.generation
        cached = self._serverCtx
        if cached is not None and cached[0] == generation:
            return cached[1]
        ctx = _serverContext(credentials, self._verifyClient)
        self._serverCtx = (generation, ctx)
        return ctx

    def _clientConnection(self, nodeId: str) -> SSL.Connection:
        """A client connection for ``nodeId`` (one that fails its handshake when unusable)."""
        credentials = self._directory.credentials
        if not self._directory.isMember or credentials is None:
            if self._refusingClientCtx is None:
                self._refusingClientCtx = _clientContext(None)
            return SSL.Connection(self._refusingClientCtx, None)
        generation = self._directory.generation
        cached = self._clientCtx
        if cached is not None and cached[0] == generation:
            ctx = cached[1]
        else:
            ctx = _clientContext(credentials)
            self._clientCtx = (generation, ctx)
        connection = SSL.Connection(ctx, None)
        connection.set_verify(SSL.VERIFY_PEER, self._serverVerifierFor(nodeId))
        return connection

    def _verifyClient(
        self, conn: SSL.Connection, cert: crypto.X509, errnum: int, depth: int, ok: int
    ) -> bool:
        """Server verify callback: the client's leaf certificate must be pinned."""
        directory = self._directory
        return _leafAccepted(
            cert,
            depth,
            lambda fp: directory.isMember and directory.fingerprintAllowed(fp) is not None,
        )

    def _serverVerifierFor(self, nodeId: str) -> _Verify:
        """Client verify callback: the server's leaf must equal the current pin of ``nodeId``."""
        directory = self._directory

        def accept(fp: str) -> bool:
            pin = directory.pinFor(nodeId)
            return pin is not None and directory.isMember and fp == pin

        def verify(
            conn: SSL.Connection, cert: crypto.X509, errnum: int, depth: int, ok: int
        ) -> bool:
            return _leafAccepted(cert, depth, accept)

        return verify


def _leafAccepted(cert: crypto.X509, depth: int, accept: Callable[[str], bool]) -> bool:
    """Verify-callback body: intermediates pass, the leaf passes when its fingerprint does."""
    if depth > 0:
        return True
    try:
        return accept(fingerprintOfCertificate(cert))
    except Exception:  # noqa: BLE001 - an unreadable certificate is refused
        return False


def _refuseAll(conn: SSL.Connection, cert: crypto.X509, errnum: int, depth: int, ok: int) -> bool:
    """A verify callback that rejects every certificate."""
    return False


def _context(credentials: Credentials | None) -> SSL.Context:
    """A TLS 1.2+ context, presenting this node's certificate and key when given."""
    ctx = SSL.Context(SSL.TLS_METHOD)
    ctx.set_min_proto_version(SSL.TLS1_2_VERSION)
    ctx.set_options(_OPTIONS)
    if credentials is not None:
        ctx.set_mode(SSL.MODE_RELEASE_BUFFERS)
        ctx.use_certificate(credentials.certificate)
        ctx.use_privatekey(credentials.privateKey)
        ctx.check_privatekey()
    return ctx


def _serverContext(credentials: Credentials | None, verify: _Verify) -> SSL.Context:
    """A server context requiring a client certificate that ``verify`` accepts."""
    ctx = _context(credentials)
    ctx.set_verify(SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT, verify)
    # Required for client certificates with session-aware OpenSSL; sessions are off.
    ctx.set_session_id(b"nvpair-cluster")
    ctx.set_session_cache_mode(SSL.SESS_CACHE_OFF)
    return ctx


def _clientContext(credentials: Credentials | None) -> SSL.Context:
    """A client context; each connection sets the verify callback of its node's pin."""
    ctx = _context(credentials)
    ctx.set_session_cache_mode(SSL.SESS_CACHE_OFF)
    ctx.set_verify(SSL.VERIFY_PEER, _refuseAll)
    return ctx


def _peerCertificate(transport: object) -> object:
    """The peer certificate of a TLS transport (None when it has none)."""
    getPeerCertificate = getattr(transport, "getPeerCertificate", None)
    return None if getPeerCertificate is None else getPeerCertificate()


def _localCertificate(transport: object) -> object:
    """The certificate a TLS protocol's connection presented (None when unknown)."""
    getHandle = getattr(transport, "getHandle", None)
    return None if getHandle is None else getHandle().get_certificate()


def _cachedFingerprint(
    cache: weakref.WeakKeyDictionary[object, str],
    transport: object,
    certificateOf: Callable[[object], object],
) -> str | None:
    """The fingerprint of a transport's certificate, cached per transport object."""
    try:
        cached = cache.get(transport)
    except TypeError:
        cached = None
    if cached is not None:
        return cached
    try:
        cert = certificateOf(transport)
    except Exception:  # noqa: BLE001 - no TLS session yet or already torn down
        return None
    if not isinstance(cert, crypto.X509 | x509.Certificate):
        return None
    fp = fingerprintOfCertificate(cert)
    try:
        cache[transport] = fp
    except TypeError:
        pass
    return fp

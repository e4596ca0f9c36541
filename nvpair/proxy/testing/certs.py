"""Self-signed node certificates and cluster directories (protocol §6).

Reusable by every test that needs a cluster member: ``makeNodeCert`` mints a self-signed
EC P-256 certificate, ``writeClusterDir`` lays out ``member.json``, ``tls/node.crt``,
``tls/node.key`` and ``pins.json`` atomically (temp file + rename), as the real writer does.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import tempfile
from collections.abc import Mapping

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

StrPath = str | os.PathLike[str]


def makeNodeCert(commonName: str) -> tuple[bytes, bytes, str]:
    """Return ``(certPEM, keyPEM, fingerprint)`` of a fresh self-signed EC P-256 certificate.

    The fingerprint is the lowercase hex SHA-256 of the certificate's DER; the certificate
    is valid from a day ago until a year from now.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, commonName)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    certPEM = cert.public_bytes(serialization.Encoding.PEM)
    keyPEM = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fingerprint = hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()
    return certPEM, keyPEM, fingerprint


def writeFileAtomic(path: StrPath, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (temp file in the same directory + rename)."""
    target = os.fspath(path)
    directory = os.path.dirname(target) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def writeJSONAtomic(path: StrPath, value: object) -> None:
    """Write ``value`` as JSON to ``path`` atomically."""
    writeFileAtomic(path, json.dumps(value).encode("utf-8"))


def writeMember(path: StrPath, nodeId: str, clusterId: str = "c1") -> None:
    """Write ``<path>/member.json`` atomically."""
    writeJSONAtomic(
        os.path.join(os.fspath(path), "member.json"), {"clusterId": clusterId, "nodeId": nodeId}
    )


def writePins(path: StrPath, pins: Mapping[str, str]) -> None:
    """Write ``<path>/pins.json`` atomically."""
    writeJSONAtomic(os.path.join(os.fspath(path), "pins.json"), {"pins": dict(pins)})


def writeNodeTLS(path: StrPath, certPEM: bytes, keyPEM: bytes) -> None:
    """Write ``<path>/tls/node.key`` then ``<path>/tls/node.crt``, each atomically."""
    tlsDir = os.path.join(os.fspath(path), "tls")
    writeFileAtomic(os.path.join(tlsDir, "node.key"), keyPEM)
    writeFileAtomic(os.path.join(tlsDir, "node.crt"), certPEM)


def writeClusterDir(
    path: StrPath,
    nodeId: str,
    certPEM: bytes,
    keyPEM: bytes,
    pins: Mapping[str, str],
    clusterId: str = "c1",
) -> None:
    """Lay out a complete cluster directory for a member node, every file atomically.

    The TLS files and pins are written before ``member.json``, so a watcher never sees a
    member without its certificate.
    """
    os.makedirs(os.fspath(path), exist_ok=True)
    writeNodeTLS(path, certPEM, keyPEM)
    writePins(path, pins)
    writeMember(path, nodeId, clusterId)

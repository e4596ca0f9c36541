"""The ``Host`` rule of plaintext listeners (protocol §8): no DNS rebinding into the fleet.

A web page can re-point a name it controls at 127.0.0.1 and then call the proxy as a
same-origin request; its requests still carry the page's name in ``Host``.  ``HostRule``
says whether a ``Host`` value names this machine: ``localhost`` and ``*.localhost``, any
127.0.0.0/8 address, ``[::1]`` (and IPv4-mapped loopback), this machine's host name and that
name (or its first label) followed by ``.local`` or ``.internal``, and the names of
``--allowed-hosts`` (``*`` turns the check off).  Other ``.local`` and ``.internal`` names
are refused, a deliberate deviation from protocol §8 (spec §4.1): anyone on the LAN can
answer such a name over mDNS and rebind it to 127.0.0.1; ``--allowed-hosts '*.local'``
restores the protocol's rule.  The port is not checked.  Verdicts are cached by the raw
header value in a small bounded dict, so the usual ``127.0.0.1:PORT`` costs one dict
lookup.  ``HostGate``
is the rule as a listener uses it: a refusal is counted and logged once per name (the name
only; the set of names already logged is bounded).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Iterable

from twisted.logger import Logger

CACHE_SIZE = 256
"""Verdicts kept; the cache is emptied when full (the common hosts come straight back)."""
CACHE_KEY_MAX = 128
"""Longer ``Host`` values are decided every time rather than kept."""
LOGGED_NAMES = 256
"""Refused names logged individually; past that, refusals are only counted."""
LOG_NAME_MAX = 100
"""A refused name is cut to this many characters in the log."""

_OWN_SUFFIXES = (".local", ".internal")
_NAME = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*\Z")
_DIGITS = re.compile(r"[0-9.]+\Z")
_PORT = re.compile(r"[0-9]{0,5}\Z")
_LOOPBACK_V4 = ipaddress.IPv4Network("127.0.0.0/8")
_LOOPBACK_V6 = ipaddress.IPv6Address("::1")


def _name(text: str) -> str | None:
    """A host name or IPv4 address (lower case, one trailing dot dropped), or ``None``."""
    if text.endswith("."):
        text = text[:-1]
    if len(text) > 253 or not _NAME.match(text):
        return None
    if _DIGITS.match(text):  # all digits and dots: a dotted quad or nothing
        try:
            return str(ipaddress.IPv4Address(text))
        except ValueError:
            return None
    return text


def _ipv6(text: str) -> str | None:
    """The compressed form of an IPv6 literal (no zone), or ``None``."""
    if "%" in text:
        return None
    try:
        return str(ipaddress.IPv6Address(text))
    except ValueError:
        return None


def parseHost(value: bytes) -> str | None:
    """The name a ``Host`` value gives, without its port, normalized; ``None`` if malformed.

    IPv6 literals come back without brackets (``::1``); names in lower case without a
    trailing dot.  Malformed: empty, spaces or other characters no host name has, an
    unbracketed IPv6 address, several colons, a port that is not 0-5 digits.
    """
    text = value.decode("latin-1").lower()
    if text.startswith("["):
        inner, sep, rest = text[1:].partition("]")
        if not sep or (rest and not (rest[0] == ":" and _PORT.match(rest[1:]))):
            return None
        return _ipv6(inner)
    name, sep, port = text.partition(":")
    if sep and not _PORT.match(port):
        return None
    return _name(name)


def ownNames(hostname: str) -> frozenset[str]:
    """This machine's names: ``hostname`` (normalized), and it and its first label followed
    by ``.local`` or ``.internal`` (what mDNS and container runtimes call this machine)."""
    hostname = hostname.lower().rstrip(".")
    if not hostname:
        return frozenset()
    stems = {hostname, hostname.split(".")[0]}
    return frozenset({hostname} | {stem + suffix for stem in stems for suffix in _OWN_SUFFIXES})


def isLoopbackName(name: str, own: frozenset[str]) -> bool:
    """Whether a normalized name is one of the loopback names (spec §4.1) of a machine
    whose names (``ownNames``) are ``own``."""
    if not name:
        return False
    if name == "localhost" or name in own or name.endswith(".localhost"):
        return True
    if name[0].isdigit() and "." in name and ":" not in name:
        try:
            return ipaddress.IPv4Address(name) in _LOOPBACK_V4
        except ValueError:
            return False
    if ":" in name:
        address = ipaddress.IPv6Address(name)
        mapped = address.ipv4_mapped
        return address == _LOOPBACK_V6 or (mapped is not None and mapped in _LOOPBACK_V4)
    return False


def parseAllowedHosts(text: str) -> tuple[str, ...]:
    """Parse ``--allowed-hosts``: comma-separated names, ``*.domain`` patterns or ``*``.

    Each entry is a host name, an IPv4 address or an IPv6 address (bracketed or not),
    without a port; ``*.example.com`` allows every name below ``example.com``.  Empty
    entries are skipped.  Raises ``ValueError`` naming the first bad entry.
    """
    out: list[str] = []
    for raw in text.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            out.append(entry)
            continue
        if entry.startswith("[") and entry.endswith("]"):
            name = _ipv6(entry[1:-1])
        elif ":" in entry:
            name = _ipv6(entry)
        elif entry.startswith("*."):
            suffix = _name(entry[2:])
            name = None if suffix is None else "*." + suffix
        else:
            name = _name(entry)
        if name is None:
            raise ValueError(
                f"not a host name or address: {raw.strip()!r} "
                "(a name, an IP address, *.domain or *; no port)"
            )
        out.append(name)
    return tuple(dict.fromkeys(out))


class HostRule:
    """Decides whether a ``Host`` value names this machine (protocol §8), with a small cache."""

    def __init__(self, allowed: Iterable[str] = (), hostname: str | None = None) -> None:
        allowed = tuple(allowed)
        self.open = "*" in allowed
        if hostname is None:
            hostname = socket.gethostname()
        self.hostname = hostname.lower().rstrip(".")
        self.own = ownNames(hostname)
        self.names = frozenset(n for n in allowed if not n.startswith("*"))
        self.suffixes = tuple(n[1:] for n in allowed if n.startswith("*."))
        self._cache: dict[bytes, bool] = {}

    def allows(self, host: bytes | None) -> bool:
        """Whether a request with this ``Host`` value (``None``: absent) may be served."""
        if host is None or self.open:
            return True
        verdict = self._cache.get(host)
        if verdict is None:
            verdict = self.decide(host)
            if len(host) <= CACHE_KEY_MAX:
                cache = self._cache
                if len(cache) >= CACHE_SIZE:
                    cache.clear()
                cache[host] = verdict
        return verdict

    def decide(self, host: bytes) -> bool:
        """The verdict for one present ``Host`` value, uncached."""
        name = parseHost(host)
        if name is None:
            return False
        return (
            isLoopbackName(name, self.own)
            or name in self.names
            or (bool(self.suffixes) and name.endswith(self.suffixes))
        )


def describeHost(host: bytes | None) -> str:
    """The name to log for a refused ``Host``: the parsed name, else the raw value, shortened."""
    if host is None:
        return ""
    name = parseHost(host)
    if name is None:
        name = host.decode("latin-1")
    return name[:LOG_NAME_MAX]


class HostGate:
    """The rule in front of a listener: refusals are counted and logged once per name."""

    log = Logger()

    def __init__(self, rule: HostRule, count: Callable[[str], object]) -> None:
        self.rule = rule
        self.allows = rule.allows
        self._count = count
        self._logged: set[str] = set()
        self._full = False

    def refused(self, host: bytes | None, listener: str) -> None:
        """Count a refused request on ``listener`` (an engine id or ``ops``); log a new name."""
        self._count(listener)
        name = describeHost(host)
        logged = self._logged
        if name in logged:
            return
        if len(logged) >= LOGGED_NAMES:
            if not self._full:
                self._full = True
                self.log.warn("host-denied-log-full", names=LOGGED_NAMES)
            return
        logged.add(name)
        if listener == "ops":
            self.log.warn("host-denied", listener=listener, host=name)
        else:
            self.log.warn("host-denied", engine=listener, host=name)

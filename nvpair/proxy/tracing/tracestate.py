"""The W3C ``tracestate`` rules a client's header must meet before it goes on (spec §9a).

A ``tracestate`` is a comma-separated list of ``key=value`` members (W3C Trace Context §3.3):
at most 32 of them, each key once, keys and values in the grammar below; we also refuse one
longer than 512 characters (the length every tracer must carry; past it the standard lets a
tracer cut or drop it) **(choice)**.  A header that breaks any rule is dropped whole, never
passed on or repaired: the standard forbids propagating a ``tracestate`` that failed to
parse.  Pure and bounded: the text is looked at only once it is at most 512 characters.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

MAX_MEMBERS = 32
MAX_LENGTH = 512

_KEY_CHARS = r"[a-z0-9_\-*/]"
# simple-key / tenant-id "@" system-id
_KEY = rf"(?:[a-z]{_KEY_CHARS}{{0,255}}|[a-z0-9]{_KEY_CHARS}{{0,240}}@[a-z]{_KEY_CHARS}{{0,13}})"
# 0*255(chr) nblk-chr; nblk-chr: printable ASCII but "," and "="; chr: nblk-chr or space
_NBLK = r"[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
_VALUE = rf"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{{0,255}}{_NBLK}"
_MEMBER = re.compile(rf"({_KEY})=({_VALUE})")


def validTracestate(values: Sequence[str]) -> bool:
    """Whether the ``tracestate`` header lines ``values`` (joined with ``,``, RFC 9110
    §5.3) make one valid list: at most 512 characters and 32 members, each ``key=value``
    in the W3C grammar, no key twice.  Empty members (and spaces or tabs around members)
    are allowed, as the standard says."""
    if sum(len(v) for v in values) + len(values) - 1 > MAX_LENGTH:
        return False
    keys: set[str] = set()
    for line in values:
        for member in line.split(","):
            member = member.strip(" \t")
            if not member:
                continue
            match = _MEMBER.fullmatch(member)
            if match is None or match.group(1) in keys or len(keys) == MAX_MEMBERS:
                return False
            keys.add(match.group(1))
    return True

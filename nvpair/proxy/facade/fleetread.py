"""Reading the fleet file without ever blocking on it (spec §11, "The fleet file").

Only a regular file is read.  Its path is looked at with ``stat`` first, so a named pipe, a
device, a socket or a directory put there by mistake is refused with a message naming what
it is, and never opened: opening a FIFO for reading waits for a writer, and a device may
act when opened.  The file is then opened with ``O_NONBLOCK`` and checked again on the open
descriptor (the path may have been replaced in between), and at most ``limit`` bytes are
read.  Start, ``--check-fleet`` and every reload read through here.
"""

from __future__ import annotations

import errno
import os
import stat

_KINDS = (
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class NotRegularFile(OSError):
    """The path names something other than a regular file; ``strerror`` says what."""

    def __init__(self, mode: int) -> None:
        kind = next((name for test, name in _KINDS if test(mode)), "not a file")
        super().__init__(errno.EINVAL, f"not a regular file ({kind})")


def readRegularFile(path: str, limit: int) -> bytes:
    """Up to ``limit`` bytes of the regular file at ``path``; ``OSError`` (``NotRegularFile``
    for anything but a regular file) when it cannot be read."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise NotRegularFile(mode)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(mode)
        parts: list[bytes] = []
        left = limit
        while left > 0:
            part = os.read(fd, left)
            if not part:
                break
            parts.append(part)
            left -= len(part)
        return b"".join(parts)
    finally:
        os.close(fd)

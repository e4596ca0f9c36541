"""The states of the answer to a request on an upstream connection (``client``), and the
transitions between them: the connection changes its ``answer`` only through ``_to``,
which checks each change against ``NEXT``.

An answer is complete (``ENDED``) once llhttp ended its message (``DONE`` or ``LAST``) or,
for HEAD, its head; ``OVERRUN`` is a complete answer that had bytes after it: it stands as
framed, and its connection closes.
"""

from __future__ import annotations

from enum import Enum


class Answer(Enum):
    """Where the answer to the current request is."""

    HEAD = "head"  # the final answer's head is awaited
    INTERIM = "interim"  # inside an interim (1xx) answer: the final one follows
    OPEN = "open"  # the final head is complete (llhttp's view); its body is being read
    DONE = "done"  # ended as framed; llhttp says the connection may be kept
    LAST = "last"  # ended as framed; the connection closes after it (llhttp said so, or HEAD)
    OVERRUN = "overrun"  # ended, and bytes came after it: it stands, the connection closes
    STOPPED = "stopped"  # the body protocol wants no more: nothing more is delivered


HEAD = Answer.HEAD
INTERIM = Answer.INTERIM
OPEN = Answer.OPEN
DONE = Answer.DONE
LAST = Answer.LAST
OVERRUN = Answer.OVERRUN
STOPPED = Answer.STOPPED

# The answer is complete: nothing after it may change it.
ENDED = frozenset({DONE, LAST, OVERRUN})

# Every transition ``HTTPClientConnection._to`` makes (``send`` starts each request at HEAD).
NEXT: dict[Answer, frozenset[Answer]] = {
    HEAD: frozenset({INTERIM, OPEN, LAST}),  # LAST: a HEAD answer ends at its head
    INTERIM: frozenset({HEAD}),
    OPEN: frozenset({DONE, LAST, STOPPED}),
    DONE: frozenset({OVERRUN, STOPPED}),
    LAST: frozenset({OVERRUN, STOPPED}),
    OVERRUN: frozenset({STOPPED}),
    STOPPED: frozenset(),
}

"""The chaos soak engine: a faulty fleet, a churning discovery, and an oracle for every answer.

A fleet of ``ChaosEngine`` fake engines draws each request's behaviour at random (seeded per
request and attempt) from refuse, 503, 429, hang after headers, slow first byte, die
mid-stream and answer normally, and records it in a shared ``Ledger`` under the client's
``X-Chaos-Id`` header (which the proxy forwards verbatim).  Meanwhile nodes leave and rejoin
discovery and the scheduler snapshot changes generation (sometimes redelivered, sometimes
stale).  Every client answer is then checked against what its attempts saw (``judge``), the
terminal workload events against the answers, and at the end the process must hold no
reservation, no in-flight dispatch, no extra descriptor and no growing memory.

The package: ``records`` (config, ledger, sends), ``engine`` (the chaos fake engine),
``oracle`` (``classify``, ``judge``, and ``sentOrder``: the order the proxy sent the attempts
in), ``checks`` (process probes, ``Report``, the end-of-run checks), ``traffic`` (the client
side) and ``soak`` (``Soak``, one run).

Used by ``tests/hostile/test_chaos.py`` (CI mode) and ``bench/soak.py`` (long mode).
"""

from tests.support.chaos.checks import Report, SoakChecks, openFds, proxyPid, rssKiB
from tests.support.chaos.engine import (
    CHAOS_HEADER,
    INFERENCE_WEIGHTS,
    STATUS_BODY,
    VERBATIM_WEIGHTS,
    ChaosEngine,
    socketFacts,
)
from tests.support.chaos.oracle import (
    ARRIVAL_SLACK,
    GENERATED_REASONS,
    OUTCOMES,
    VERBATIM_OUTCOMES,
    classify,
    judge,
    sentOrder,
    unanswered,
)
from tests.support.chaos.records import Attempt, ChaosConfig, Ledger, Sent
from tests.support.chaos.soak import Soak
from tests.support.chaos.traffic import SoakTraffic

__all__ = [
    "ARRIVAL_SLACK",
    "CHAOS_HEADER",
    "GENERATED_REASONS",
    "INFERENCE_WEIGHTS",
    "OUTCOMES",
    "STATUS_BODY",
    "VERBATIM_OUTCOMES",
    "VERBATIM_WEIGHTS",
    "Attempt",
    "ChaosConfig",
    "ChaosEngine",
    "Ledger",
    "Report",
    "Sent",
    "Soak",
    "SoakChecks",
    "SoakTraffic",
    "classify",
    "judge",
    "openFds",
    "proxyPid",
    "rssKiB",
    "sentOrder",
    "socketFacts",
    "unanswered",
]

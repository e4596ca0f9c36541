"""Each router's requests, written for reading afterwards (``--records DIR``)."""

from __future__ import annotations

import json
import os
import shutil

import attrs

from bench import procs
from bench.routing.client import Record
from bench.routing.llamaserver import serverLog

__all__ = ["writeRecords"]


def writeRecords(
    where: str, name: str, records: list[Record], llamaServers: list[procs.Server]
) -> None:
    """Each request as one JSON line in ``where/<router>.jsonl`` (every field of its
    ``Record``, ``sent`` in seconds from the first request), and each real llama-server's
    log beside it as ``<router>-<engine>.log`` (which slot each task took, what it reused)."""
    os.makedirs(where, exist_ok=True)
    start = min((r.sent for r in records), default=0.0)
    with open(os.path.join(where, f"{name}.jsonl"), "w") as f:
        for r in records:
            line = attrs.asdict(r)
            line["sent"] = round(r.sent - start, 3)
            f.write(json.dumps(line) + "\n")
    for server in llamaServers:
        shutil.copyfile(serverLog(server.name), os.path.join(where, f"{name}-{server.name}.log"))

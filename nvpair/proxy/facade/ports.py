"""Port rules and the persisted per-engine port (spec §8, protocol §4 and §7)."""

from __future__ import annotations

import json
import os
import tempfile

from nvpair.proxy.engines import Engine


class PortError(ValueError):
    """A port value that the contract rejects (negative, over 65535, not an integer)."""


def requestedPort(engine: Engine, value: object) -> int:
    """Resolve a requested port: 0 is the engine's standalone default, 1..65535 as given."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise PortError("port must be an integer")
    if value == 0:
        return engine.standalonePort
    if not 1 <= value <= 65535:
        raise PortError("port must be 0..65535")
    return value


class PortStore:
    """Reads and atomically writes ``<state-dir>/<engine port file>``."""

    def __init__(self, stateDir: str) -> None:
        self.stateDir = stateDir

    def path(self, engine: Engine) -> str:
        """Where this engine's persisted port lives."""
        return os.path.join(self.stateDir, engine.portFile)

    def load(self, engine: Engine) -> int | None:
        """The persisted port, None when there is none; raises ValueError if unreadable."""
        try:
            with open(self.path(engine), "rb") as f:
                raw = f.read(4096)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise ValueError(f"cannot read {engine.portFile}: {e.strerror}") from None
        try:
            doc = json.loads(raw)
        except ValueError:
            raise ValueError(f"{engine.portFile} is not valid JSON") from None
        port = doc.get("port") if isinstance(doc, dict) else None
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ValueError(f"{engine.portFile} has no valid port")
        return port

    def save(self, engine: Engine, port: int) -> None:
        """Persist ``port`` atomically (temp file, fsync, rename)."""
        os.makedirs(self.stateDir, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{engine.portFile}.", dir=self.stateDir)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"port": port}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path(engine))
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

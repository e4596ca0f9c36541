"""A scriptable fake inference engine (Ollama or OpenAI-style), in process or standalone.

In a test::

    engine = FakeEngine(reactor, "ollama", ["llama3"], name="a")
    engine.listen()                   # engine.url, engine.port
    engine.script(Status(503), DieMidStream(afterChunks=2))
    ...
    rec = await engine.waitForRequest(1)
    await engine.close()

As a process: ``python -m nvpair.proxy.testing.fakeengine --port 9001 --dialect ollama
--models llama3`` (see ``cli``).

The modules: ``behaviours`` (the script and the recorded requests), ``dialects`` (the routes
and the documents and stream events of each dialect), ``connection`` (the raw HTTP/1.1
server), ``answers`` (carrying a behaviour out on a connection), ``engine`` and ``cli``.
"""

from nvpair.proxy.testing.fakeengine.behaviours import (
    Answer,
    Behaviour,
    DieMidStream,
    Drop,
    Echo,
    Hang,
    HangAfterHeaders,
    Recorded,
    SlowFirstByte,
    Status,
)
from nvpair.proxy.testing.fakeengine.cli import engineFromArgs, main
from nvpair.proxy.testing.fakeengine.connection import IRequestHandler
from nvpair.proxy.testing.fakeengine.dialects import (
    CREATED,
    CREATED_AT,
    DIALECTS,
    EMBEDDING,
    PROMPT_TOKENS,
    Listing,
    Route,
    content,
    document,
    listDocument,
    streamPieces,
    token,
)
from nvpair.proxy.testing.fakeengine.engine import FakeEngine

__all__ = [
    "CREATED",
    "CREATED_AT",
    "DIALECTS",
    "EMBEDDING",
    "PROMPT_TOKENS",
    "Answer",
    "Behaviour",
    "DieMidStream",
    "Drop",
    "Echo",
    "FakeEngine",
    "Hang",
    "HangAfterHeaders",
    "IRequestHandler",
    "Listing",
    "Recorded",
    "Route",
    "SlowFirstByte",
    "Status",
    "content",
    "document",
    "engineFromArgs",
    "listDocument",
    "main",
    "streamPieces",
    "token",
]

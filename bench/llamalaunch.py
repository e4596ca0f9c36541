"""Start llama-cpp-python's server with llama.cpp's full-size sliding-window cache.

    <llama python> bench/llamalaunch.py <llama_cpp.server arguments>

Gemma 3 attends through a sliding window on most layers.  With the default (window-sized)
cache, llama.cpp cannot cut the cache back to a shared prefix, so llama-cpp-python
re-evaluates every prompt from its first token and no prompt cache ever helps.  llama.cpp's
own server has ``--swa-full`` for this; llama-cpp-python 0.3 takes ``swa_full`` in
``Llama(...)`` but its server has no flag for it, so this launcher sets it by default and
then runs the server unchanged.  Used by ``bench.affinity``; runs in the engine's
interpreter (it imports only ``llama_cpp``).
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import llama_cpp
from llama_cpp.server.__main__ import main

_init = llama_cpp.Llama.__init__


@functools.wraps(_init)
def _withFullSWA(self: Any, *args: Any, **kwargs: Any) -> None:
    kwargs.setdefault("swa_full", True)
    _init(self, *args, **kwargs)


if __name__ == "__main__":
    setattr(llama_cpp.Llama, "__init__", _withFullSWA)  # noqa: B010 (typed either way)
    sys.argv[0] = "llama_cpp.server"
    main()

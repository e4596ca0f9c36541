"""Standalone flow control, pure policy on a clock (no reactor, no transport): the fair
queue (``fairqueue``), client keys (``clients``), known-full judgement (``room``) and the
node breakers (``breaker``); ``dispatch.queueing`` composes them."""

"""What standalone mode knows of each node's engine: its own state endpoints parsed, the
probes' records, and the room ledger that placement, the queue and holds all read."""

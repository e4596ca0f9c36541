"""One request carried to a node: the exchange (attempt loop and commit), an attempt, the relay to
the client, the upstream connector and the stall watch.
"""

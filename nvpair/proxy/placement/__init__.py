"""Where a request goes: the placement policies, and standalone's placement by cache
(conversation affinity, the prefix index, the choice among owners)."""

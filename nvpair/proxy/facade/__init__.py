"""Where requests enter: one facade per engine with its listeners and personality switch, the
front door (Host rule, admission, route), ports, fleet views and standalone mode.  The engine
table they all read is ``nvpair.proxy.engines``.
"""

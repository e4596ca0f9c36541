"""Where requests enter: the engine table, one facade per engine with its listeners and personality
switch, the front door (Host rule, admission, route), ports, fleet views and standalone mode.
"""

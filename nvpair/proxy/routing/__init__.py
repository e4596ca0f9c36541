"""Routing policy, pure and reactor-free: admission, candidate order, reservations, affinity,
placement (where a request is tried and how often), statistics and CORS rules.
"""

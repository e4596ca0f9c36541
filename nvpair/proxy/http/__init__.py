"""The HTTP/1.1 wire, both ways, on llhttp: the server side (connection, request reader and rules,
request, site) and the client side (connection, framing, response, pool).
"""

from twisted.application.reactors import Reactor

nvpairReactor = Reactor(
    "nvpair",
    "nvpair.proxy.runtime.eventloop",
    "epoll with the nvpair proxy's lean event dispatch (stock epoll if Twisted changed).",
)

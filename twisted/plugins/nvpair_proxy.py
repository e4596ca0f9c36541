from twisted.application.service import ServiceMaker

nvpairProxy = ServiceMaker(
    "nvpair-proxy",
    "nvpair.proxy.tap",
    "The nvpair engine proxy: one facade per engine, routing inference to model owners.",
    "nvpair-proxy",
)

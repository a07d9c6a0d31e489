"""The gRPC door: the ``kbroker.v1.Broker`` servicer and its server."""

"""The Kafka-protocol door (``kafka.listeners``): Kafka's binary protocol beside gRPC,
as a thin adapter over the same servicer. See :mod:`kbroker.api.kafka.server` for the
wire handling and :mod:`kbroker.api.kafka.apis` for what is served."""

"""The Kafka-protocol door (``kafka.listeners``): Kafka's binary protocol beside gRPC,
a thin codec over the core request layer (:mod:`kbroker.api`). See
:mod:`kbroker.doors.kafka.server` for the wire handling and :mod:`kbroker.doors.kafka.apis`
for what is served."""

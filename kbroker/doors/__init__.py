"""The doors: thin codecs over the core request layer (:mod:`kbroker.api`).

``grpc/`` serves the ``kbroker.v1`` protobuf contract, ``kafka/`` Kafka's binary protocol.
Each decodes its request, calls the core once and encodes the answer."""

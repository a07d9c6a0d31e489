"""A raw Kafka-protocol client for tests of the Kafka door: frames built with kio, sent
over a plain socket, so a test can send exactly the bytes it means (versions, garbage)."""

from __future__ import annotations

import io
import socket
from typing import Any

from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32

from kbroker.doors.kafka.codec import build, request_schema, response_class


class WireClient:
    """One connection; :meth:`call` sends a request and reads its response."""

    def __init__(self, address: str, timeout_s: float = 10.0) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self._correlation = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def frame(self, api_key: int, version: int, values: dict[str, Any], correlation_id: int | None = None) -> bytes:
        """The whole request frame (size prefix included)."""
        if correlation_id is None:
            self._correlation += 1
            correlation_id = self._correlation
        schema = request_schema(api_key, version)
        buf = io.BytesIO()
        header_cls = RequestHeaderV2 if schema.__flexible__ else RequestHeaderV1
        header = header_cls(
            request_api_key=i16(api_key),
            request_api_version=i16(version),
            correlation_id=i32(correlation_id),
            client_id="wire-test",
        )
        entity_writer(header_cls)(buf, header)  # type: ignore[arg-type]
        entity_writer(schema)(buf, build(schema, values))
        body = buf.getvalue()
        return len(body).to_bytes(4, "big") + body

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_frame(self) -> bytes:
        size = int.from_bytes(self._read(4), "big")
        return self._read(size)

    def _read(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            out += chunk
        return out

    def read_response(self, api_key: int, version: int) -> tuple[int, Any]:
        """(correlation id, response entity) of the next frame."""
        frame = self.read_frame()
        correlation = int.from_bytes(frame[0:4], "big", signed=True)
        schema = response_class(api_key, version)
        start = 5 if schema.__flexible__ and api_key != 18 else 4  # header v1: one empty tagged-field byte
        response, _ = entity_reader(schema)(frame, start)
        return correlation, response

    def call(self, api_key: int, version: int, values: dict[str, Any]) -> Any:
        self.send_raw(self.frame(api_key, version, values))
        _, response = self.read_response(api_key, version)
        return response

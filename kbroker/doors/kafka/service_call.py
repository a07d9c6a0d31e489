"""Calling the gRPC servicer's handlers from the Kafka door.

The Kafka-protocol APIs translate a Kafka request into the servicer's protobuf request,
await the same handler a gRPC call runs (validation, authorization, metrics and the core
calls all live there), and translate the protobuf response back. A handler that refuses
a whole request aborts its gRPC context; :class:`ServiceContext` turns that into
:class:`RequestRefused` carrying the Kafka error code the handler attached.

Thread safety: one context per call, on the loop thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NoReturn

import grpc

from kclient.errors import UnknownError
from kclient.transport import ERROR_CODE_METADATA_KEY

_STATUS_CODES = {
    grpc.StatusCode.UNAVAILABLE: 15,  # COORDINATOR_NOT_AVAILABLE's family: retriable, another broker
    grpc.StatusCode.DEADLINE_EXCEEDED: 7,  # REQUEST_TIMED_OUT
    grpc.StatusCode.RESOURCE_EXHAUSTED: 7,
}


class RequestRefused(Exception):
    """The servicer refused the whole request: ``errno`` is Kafka's code."""

    def __init__(self, errno: int, message: str, status: grpc.StatusCode) -> None:
        super().__init__(message)
        self.errno, self.message, self.status = errno, message, status


class ServiceContext:
    """The parts of ``grpc.aio.ServicerContext`` the servicer uses."""

    def __init__(self, peer: str = "") -> None:
        self._peer = peer
        self._errno: int | None = None

    def set_trailing_metadata(self, metadata: Sequence[tuple[str, str]]) -> None:
        for key, value in metadata:
            if key == ERROR_CODE_METADATA_KEY:
                self._errno = int(value)

    async def abort(self, code: grpc.StatusCode, details: str = "", *args: Any) -> NoReturn:
        errno = self._errno if self._errno is not None else _STATUS_CODES.get(code, UnknownError.errno)
        raise RequestRefused(errno, details, code)

    def peer(self) -> str:
        return self._peer

    def invocation_metadata(self) -> tuple[()]:
        return ()

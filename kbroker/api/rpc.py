"""What every RPC handler of the servicer shares: the ``blocking`` decorator (the body
runs on the request pool, in the call's context) and ``opt`` for proto3 ``optional``
fields."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

Offload = Callable[..., Awaitable[Any]]
"""Runs a blocking function on the request pool and awaits it (``GrpcServer.offload``)."""

R = TypeVar("R")


def blocking(handler: Callable[[Any, Any], R]) -> Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[R]]:
    """An RPC handler whose body blocks (ZooKeeper, disk): it runs on the request pool."""

    async def run(self: Any, request: Any, context: grpc.aio.ServicerContext) -> R:
        return await self._offload(handler, self, request)  # type: ignore[no-any-return]

    run.__name__ = handler.__name__
    run.__doc__ = handler.__doc__
    return run


def opt(msg: Any, name: str, default: Any) -> Any:
    """An ``optional`` proto field's value, or ``default`` when the sender left it unset."""
    return getattr(msg, name) if msg.HasField(name) else default

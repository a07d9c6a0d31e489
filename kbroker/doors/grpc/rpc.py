"""What every RPC handler of the servicer shares: the ``blocking`` decorator (the body
runs on the request pool, in the call's context), ``opt`` for proto3 ``optional``
fields and ``set_error`` for a response's error code."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc

from kclient.errors import BrokerResponseError
from kclient.transport import ERROR_CODE_METADATA_KEY

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


def set_error(msg: Any, err: BrokerResponseError) -> None:
    """Write ``err`` into a response message's ``error_code`` and ``error_message``."""
    msg.error_code = err.errno
    msg.error_message = err.message


async def abort(context: grpc.aio.ServicerContext, exc: BrokerResponseError) -> NoReturn:
    """Refuse the whole request: INVALID_ARGUMENT, ``exc``'s code in the trailing metadata."""
    context.set_trailing_metadata(((ERROR_CODE_METADATA_KEY, str(exc.errno)),))
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    raise AssertionError("context.abort returned")  # pragma: no cover

"""Which implementation of the hot loops runs: the compiled twin, or pure Python.

The compiled twin is ``kclient._crecords`` (kclient/_crecords.c, built by ``pip
install``). It is used unless it is missing or ``KBROKER_NO_EXTENSIONS`` is set to
anything but ``0``; then the pure-Python loops (:mod:`kclient.records.pyrecords`) run.
This module only finds the extension (and its CRC-32C, which the header checks and the
builder use) and says what an implementation provides (:class:`Codec`);
:mod:`kclient.records.twins` wires the loops of each implementation.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple

from crc32c import crc32c as _crc32c_package

from kclient.records.layout import Buffer
from kclient.records.record import Record, RecordColumns
from kclient.structs import ConsumerRecord


def _load() -> ModuleType | None:
    if os.environ.get("KBROKER_NO_EXTENSIONS", "") not in ("", "0"):
        return None
    try:
        return importlib.import_module("kclient._crecords")
    except ImportError:
        return None


EXTENSION: ModuleType | None = _load()
"""``kclient._crecords``, or None when pure Python runs."""

crc32c: Callable[..., int] = _crc32c_package if EXTENSION is None else EXTENSION.crc32c
"""CRC-32C (Castagnoli) of a buffer: ``crc32c(data, crc=0)``."""


class Codec(NamedTuple):
    """The hot loops of one implementation (signatures as in kclient/_crecords.c)."""

    name: str
    reads_buffers: bool  # decode_records takes any buffer (else bytes only)
    append_record: Callable[..., bool]
    record_size: Callable[..., int]
    encode_records: Callable[..., tuple[int, int]]
    decode_records: Callable[..., list[Record]]
    decode_consumer_records: Callable[..., list[ConsumerRecord]]
    decode_columns: Callable[[Buffer, int, RecordColumns | None], RecordColumns]
    decode_buffers: Callable[[Buffer, int, list[Any]], None]
    columns_of: Callable[[list[Any], int, int], tuple[list[Any], ...]]
    walk_records: Callable[[Buffer, int, int, int], int]

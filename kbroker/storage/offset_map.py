"""The log cleaner's map from record key to the last offset of that key (Kafka's SkimpyOffsetMap)."""

from __future__ import annotations

from hashlib import blake2b

BYTES_PER_ENTRY = 128
"""What one entry really costs here: a 16-byte hash as a bytes object, an int offset and
a dict slot (measured with tracemalloc on CPython 3.11: ~123 bytes). Kafka's map packs
24 bytes per entry into one array; counting the real cost keeps
``log.cleaner.dedupe.buffer.size`` a true bound on memory (the map holds ~5x fewer keys
than Kafka's of the same size, so very large key sets take more passes)."""
HASH_SIZE = 16
DEFAULT_LOAD_FACTOR = 0.9
"""Kafka's log.cleaner.io.buffer.load.factor: the share of the slots that may be filled."""


def key_hash(key: bytes) -> bytes:
    """The 16-byte hash a key is stored under (collisions are as unlikely as MD5's, as in Kafka)."""
    return blake2b(key, digest_size=HASH_SIZE).digest()


class OffsetMap:
    """key hash -> the largest offset seen for that key, bounded by a memory budget.

    ``memory`` bytes give ``memory // BYTES_PER_ENTRY`` slots, of which at most
    ``load_factor`` may be used (:attr:`max_entries`); :meth:`put` of a new key beyond
    that raises :class:`OverflowError`, so the caller checks :attr:`free` first. The map
    is a dict, counted at its real cost per entry, so it never holds more than ``memory``
    bytes (plus the dict's transient doubling while it grows).

    Thread safety: none (one cleaner thread owns one map).
    """

    __slots__ = ("_entries", "_latest_offset", "max_entries", "memory")

    def __init__(self, memory: int, load_factor: float = DEFAULT_LOAD_FACTOR) -> None:
        if memory < BYTES_PER_ENTRY:
            raise ValueError(f"an offset map needs at least {BYTES_PER_ENTRY} bytes, not {memory}")
        if not 0.0 < load_factor <= 1.0:
            raise ValueError(f"load factor must be in (0, 1], not {load_factor}")
        self.memory = memory
        self.max_entries = max(int(memory // BYTES_PER_ENTRY * load_factor), 1)
        self._entries: dict[bytes, int] = {}
        self._latest_offset = -1

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def free(self) -> int:
        """Entries that can still be added."""
        return self.max_entries - len(self._entries)

    @property
    def latest_offset(self) -> int:
        """The largest offset put since the last clear, -1 if none."""
        return self._latest_offset

    def put(self, key: bytes, offset: int) -> None:
        """Remember ``offset`` as the latest of ``key`` (offsets are put in increasing order)."""
        self.put_hash(key_hash(key), offset)

    def get(self, key: bytes) -> int:
        """The latest offset of ``key``, -1 if it is not in the map."""
        return self._entries.get(key_hash(key), -1)

    def put_hash(self, h: bytes, offset: int) -> None:
        """:meth:`put` with the key's hash already computed."""
        entries = self._entries
        if h not in entries and len(entries) >= self.max_entries:
            raise OverflowError(f"offset map full ({self.max_entries} entries)")
        entries[h] = offset
        if offset > self._latest_offset:
            self._latest_offset = offset

    def get_hash(self, h: bytes) -> int:
        return self._entries.get(h, -1)

    def contains_hash(self, h: bytes) -> bool:
        return h in self._entries

    def clear(self) -> None:
        self._entries.clear()
        self._latest_offset = -1

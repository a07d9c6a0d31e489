"""Kafka's topic-name rules, checked identically by client and broker."""

from __future__ import annotations

import re

from kclient.errors import InvalidTopicError

MAX_NAME_LENGTH = 249
_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")


def validate_topic_name(name: str) -> None:
    """Raise :class:`InvalidTopicError` unless ``name`` is a legal topic name.

    Legal: 1-249 characters of ``[a-zA-Z0-9._-]``, and not ``.`` or ``..``.
    """
    if not name:
        raise InvalidTopicError("topic name is empty")
    if name in (".", ".."):
        raise InvalidTopicError(f"topic name cannot be {name!r}")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidTopicError(f"topic name is {len(name)} characters long, the limit is {MAX_NAME_LENGTH}")
    if not _LEGAL.fullmatch(name):
        raise InvalidTopicError(
            f"topic name {name!r} is illegal: only ASCII letters, digits, '.', '_' and '-' are allowed"
        )

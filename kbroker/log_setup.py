"""The broker's own logging: level, an optional rotating log file, rate-limited warnings.

Kafka configures its logging with ``log4j.properties``, not ``server.properties``; kbroker
has no log4j, so it takes four broker settings of its own (no Kafka key has these names;
Kafka's other ``log.*`` keys are about the data logs):

* ``log.level`` (default ``INFO``; ``--log-level`` on the command line wins): DEBUG, INFO,
  WARNING (or WARN), ERROR or CRITICAL, for kbroker's (and kclient's) loggers. kazoo stays
  at WARNING unless DEBUG is asked.
* ``log.file`` (default none): also write the log to this file, rotated by
  :class:`logging.handlers.RotatingFileHandler` once it reaches ``log.file.max.bytes``
  (default 100 MiB), keeping ``log.file.backups`` old files (default 10; ``FILE.1`` the
  newest).

The log always goes to stderr as well (``scripts/run`` and the test harness capture it);
the ``kbroker N listening on ...`` ready line stays on stdout.

Every line starts with a timestamp, the level, the thread and the logger, so that
``grep`` over the logs of a failover tells its story in order.
"""

from __future__ import annotations

import logging
import logging.handlers
import sys
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path

from kclient.errors import InvalidConfigError

LOG_FORMAT = "%(asctime)s %(levelname)s [%(threadName)s] %(name)s: %(message)s"
LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING, "WARNING": logging.WARNING}
LEVELS |= {"ERROR": logging.ERROR, "CRITICAL": logging.CRITICAL, "FATAL": logging.CRITICAL}
DEFAULT_FILE_MAX_BYTES = 100 * 1024 * 1024
DEFAULT_FILE_BACKUPS = 10
QUIET_LOGGERS = ("kazoo",)
"""Third-party loggers held at WARNING unless the level is DEBUG."""


def parse_level(key: str, value: str) -> str:
    """A level name (any case; WARN and FATAL as log4j spells them) -> its canonical name."""
    name = value.strip().upper()
    if name not in LEVELS:
        raise InvalidConfigError(f"{key}: {value!r} is not one of DEBUG, INFO, WARN, ERROR")
    return logging.getLevelName(LEVELS[name])


@dataclass(frozen=True)
class LoggingConfig:
    """The ``log.level`` / ``log.file*`` settings."""

    level: str = "INFO"
    file: Path | None = None
    file_max_bytes: int = DEFAULT_FILE_MAX_BYTES
    file_backups: int = DEFAULT_FILE_BACKUPS


_installed: list[logging.Handler] = []


def configure(config: LoggingConfig, stream: object | None = None) -> None:
    """Install the handlers on the root logger (replacing those an earlier call installed)."""
    root = logging.getLogger()
    for handler in _installed:
        root.removeHandler(handler)
        handler.close()
    _installed.clear()
    formatter = logging.Formatter(LOG_FORMAT)
    handlers: list[logging.Handler] = [logging.StreamHandler(stream or sys.stderr)]  # type: ignore[arg-type]
    if config.file is not None:
        config.file.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(
            logging.handlers.RotatingFileHandler(
                config.file, maxBytes=config.file_max_bytes, backupCount=config.file_backups, encoding="utf-8"
            )
        )
    for handler in handlers:
        handler.setFormatter(formatter)
        root.addHandler(handler)
        _installed.append(handler)
    level = LEVELS[config.level]
    root.setLevel(level)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(level if level <= logging.DEBUG else max(level, logging.WARNING))


class RateLimiter:
    """At most one event per key every ``interval_s``; counts the ones it holds back.

    ``allow(key)`` returns None while the key is held back, else how many events of that
    key were held back since the last one allowed (0 the first time). Thread safe.
    """

    def __init__(self, interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[Hashable, float] = {}
        self._suppressed: dict[Hashable, int] = {}

    def allow(self, key: Hashable) -> int | None:
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval_s:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return None
            self._last[key] = now
            return self._suppressed.pop(key, 0)

    def reset(self, key: Hashable) -> int:
        """Forget ``key`` (its trouble is over); returns how many were held back."""
        with self._lock:
            self._last.pop(key, None)
            return self._suppressed.pop(key, 0)

"""kbroker: the broker, kctl and the local cluster (the client is :mod:`kclient`)."""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "kbroker"


def version() -> str:
    """The installed distribution's version: pyproject.toml's ``version``, its one definition
    (``kbroker --version`` and ``kctl --version`` print it). A source tree that was never
    installed (no metadata) gives ``0+unknown``."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "0+unknown"

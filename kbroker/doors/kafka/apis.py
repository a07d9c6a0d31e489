"""The Kafka APIs this door serves, and ApiVersions, which advertises exactly them.

Each API module (``log_apis``, ...) contributes :class:`~kbroker.doors.kafka.server.Api`
entries: API key, name, the version range served and the handler. :func:`api_table`
assembles them; ApiVersions answers from the same table, so what is advertised is what
is implemented. A request outside the table gets UNSUPPORTED_VERSION (35): for an API
and version kio has a schema for, that version's response with the code in its
top-level ``error_code`` (when the version has one); otherwise a bare
``correlation id + int16 35`` (Kafka's ApiVersions v0 prefix). An ApiVersions request
of a version not served gets a v0 response listing every API, as Kafka answers it.
"""

from __future__ import annotations

from collections.abc import Iterable

from kbroker.doors.kafka.codec import API_VERSIONS_KEY, Header, build, encode_response, response_class
from kbroker.doors.kafka.server import Api, KafkaRequest
from kclient.errors import UnsupportedVersionError

UNSUPPORTED_VERSION = UnsupportedVersionError.errno


class ApiTable:
    """API key -> :class:`Api`, plus ApiVersions over it. Immutable after construction."""

    def __init__(self, apis: Iterable[Api]) -> None:
        table = {a.key: a for a in apis}
        table[API_VERSIONS_KEY] = Api(API_VERSIONS_KEY, "ApiVersions", 0, 3, self._api_versions)
        self.apis = table

    def _listing(self) -> list[dict[str, int]]:
        return [
            {"api_key": a.key, "min_version": a.min_version, "max_version": a.max_version}
            for a in sorted(self.apis.values(), key=lambda a: a.key)
        ]

    async def _api_versions(self, req: KafkaRequest) -> object:
        return build(response_class(API_VERSIONS_KEY, req.version), {"error_code": 0, "api_keys": self._listing()})

    def unsupported(self, header: Header) -> bytes:
        """The response frame for a request whose API or version is not served."""
        if header.api_key == API_VERSIONS_KEY:
            v0 = build(
                response_class(API_VERSIONS_KEY, 0), {"error_code": UNSUPPORTED_VERSION, "api_keys": self._listing()}
            )
            return encode_response(header.correlation_id, v0)
        try:
            cls = response_class(header.api_key, header.api_version)
            return encode_response(header.correlation_id, build(cls, {"error_code": UNSUPPORTED_VERSION}))
        except Exception:  # an API or version kio has no schema for
            body = header.correlation_id.to_bytes(4, "big", signed=True) + UNSUPPORTED_VERSION.to_bytes(2, "big")
            return len(body).to_bytes(4, "big") + body

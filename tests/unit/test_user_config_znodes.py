"""``/config/users/<user>`` as Kafka stores it: sanitized names, the users notification."""

from __future__ import annotations

import json

import pytest

from kbroker.cluster import zkdata
from kclient.errors import InvalidRequestError


def test_user_names_are_sanitized_as_kafkas_sanitizer() -> None:
    # Kafka: Sanitizer.sanitize = URLEncoder (UTF-8) with '*' -> %2A and '+' (space) -> %20.
    cases = {
        "alice": "alice",
        "a.b_c-d": "a.b_c-d",
        "alice@EXAMPLE.COM": "alice%40EXAMPLE.COM",
        "CN=alice,OU=eng": "CN%3Dalice%2COU%3Deng",
        "a b*c~": "a%20b%2Ac%7E",
        "a/b": "a%2Fb",
        "é": "%C3%A9",
        ".": "%2E",
        "..": "%2E%2E",
    }
    for name, segment in cases.items():
        assert zkdata.sanitize(name) == segment
        assert zkdata.desanitize(segment) == name
        assert zkdata.user_config_path(name) == f"/config/users/{segment}"
        assert zkdata.entity_config_path("users", name) == f"/config/users/{segment}"
    assert zkdata.desanitize("a+b") == "a b"  # URLDecoder
    with pytest.raises(InvalidRequestError):
        zkdata.user_config_path("")
    with pytest.raises(InvalidRequestError):
        zkdata.user_config_path("u" * (zkdata.MAX_USER_NAME_LENGTH + 1))


def test_users_change_notification_round_trip() -> None:
    assert json.loads(zkdata.encode_config_change("users", "alice@X")) == {
        "version": 2,
        "entity_path": "users/alice%40X",
    }
    for name in ("alice", "alice@X", "CN=a,OU=b", "é ", "."):
        assert zkdata.decode_config_change(zkdata.encode_config_change("users", name)) == ("users", name)
    assert zkdata.decode_config_change(b'{"version":2,"entity_path":"users/u"}') == ("users", "u")
    assert zkdata.decode_config_change(b'{"version":1,"entity_type":"users","entity_name":"u"}') == ("users", "u")
    assert "users" in zkdata.ENTITY_TYPES
    with pytest.raises(InvalidRequestError):
        zkdata.decode_config_change(b'{"version":2,"entity_path":"users/"}')
    with pytest.raises(InvalidRequestError):
        zkdata.decode_config_change(b'{"version":2,"entity_path":"clients/c"}')

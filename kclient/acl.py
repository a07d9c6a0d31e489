"""Kafka's ACL enums with their numeric codes (``org.apache.kafka.common.acl`` and
``org.apache.kafka.common.resource``), the codes ``protos/kbroker/v1/security.proto``
carries: shared by the client (AdminClient's ACL methods) and the broker's authorizer.

``.camel`` is Kafka's mixed-case name (``DescribeConfigs``: znodes, kafka-acls.sh);
``.parse`` reads it back, or the upper-case or dashed form.
"""

from __future__ import annotations

from enum import IntEnum
from typing import TypeVar

from kclient.errors import InvalidRequestError

E = TypeVar("E", bound="_KafkaEnum")


class _KafkaEnum(IntEnum):
    @property
    def camel(self) -> str:
        """Kafka's mixed-case name (``DESCRIBE_CONFIGS`` -> ``DescribeConfigs``): znodes and the tool."""
        return "".join(part.capitalize() for part in self.name.split("_"))

    @classmethod
    def parse(cls: type[E], text: str) -> E:
        """``"DescribeConfigs"``, ``"DESCRIBE_CONFIGS"``, ``"describe-configs"`` -> the member.

        InvalidRequestError, naming the accepted values, when nothing matches.
        """
        key = text.strip().replace("_", "").replace("-", "").upper()
        for member in cls:
            if member.name.replace("_", "") == key:
                return member
        names = ", ".join(m.camel for m in cls if m.name != "UNKNOWN")
        raise InvalidRequestError(f"unknown {cls._what()} {text!r}; expected one of {names}")

    @classmethod
    def _what(cls) -> str:
        return cls.__name__


class ResourceType(_KafkaEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6

    @property
    def znode_name(self) -> str:
        """The child of ``/kafka-acl`` holding this type's resources (``Topic``, ``TransactionalId``)."""
        return self.camel

    @classmethod
    def _what(cls) -> str:
        return "resource type"


class PatternType(_KafkaEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4

    @property
    def is_specific(self) -> bool:
        """LITERAL or PREFIXED: a pattern that can be stored."""
        return self in (PatternType.LITERAL, PatternType.PREFIXED)

    @classmethod
    def _what(cls) -> str:
        return "resource pattern type"


class AclOperation(_KafkaEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12

    @classmethod
    def _what(cls) -> str:
        return "operation"


class AclPermissionType(_KafkaEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3

    @classmethod
    def _what(cls) -> str:
        return "permission type"

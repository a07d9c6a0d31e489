"""``KafkaPrincipal``: who is making a call, as Kafka names it (``User:alice``)."""

from __future__ import annotations

from dataclasses import dataclass

from kclient.errors import InvalidRequestError


@dataclass(frozen=True, slots=True)
class KafkaPrincipal:
    """A principal ``<type>:<name>``, e.g. ``User:alice`` or ``User:CN=alice,OU=eng``.

    Immutable and hashable. ``str()`` gives the form ACLs and ``super.users`` use;
    :meth:`parse` reads it back (split at the first ``':'``, so names may hold colons).
    """

    type: str
    name: str

    USER_TYPE = "User"

    def __str__(self) -> str:
        return f"{self.type}:{self.name}"

    @classmethod
    def parse(cls, text: str) -> KafkaPrincipal:
        """``"User:alice"`` -> ``KafkaPrincipal("User", "alice")``.

        Raises ``InvalidRequestError`` when there is no ``':'`` or the type is empty.
        """
        kind, sep, name = text.partition(":")
        if not sep or not kind:
            raise InvalidRequestError(f"principal {text!r} is not in the form <type>:<name> (e.g. User:alice)")
        return cls(kind, name)

    @classmethod
    def user(cls, name: str) -> KafkaPrincipal:
        return cls(cls.USER_TYPE, name)


ANONYMOUS = KafkaPrincipal(KafkaPrincipal.USER_TYPE, "ANONYMOUS")
"""The principal of a call that carries no SASL session and no client certificate."""

WILDCARD_PRINCIPAL = KafkaPrincipal(KafkaPrincipal.USER_TYPE, "*")
"""``User:*``: an ACL for it applies to every user."""

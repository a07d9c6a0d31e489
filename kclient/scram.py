"""SCRAM (RFC 5802, RFC 7677) as Kafka implements it: mechanisms, credentials, and the
server and client state machines of one exchange.

Kafka's exchange (``ScramSaslServer`` / ``ScramSaslClient``)::

    client-first  n,[a=<authzid>],n=<user>,r=<client nonce>[,<extensions>]
    server-first  r=<client nonce><server nonce>,s=<b64 salt>,i=<iterations>
    client-final  c=<b64 gs2 header>,r=<nonce>,p=<b64 ClientProof>
    server-final  v=<b64 ServerSignature>

    SaltedPassword  = Hi(password, salt, iterations)          (PBKDF2-HMAC)
    ClientKey       = HMAC(SaltedPassword, "Client Key")
    StoredKey       = H(ClientKey)
    ServerKey       = HMAC(SaltedPassword, "Server Key")
    AuthMessage     = client-first-bare + "," + server-first + "," + client-final-without-proof
    ClientProof     = ClientKey XOR HMAC(StoredKey, AuthMessage)
    ServerSignature = HMAC(ServerKey, AuthMessage)

The server keeps only ``ScramCredential`` (salt, StoredKey, ServerKey, iterations), never
the password; its string form is Kafka's ``ScramCredentialUtils`` one,
``salt=<b64>,stored_key=<b64>,server_key=<b64>,iterations=<n>``. As Kafka, passwords are
used as their UTF-8 bytes (no SASLprep), channel binding is not supported (gs2 header
``n,,`` or ``n,a=<authzid>,``), an authorization id must equal the user name, and
iterations are 4096..16384.

Only the standard library is imported, so the client (kclient) can use this module as is.
Thread safety: credentials and mechanisms are immutable; one ``ScramServer`` or
``ScramClient`` object serves one exchange and is not thread-safe.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum


class ScramError(Exception):
    """Base of every SCRAM failure."""


class ScramFormatError(ScramError):
    """A SCRAM message, or a credential string, is malformed."""


class ScramAuthenticationError(ScramError):
    """The exchange is refused: unknown user, wrong password (proof), nonce or channel
    binding mismatch, authorization id other than the user, or (client side) a server
    that could not prove it knows the credential."""


class ScramStateError(ScramError):
    """A message arrived in the wrong state (e.g. after the exchange completed)."""


class ScramCredentialError(ScramError):
    """A credential cannot be made: iterations out of bounds, empty password."""


class ScramMechanism(Enum):
    """The two SCRAM mechanisms Kafka supports; the value is the SASL mechanism name."""

    SCRAM_SHA_256 = "SCRAM-SHA-256"
    SCRAM_SHA_512 = "SCRAM-SHA-512"

    @property
    def mechanism_name(self) -> str:
        return self.value

    @property
    def hash_name(self) -> str:
        return "sha256" if self is ScramMechanism.SCRAM_SHA_256 else "sha512"

    @property
    def min_iterations(self) -> int:
        return 4096

    @property
    def max_iterations(self) -> int:
        return 16384

    @classmethod
    def from_name(cls, name: str) -> ScramMechanism | None:
        """``"SCRAM-SHA-256"`` -> the mechanism; ``None`` for any other name."""
        for mechanism in cls:
            if mechanism.value == name:
                return mechanism
        return None

    def check_iterations(self, iterations: int) -> None:
        """ScramCredentialError unless ``min_iterations <= iterations <= max_iterations``."""
        if iterations < self.min_iterations:
            raise ScramCredentialError(
                f"Iterations {iterations} is less than the minimum {self.min_iterations} required for {self.value}"
            )
        if iterations > self.max_iterations:
            raise ScramCredentialError(
                f"Iterations {iterations} is more than the maximum {self.max_iterations} allowed for {self.value}"
            )

    # --- the RFC 5802 functions ---------------------------------------------------------

    def hash(self, data: bytes) -> bytes:
        return hashlib.new(self.hash_name, data).digest()

    def hmac(self, key: bytes, data: bytes) -> bytes:
        return hmac.new(key, data, self.hash_name).digest()

    def salted_password(self, password: str, salt: bytes, iterations: int) -> bytes:
        """``Hi(password, salt, i)``: PBKDF2-HMAC with the mechanism's hash (UTF-8 password)."""
        return hashlib.pbkdf2_hmac(self.hash_name, password.encode("utf-8"), salt, iterations)

    def client_key(self, salted_password: bytes) -> bytes:
        return self.hmac(salted_password, b"Client Key")

    def stored_key(self, client_key: bytes) -> bytes:
        return self.hash(client_key)

    def server_key(self, salted_password: bytes) -> bytes:
        return self.hmac(salted_password, b"Server Key")


@dataclass(frozen=True)
class ScramCredential:
    """What the server stores for one (user, mechanism): never the password.

    Immutable; ``str()`` and :meth:`parse` are Kafka's ``ScramCredentialUtils`` string form.
    """

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def __str__(self) -> str:
        return (
            f"salt={_b64(self.salt)},stored_key={_b64(self.stored_key)},"
            f"server_key={_b64(self.server_key)},iterations={self.iterations}"
        )

    def __repr__(self) -> str:
        return f"ScramCredential(iterations={self.iterations})"  # keys stay out of logs

    @classmethod
    def parse(cls, text: str) -> ScramCredential:
        """Kafka's string form back to a credential; ScramFormatError if malformed."""
        fields: dict[str, str] = {}
        for item in text.split(","):
            key, eq, value = item.partition("=")
            if not eq:
                raise ScramFormatError(f"malformed SCRAM credential: item {key[:20]!r} has no '='")
            fields[key.strip()] = value.strip()
        missing = {"salt", "stored_key", "server_key", "iterations"} - set(fields)
        if missing:
            raise ScramFormatError(f"malformed SCRAM credential: missing {', '.join(sorted(missing))}")
        if not fields["iterations"].isascii() or not fields["iterations"].isdigit():
            raise ScramFormatError("malformed SCRAM credential: iterations is not a number")
        return cls(
            salt=_unb64(fields["salt"], "salt"),
            stored_key=_unb64(fields["stored_key"], "stored_key"),
            server_key=_unb64(fields["server_key"], "server_key"),
            iterations=int(fields["iterations"]),
        )


SALT_BYTES = 32


def credential_from_salted_password(
    mechanism: ScramMechanism, salt: bytes, salted_password: bytes, iterations: int
) -> ScramCredential:
    """The credential for a salted password (what Kafka's AlterUserScramCredentials sends)."""
    mechanism.check_iterations(iterations)
    if not salt:
        raise ScramCredentialError("the salt is empty")
    return ScramCredential(
        salt=salt,
        stored_key=mechanism.stored_key(mechanism.client_key(salted_password)),
        server_key=mechanism.server_key(salted_password),
        iterations=iterations,
    )


def generate_credential(
    mechanism: ScramMechanism, password: str, iterations: int = 4096, salt: bytes | None = None
) -> ScramCredential:
    """A new credential for ``password`` with a random salt (``salt`` for tests)."""
    mechanism.check_iterations(iterations)
    if not password:
        raise ScramCredentialError("the password is empty")
    salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
    return credential_from_salted_password(
        mechanism, salt, mechanism.salted_password(password, salt, iterations), iterations
    )


def password_matches(mechanism: ScramMechanism, credential: ScramCredential, password: str) -> bool:
    """Does ``password`` produce ``credential``'s keys? (SASL/PLAIN against SCRAM credentials.)

    Costs one PBKDF2 of ``credential.iterations``; compares in constant time.
    """
    salted = mechanism.salted_password(password, credential.salt, credential.iterations)
    return hmac.compare_digest(mechanism.stored_key(mechanism.client_key(salted)), credential.stored_key)


# --- message syntax --------------------------------------------------------------------

_NONCE = re.compile(r"[\x21-\x2b\x2d-\x7e]+")
"""printable ASCII except ',' (RFC 5802 ``printable``)."""
_SASLNAME = re.compile(r"(?:[^=,]|=2C|=3D)+")
_CLIENT_FIRST = re.compile(
    r"n,(?:a=(?P<authzid>[^,]+))?,(?P<bare>n=(?P<saslname>[^,]*),r=(?P<nonce>[^,]*)(?P<extensions>(?:,.*)?))"
)
_SERVER_FIRST = re.compile(r"(?:m=[^,]*,)?r=(?P<nonce>[^,]+),s=(?P<salt>[^,]+),i=(?P<iterations>[0-9]+)(?:,.*)?")
_CLIENT_FINAL = re.compile(
    r"(?P<without_proof>c=(?P<binding>[^,]*),r=(?P<nonce>[^,]*)(?:,(?!p=)[^,]*)*),p=(?P<proof>[^,]+)"
)
_SERVER_FINAL = re.compile(r"(?:e=(?P<error>[^,]*)|v=(?P<signature>[^,]+))(?:,.*)?")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        raise ScramFormatError(f"{what} is not valid base64") from None


def _decode(message: bytes, what: str) -> str:
    try:
        return message.decode("utf-8")
    except UnicodeDecodeError:
        raise ScramFormatError(f"the {what} is not UTF-8") from None


def escape_saslname(name: str) -> str:
    """RFC 5802 ``saslname``: ``=`` -> ``=3D``, ``,`` -> ``=2C``."""
    return name.replace("=", "=3D").replace(",", "=2C")


def unescape_saslname(name: str) -> str:
    if not _SASLNAME.fullmatch(name):
        raise ScramFormatError(f"invalid SCRAM user name {name[:50]!r}")
    return name.replace("=2C", ",").replace("=3D", "=")


def new_nonce() -> str:
    """A random nonce: 32 URL-safe base64 characters (no ',')."""
    return secrets.token_urlsafe(24)


def _extensions(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        out[key] = value
    return out


# --- server ----------------------------------------------------------------------------

CredentialLookup = Callable[[str], ScramCredential | None]
"""user name -> that user's credential for the server's mechanism, or None."""


class ScramServer:
    """The server side of one SCRAM exchange (Kafka's ``ScramSaslServer``).

    ``evaluate(client_first)`` returns the server-first message; ``evaluate(client_final)``
    returns the server-final message and completes the exchange (``complete`` is then
    True and ``username`` is the authenticated user). Any failure raises a
    :class:`ScramError` and leaves the exchange failed: it cannot be continued.
    """

    def __init__(self, mechanism: ScramMechanism, lookup: CredentialLookup, *, nonce: str | None = None) -> None:
        self.mechanism = mechanism
        self._lookup = lookup
        self._server_nonce = nonce or new_nonce()
        self._state = "first"
        self._username = ""
        self._credential: ScramCredential | None = None
        self._client_first_bare = ""
        self._server_first = ""
        self._gs2_header = ""
        self._nonce = ""
        self._client_nonce = ""

    @property
    def complete(self) -> bool:
        return self._state == "complete"

    @property
    def username(self) -> str:
        """The authenticated user; only once :attr:`complete`."""
        if not self.complete:
            raise ScramStateError("the SCRAM exchange is not complete")
        return self._username

    @property
    def credential(self) -> ScramCredential:
        """The credential the exchange was verified against; only once :attr:`complete`."""
        if not self.complete or self._credential is None:
            raise ScramStateError("the SCRAM exchange is not complete")
        return self._credential

    def evaluate(self, response: bytes) -> bytes:
        state, self._state = self._state, "failed"  # any exception leaves it failed
        if state == "first":
            out = self._client_first(_decode(response, "client-first message"))
            self._state = "final"
            return out
        if state == "final":
            out = self._client_final(_decode(response, "client-final message"))
            self._state = "complete"
            return out
        raise ScramStateError(f"unexpected SCRAM message: the exchange is {state}")

    def _client_first(self, text: str) -> bytes:
        m = _CLIENT_FIRST.fullmatch(text)
        if m is None:
            raise ScramFormatError("invalid SCRAM client-first message (only channel binding 'n' is supported)")
        username = unescape_saslname(m["saslname"])
        if not _NONCE.fullmatch(m["nonce"]):
            raise ScramFormatError("invalid nonce in the SCRAM client-first message")
        if m["authzid"] is not None and unescape_saslname(m["authzid"]) != username:
            raise ScramAuthenticationError(
                "Authentication failed: Client requested an authorization id that is different from username"
            )
        if _extensions(m["extensions"]).get("tokenauth", "false").lower() == "true":
            raise ScramAuthenticationError("Authentication failed: delegation tokens are not supported")
        credential = self._lookup(username)
        if credential is None:
            raise ScramAuthenticationError("Authentication failed: Invalid user credentials")
        self._username, self._credential = username, credential
        self._gs2_header = text[: m.start("bare")]
        self._client_first_bare = m["bare"]
        self._client_nonce = m["nonce"]
        self._nonce = m["nonce"] + self._server_nonce
        self._server_first = f"r={self._nonce},s={_b64(credential.salt)},i={credential.iterations}"
        return self._server_first.encode("ascii")

    def _client_final(self, text: str) -> bytes:
        m = _CLIENT_FINAL.fullmatch(text)
        if m is None:
            raise ScramFormatError("invalid SCRAM client-final message")
        # RFC 5802: the combined nonce, echoed. Older librdkafka (Debian's 2.0.2, not 2.16)
        # sends its own nonce again in front of it, which Kafka 2.x-3.x accepted (its check
        # was ``endsWith``); that one form is accepted too (the proof covers what was sent).
        sent = m["nonce"].encode("utf-8")
        combined = self._nonce.encode("utf-8")
        doubled = (self._client_nonce + self._nonce).encode("utf-8")
        if not (hmac.compare_digest(sent, combined) or hmac.compare_digest(sent, doubled)):
            raise ScramAuthenticationError("Invalid client nonce in the final client message.")
        if _unb64(m["binding"], "channel binding") != self._gs2_header.encode("utf-8"):
            raise ScramAuthenticationError("Invalid channel binding in the final client message.")
        assert self._credential is not None
        mech, credential = self.mechanism, self._credential
        auth_message = f"{self._client_first_bare},{self._server_first},{m['without_proof']}".encode()
        proof = _unb64(m["proof"], "client proof")
        signature = mech.hmac(credential.stored_key, auth_message)
        if len(proof) != len(signature):
            raise ScramAuthenticationError("Invalid client credentials")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(mech.stored_key(client_key), credential.stored_key):
            raise ScramAuthenticationError("Invalid client credentials")
        return f"v={_b64(mech.hmac(credential.server_key, auth_message))}".encode("ascii")


# --- client ----------------------------------------------------------------------------


class ScramClient:
    """The client side of one SCRAM exchange (Kafka's ``ScramSaslClient``)::

        first = client.first_message()
        final = client.final_message(server_first)
        client.verify_server_final(server_final)   # ScramAuthenticationError if the server lied

    The server's iteration count must be at least the mechanism's minimum (4096).
    """

    def __init__(self, mechanism: ScramMechanism, username: str, password: str, *, nonce: str | None = None) -> None:
        if not username:
            raise ScramCredentialError("the SCRAM user name is empty")
        self.mechanism = mechanism
        self._username = username
        self._password = password
        self._nonce = nonce or new_nonce()
        self._state = "first"
        self._client_first_bare = ""
        self._server_signature = b""

    def first_message(self) -> bytes:
        if self._state != "first":
            raise ScramStateError("first_message() was already called")
        self._state = "final"
        self._client_first_bare = f"n={escape_saslname(self._username)},r={self._nonce}"
        return f"n,,{self._client_first_bare}".encode()

    def final_message(self, server_first: bytes) -> bytes:
        if self._state != "final":
            raise ScramStateError("final_message() needs first_message() first, once")
        self._state = "failed"
        text = _decode(server_first, "server-first message")
        m = _SERVER_FIRST.fullmatch(text)
        if m is None:
            raise ScramFormatError("invalid SCRAM server-first message")
        nonce, iterations = m["nonce"], int(m["iterations"])
        if not nonce.startswith(self._nonce) or len(nonce) == len(self._nonce):
            raise ScramAuthenticationError("Invalid server nonce: does not start with client nonce")
        if iterations < self.mechanism.min_iterations:
            raise ScramAuthenticationError(
                f"Requested iterations {iterations} is less than the minimum {self.mechanism.min_iterations} "
                f"for {self.mechanism.value}"
            )
        mech = self.mechanism
        salted = mech.salted_password(self._password, _unb64(m["salt"], "salt"), iterations)
        without_proof = f"c={_b64(b'n,,')},r={nonce}"
        auth_message = f"{self._client_first_bare},{text},{without_proof}".encode()
        client_key = mech.client_key(salted)
        signature = mech.hmac(mech.stored_key(client_key), auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_signature = mech.hmac(mech.server_key(salted), auth_message)
        self._state = "verify"
        return f"{without_proof},p={_b64(proof)}".encode("ascii")

    def verify_server_final(self, server_final: bytes) -> None:
        if self._state != "verify":
            raise ScramStateError("verify_server_final() needs final_message() first, once")
        self._state = "failed"
        m = _SERVER_FINAL.fullmatch(_decode(server_final, "server-final message"))
        if m is None:
            raise ScramFormatError("invalid SCRAM server-final message")
        if m["error"] is not None:
            raise ScramAuthenticationError(f"Sasl authentication using {self.mechanism.value} failed: {m['error']}")
        if not hmac.compare_digest(_unb64(m["signature"], "server signature"), self._server_signature):
            raise ScramAuthenticationError("Invalid server signature in server final message")
        self._state = "complete"

    @property
    def complete(self) -> bool:
        return self._state == "complete"

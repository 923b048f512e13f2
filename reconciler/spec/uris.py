"""RabbitMQ stream URIs, split without resolving a reference: the one parser that
validation, the planner (the source's identity) and the client share.

``rabbitmq-stream[+tls]://user:password@host:port/vhost``. References (``${env:..}``,
``${file:..}``) may stand anywhere in the user information; they are masked before the URI
is split (a value may hold any character) and handed back unresolved, so a spec that
validates is one the client can open, and the planner never reads a secret.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

SCHEMES = ("rabbitmq-stream", "rabbitmq-stream+tls")
_REF = re.compile(r"\$\{(?:env|file):[^}]+\}")


class UriInvalid(ValueError):
    """The URI cannot be opened; the message says why (never the password)."""


@dataclass(frozen=True)
class StreamUri:
    """A split URI: user and password still hold ``REFERENCE<n>X`` for each reference."""

    host: str
    port: int
    vhost: str
    tls: bool
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    references: tuple[str, ...] = field(default=(), repr=False)


def split_stream_uri(uri: str) -> StreamUri:
    """The parts of a stream URI, or ``UriInvalid`` naming what is wrong."""
    refs: list[str] = []

    def hide(m: re.Match[str]) -> str:
        refs.append(m.group(0))
        return f"REFERENCE{len(refs) - 1}X"

    masked = _REF.sub(hide, uri)
    try:
        parts = urlsplit(masked)
        port = parts.port
        host = parts.hostname
    except ValueError as exc:
        raise UriInvalid(parse_problem(exc)) from None
    if parts.scheme not in SCHEMES:
        raise UriInvalid("the scheme must be rabbitmq-stream:// or rabbitmq-stream+tls://")
    if not host:
        raise UriInvalid("no host")
    tls = parts.scheme.endswith("+tls")
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    return StreamUri(host=host, port=port or (5551 if tls else 5552), vhost=unquote(path) if path else "/",
                     tls=tls, username=parts.username, password=parts.password, references=tuple(refs))


def parse_problem(exc: BaseException) -> str:
    """What is wrong with a URI urllib refused, in words of our own. urllib's own text quotes
    the URI's parts: the whole ``user:password@host`` for a character that NFKC-normalizes to
    a delimiter (a fullwidth ＠ in a password), a piece of the password as the "port" when the
    password holds a ``/``. Its text is never shown, whatever its wording."""
    text = str(exc)
    if "IPv6" in text:
        return "Invalid IPv6 URL: a '[' host without its ']'"
    if "out of range" in text:
        return "the port is out of range 0-65535"
    if "could not be cast" in text:
        return ("the port could not be cast to a number (a '/', '?' or '#' in the user or password must be "
                "percent-encoded)")
    if "NFKC" in text:
        return ("the user information or host holds a character that stands for a delimiter under NFKC "
                "normalization (such as a fullwidth ＠ or ／): percent-encode it, or use a ${file:} reference")
    return "it cannot be parsed"


def identity(uri: str) -> tuple[str, str]:
    """(host, vhost) of a stream URI, the same for every spelling of one server (the port and
    the credentials are not part of it); a URI that cannot be split at all is its own
    identity (validation refuses it before it is ever planned)."""
    try:
        parts = urlsplit("//" + _REF.sub("x", uri).split("://", 1)[-1])
        host = (parts.hostname or "").lower()
    except ValueError:  # refused by validation before it is planned; shown without its user information
        scheme, _, rest = uri.partition("://")
        return (f"unparseable {scheme}://***@{_after_userinfo(rest)}", "")
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    return host, unquote(path) if path else "/"


def _after_userinfo(rest: str) -> str:
    """What follows the last character that is, or normalizes to, an ``@``: never a password."""
    at = max((i for i, c in enumerate(rest) if "@" in unicodedata.normalize("NFKC", c)), default=-1)
    return rest[at + 1:]

"""RabbitMQ stream URIs, split without resolving a reference: the one parser that
validation, the planner (the source's identity) and the client share.

``rabbitmq-stream[+tls]://user:password@host:port/vhost``. References (``${env:..}``,
``${file:..}``) may stand anywhere in the user information; they are masked before the URI
is split (a value may hold any character) and handed back unresolved, so a spec that
validates is one the client can open, and the planner never reads a secret.
"""

from __future__ import annotations

import re
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
    except ValueError as exc:  # "Invalid IPv6 URL", a port out of range or not a number
        raise UriInvalid(str(exc)) from None
    if parts.scheme not in SCHEMES:
        raise UriInvalid("the scheme must be rabbitmq-stream:// or rabbitmq-stream+tls://")
    if not host:
        raise UriInvalid("no host")
    tls = parts.scheme.endswith("+tls")
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    return StreamUri(host=host, port=port or (5551 if tls else 5552), vhost=unquote(path) if path else "/",
                     tls=tls, username=parts.username, password=parts.password, references=tuple(refs))


def identity(uri: str) -> tuple[str, str]:
    """(host, vhost) of a stream URI, the same for every spelling of one server (the port and
    the credentials are not part of it); a URI that cannot be split at all is its own
    identity (validation refuses it before it is ever planned)."""
    try:
        parts = urlsplit("//" + _REF.sub("x", uri).split("://", 1)[-1])
        host = (parts.hostname or "").lower()
    except ValueError:  # "Invalid IPv6 URL"
        from reconciler.spec.secrets import redact_uri

        return (f"unparseable {redact_uri(uri)}", "")
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    return host, unquote(path) if path else "/"

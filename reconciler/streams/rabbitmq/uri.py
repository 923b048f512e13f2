"""The stream URI: ``rabbitmq-stream[+tls]://user:pass@host:port/vhost`` to an endpoint.

References (``${env:..}`` / ``${file:..}``) are resolved here, just before a connection is
opened; messages only ever show ``secrets.redact_uri`` of the URI.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from reconciler.errors import PermanentError
from reconciler.spec import secrets

_REF = re.compile(r"\$\{(?:env|file):[^}]+\}")


@dataclass(frozen=True)
class StreamEndpoint:
    host: str
    port: int
    vhost: str
    username: str
    password: str = field(repr=False)
    tls: bool = False


def parse_stream_uri(uri: str) -> StreamEndpoint:
    """``rabbitmq-stream[+tls]://user:pass@host:port/vhost`` with references resolved.

    References (``${env:..}``, ``${file:/path}``) may stand anywhere in the user
    information; they are replaced by their values after the URI is split, so a value
    may hold any character. Literal parts are percent-decoded; the vhost ``%2f`` is ``/``.
    """
    refs: list[str] = []

    def hide(m: re.Match[str]) -> str:
        refs.append(m.group(0))
        return f"REFERENCE{len(refs) - 1}X"

    masked = _REF.sub(hide, uri)
    shown = secrets.redact_uri(uri)
    try:
        parts = urlsplit(masked)
        port = parts.port
    except ValueError as exc:
        raise PermanentError(f"invalid RabbitMQ stream URI {shown}: {exc}") from None
    if parts.scheme not in ("rabbitmq-stream", "rabbitmq-stream+tls"):
        raise PermanentError(
            f"invalid RabbitMQ stream URI {shown}: the scheme must be rabbitmq-stream:// "
            "or rabbitmq-stream+tls://"
        )
    if not parts.hostname:
        raise PermanentError(f"invalid RabbitMQ stream URI {shown}: no host")
    tls = parts.scheme.endswith("+tls")

    def reveal(text: str | None, default: str) -> str:
        if text is None:
            return default
        out = unquote(re.sub(r"REFERENCE(\d+)X", lambda m: f"\x00{m.group(1)}\x00", text))
        return re.sub(r"\x00(\d+)\x00", lambda m: secrets.resolve(refs[int(m.group(1))]), out)

    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    return StreamEndpoint(
        host=parts.hostname,
        port=port or (5551 if tls else 5552),
        vhost=unquote(path) if path else "/",
        username=reveal(parts.username, "guest"),
        password=reveal(parts.password, "guest"),
        tls=tls,
    )

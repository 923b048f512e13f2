"""The stream URI: ``rabbitmq-stream[+tls]://user:pass@host:port/vhost`` to an endpoint.

Split by ``spec.uris`` (the parser validation uses, so a URI that validates opens);
references (``${env:..}`` / ``${file:..}``) are resolved here, just before a connection is
opened, and only when granted; messages only ever show ``secrets.redact_uri`` of the URI.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import unquote

from reconciler.errors import PermanentError
from reconciler.spec import secrets
from reconciler.spec.uris import UriInvalid, split_stream_uri


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
    try:
        parts = split_stream_uri(uri)
    except UriInvalid as exc:
        raise PermanentError(f"invalid RabbitMQ stream URI {secrets.redact_uri(uri)}: {exc}") from None
    refs = parts.references

    def reveal(text: str | None, default: str) -> str:
        if text is None:
            return default
        out = unquote(re.sub(r"REFERENCE(\d+)X", lambda m: f"\x00{m.group(1)}\x00", text))
        try:
            return re.sub(r"\x00(\d+)\x00", lambda m: secrets.resolve(refs[int(m.group(1))]), out)
        except PermanentError as exc:  # named as validation names it
            raise PermanentError(f"source.uri: {exc}") from None

    return StreamEndpoint(
        host=parts.host,
        port=parts.port,
        vhost=parts.vhost,
        username=reveal(parts.username, "guest"),
        password=reveal(parts.password, "guest"),
        tls=parts.tls,
    )

"""Secret references: ``${env:NAME}`` and ``${file:/path}``.

Specs keep references verbatim; they are resolved only here, at the moment a
client (Kafka consumer, RabbitMQ connection) is built, and the resolved value is
never returned to anything that logs, stores or prints. ``redact`` is what every
log line, status output and audit entry goes through.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from reconciler.errors import PermanentError

_REF = re.compile(r"\$\{(?P<kind>env|file):(?P<arg>[^}]+)\}")

# librdkafka / URI keys whose literal values are secrets even without a reference.
_SECRET_KEYS = re.compile(r"(password|secret|token|sasl\.jaas|ssl\.key|credential)", re.I)
REDACTED = "***"


def _lookup(kind: str, arg: str) -> str:
    if kind == "env":
        if arg not in os.environ:
            raise PermanentError(f"secret reference ${{env:{arg}}}: environment variable {arg} is not set")
        return os.environ[arg]
    path = Path(arg.replace("$CREDENTIALS_DIRECTORY", os.environ.get("CREDENTIALS_DIRECTORY", "")))
    try:
        return path.read_text(encoding="utf-8").rstrip("\r\n")
    except OSError as exc:
        raise PermanentError(f"secret reference ${{file:{arg}}}: cannot read: {exc.strerror}") from None


def resolve(value: Any) -> Any:
    """Replace every reference in a string by its value; other types pass through."""
    if not isinstance(value, str):
        return value
    return _REF.sub(lambda m: _lookup(m["kind"], m["arg"]), value)


def resolve_mapping(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: resolve(v) for k, v in values.items()}


def has_reference(value: Any) -> bool:
    return isinstance(value, str) and bool(_REF.search(value))


def redact_uri(uri: str) -> str:
    """Hide a literal password in a URI; references are shown as they are (they are not secrets)."""
    parts = urlsplit(uri)
    if parts.password and not has_reference(parts.password):
        netloc = f"{parts.username}:{REDACTED}@{parts.hostname}"
        if parts.port:
            netloc += f":{parts.port}"
        return urlunsplit(parts._replace(netloc=netloc))
    return uri


def redact(doc: Any, key: str = "") -> Any:
    """A copy of a document fit for logs, status and the audit log."""
    if isinstance(doc, Mapping):
        return {k: redact(v, str(k)) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return [redact(v, key) for v in doc]
    if isinstance(doc, str):
        if has_reference(doc):
            return doc
        if _SECRET_KEYS.search(key):
            return REDACTED
        if "://" in doc:
            return redact_uri(doc)
    return doc


def literal_secrets(source: Mapping[str, Any]) -> list[tuple[tuple[str, ...], str]]:
    """Secrets written out in a spec's ``source`` instead of referenced: (field path, what).

    Specs should hold secrets only as ``${env:NAME}`` / ``${file:/path}``; a literal one
    still works (and is redacted in output) but is kept in the database's spec history.
    """
    found: list[tuple[tuple[str, ...], str]] = []
    for key, value in (source.get("consumerProperties") or {}).items():
        if isinstance(value, str) and value and not has_reference(value) and _SECRET_KEYS.search(str(key)):
            found.append((("source", "consumerProperties", str(key)), f"'{key}'"))
    uri = source.get("uri")
    if isinstance(uri, str):
        masked = _REF.sub("REFERENCE", uri)
        try:
            password = urlsplit(masked).password
        except ValueError:
            password = None
        if password and "REFERENCE" not in password:
            found.append((("source", "uri"), "the URI's password"))
    return found

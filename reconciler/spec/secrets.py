"""Secret references: ``${env:NAME}`` and ``${file:/path}``.

Specs keep references verbatim; they are resolved only here, at the moment a
client (Kafka consumer, RabbitMQ connection) is built, and the resolved value is
never returned to anything that logs, stores or prints. ``redact`` is what every
document shown in status output and the audit log goes through.

Libraries echo what they were given: librdkafka quotes (a truncated copy of) an invalid
property value in its error and logs ``CONFWARN ... set to '<value>'``. So every value
resolved here, and every literal under a secret-looking key, is also remembered by the
process-wide ``scrubber``; ``scrub(text)`` hides each of them, and any fragment of one
of at least ``FRAGMENT`` characters, in free text. The log handler and every error
message that is stored or served go through it.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from reconciler.errors import PermanentError

_REF = re.compile(r"\$\{(?P<kind>env|file):(?P<arg>[^}]+)\}")

# librdkafka / URI keys whose literal values are secrets even without a reference.
_SECRET_KEYS = re.compile(r"(password|secret|token|sasl\.jaas|ssl\.key|credential)", re.I)
REDACTED = "***"
FRAGMENT = 8  # characters: a shorter piece of a secret is hidden only when it is the whole secret
_SHORTEST = 3  # a secret of one or two characters cannot be hidden without hiding every word


class _Scrubber:
    """The secret values this process has seen, and their fragments, to hide in free text."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._whole: set[str] = set()
        self._grams: set[str] = set()

    def learn(self, value: Any) -> None:
        text = str(value) if value is not None else ""
        if len(text) < _SHORTEST or text in self._whole:
            return
        # A library may show the value raw, repr-escaped or JSON-escaped: learn all three.
        forms = {text, repr(text)[1:-1], json.dumps(text)[1:-1]}
        grams = {f[i:i + FRAGMENT] for f in forms for i in range(len(f) - FRAGMENT + 1)}
        with self._lock:
            self._whole |= forms
            self._grams |= grams

    def scrub(self, text: str) -> str:
        if not self._whole or not text:
            return text
        with self._lock:
            whole, grams = sorted(self._whole, key=len, reverse=True), self._grams
        for value in whole:
            text = text.replace(value, REDACTED)
        if not grams or len(text) < FRAGMENT:
            return text
        hidden = bytearray(len(text))
        for i in range(len(text) - FRAGMENT + 1):
            if text[i:i + FRAGMENT] in grams:
                hidden[i:i + FRAGMENT] = b"\x01" * FRAGMENT
        if not any(hidden):
            return text
        out, i = [], 0
        while i < len(text):
            if hidden[i]:
                while i < len(text) and hidden[i]:
                    i += 1
                out.append(REDACTED)
            else:
                out.append(text[i])
                i += 1
        return "".join(out)


scrubber = _Scrubber()


def scrub(text: Any) -> Any:
    """``text`` with every secret this process resolved (or any long fragment of one) hidden;
    None passes through."""
    return scrubber.scrub(str(text)) if text is not None else None


def _lookup(kind: str, arg: str) -> str:
    if kind == "env":
        if arg not in os.environ:
            raise PermanentError(f"secret reference ${{env:{arg}}}: environment variable {arg} is not set")
        return os.environ[arg]
    path = Path(arg.replace("$CREDENTIALS_DIRECTORY", os.environ.get("CREDENTIALS_DIRECTORY", "")))
    try:
        value = path.read_text(encoding="utf-8", errors="replace").rstrip("\r\n")
    except OSError as exc:
        raise PermanentError(f"secret reference ${{file:{arg}}}: cannot read: {exc.strerror}") from None
    scrubber.learn(value)
    return value


def resolve(value: Any) -> Any:
    """Replace every reference in a string by its value; other types pass through."""
    if not isinstance(value, str):
        return value
    return _REF.sub(lambda m: _lookup(m["kind"], m["arg"]), value)


def resolve_mapping(values: Mapping[str, Any]) -> dict[str, Any]:
    resolved = {k: resolve(v) for k, v in values.items()}
    for k, v in values.items():
        if isinstance(v, str) and not has_reference(v) and _SECRET_KEYS.search(str(k)):
            scrubber.learn(v)  # a literal secret is still a secret in an echoed message
    return resolved


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

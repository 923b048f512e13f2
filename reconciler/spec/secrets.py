"""Secret references: ``${env:NAME}`` and ``${file:/path}``, and what is shown instead of secrets.

Specs keep references verbatim; they are resolved only here, at the moment a client
(Kafka consumer, RabbitMQ connection) is built, and only when the operator granted them
(``grants``: the secrets directory and the listed environment variables). A resolved value
is never returned to anything that logs, stores or prints: every one is taught to the log
scrubber (``scrubber``), as is every literal under a secret key and every literal password
in a URI. ``redact`` is what every document shown in status output and the audit log goes
through; it, ``redact_uri`` and ``scrub`` never raise, whatever a spec holds (a value the
URL parser rejects must not break ``status`` for every supervisor).
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import unquote

from reconciler.errors import PermanentError
from reconciler.spec import grants as grants_mod
from reconciler.spec.grants import Grants
from reconciler.spec.scrubber import FRAGMENT, REDACTED, scrub, scrubber

__all__ = ["FRAGMENT", "REDACTED", "scrub", "scrubber", "resolve", "resolve_mapping", "has_reference",
           "references", "redact", "redact_uri", "literal_secrets", "learn_literals", "is_secret_key",
           "uri_password"]

REF = re.compile(r"\$\{(?P<kind>env|file):(?P<arg>[^}]+)\}")

# librdkafka's CONFIGURATION.md: the properties whose value is itself a secret.
SECRET_PROPERTIES = frozenset({
    "sasl.password", "sasl.oauthbearer.config", "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.client.credentials.client.secret",
    "sasl.oauthbearer.assertion.private.key.passphrase", "sasl.oauthbearer.assertion.private.key.pem",
    "ssl.key.password", "ssl.key.pem", "ssl_key", "ssl.keystore.password", "sasl.jaas.config",
})
# Any other key (other clients, future properties) that says it holds a secret; a path or a
# URL to one (``*.location``, ``*.file``, ``*.url``) or an identifier (``*.id``) is not one.
_SECRET_WORDS = re.compile(r"password|passphrase|passwd|secret|credential|token|jaas|private\.key|key\.pem|ssl_key",
                           re.I)
_NOT_SECRET_ENDINGS = (".location", ".file", ".url", ".id", ".algorithm", ".method")


def is_secret_key(key: str) -> bool:
    """Whether a property's literal value is a secret (shown as ``***``, warned about)."""
    name = str(key).strip().lower()
    if name in SECRET_PROPERTIES:
        return True
    return bool(_SECRET_WORDS.search(name)) and not name.endswith(_NOT_SECRET_ENDINGS)


def _lookup(kind: str, arg: str, grants: Grants | None) -> str:
    value = grants_mod.read_env(arg, grants) if kind == "env" else grants_mod.read_file(arg, grants)
    scrubber.learn(value)
    return value


def resolve(value: Any, grants: Grants | None = None) -> Any:
    """Replace every reference in a string by its value (granted ones only, else
    ``PermanentError``); other types pass through. ``grants``: this process's by default."""
    if not isinstance(value, str):
        return value
    return REF.sub(lambda m: _lookup(m["kind"], m["arg"], grants), value)


def resolve_mapping(values: Mapping[str, Any], grants: Grants | None = None) -> dict[str, Any]:
    """Client properties with their references resolved. A property that runs a command or
    loads code is refused, and one that reads a file must name a granted regular file: its
    value becomes that file's real path (the client reads exactly what was checked)."""
    grants = grants or grants_mod.current()
    resolved = {}
    for k, v in values.items():
        field = f"source.consumerProperties[{json.dumps(str(k))}]"  # named as validation names it
        name = str(k).strip().lower()
        if name in grants_mod.REFUSED_PROPERTIES:
            raise PermanentError(f"{field}: {k} {grants_mod.REFUSED_PROPERTIES[name]}: no spec may set it")
        try:
            value = resolve(v, grants)
            if grants_mod.reads_file(str(k), value):
                value = grants_mod.client_file(value, grants, f"{k}: {v}")
        except PermanentError as exc:
            raise PermanentError(f"{field}: {exc}") from None
        resolved[k] = value
        if isinstance(v, str) and not has_reference(v) and is_secret_key(str(k)):
            scrubber.learn(v)  # a literal secret is still a secret in an echoed message
    return resolved


def has_reference(value: Any) -> bool:
    return isinstance(value, str) and bool(REF.search(value))


def references(value: Any) -> Iterator[tuple[str, str]]:
    """(kind, argument) of every reference in a string."""
    if isinstance(value, str):
        for m in REF.finditer(value):
            yield m["kind"], m["arg"]


def _userinfo_span(uri: str) -> tuple[int, int] | None:
    """Where the password of ``scheme://user:password@host...`` lies in ``uri`` (references
    masked first, as a reference may hold ``/`` or ``@``), or None; never raises."""
    masked = REF.sub(lambda m: "R" * len(m.group(0)), uri)
    head = masked.find("://")
    if head < 0:
        return None
    start = head + 3
    at = _last_at(masked, start, _first(masked, start, "/?#"))
    if at < 0:  # a '/' in an unencoded password ends the authority early: look up to the query
        at = _last_at(masked, start, _first(masked, start, "?#"))
    if at < 0:
        return None
    colon = masked.find(":", start, at)
    if colon < 0 or colon + 1 == at:
        return None
    return colon + 1, at


def _first(text: str, start: int, separators: str) -> int:
    found = [i for i in (text.find(c, start) for c in separators) if i >= 0]
    return min(found, default=len(text))


def _last_at(text: str, start: int, end: int) -> int:
    """The last ``@`` in ``text[start:end]``, or a character that NFKC-normalizes to one (a
    fullwidth ＠: a parser that normalizes splits there), or -1."""
    for i in range(end - 1, start - 1, -1):
        c = text[i]
        if c == "@" or (not c.isascii() and "@" in unicodedata.normalize("NFKC", c)):
            return i
    return -1


def uri_password(uri: str) -> str | None:
    """The literal password of a URI (a reference is not one), or None."""
    span = _userinfo_span(uri) if isinstance(uri, str) else None
    if span is None:
        return None
    password = uri[span[0]:span[1]]
    return None if has_reference(password) else password


def redact_uri(uri: str) -> str:
    """Hide a literal password in a URI, in its user information or in a query parameter
    named like a secret (``?password=``); references are shown as they are (they are not
    secrets). Works on any text, parseable or not, and teaches what it hides to the scrubber."""
    out = uri
    password = uri_password(uri)
    if password:
        scrubber.learn(password)
        start, end = _userinfo_span(uri)
        out = uri[:start] + REDACTED + uri[end:]
    return _redact_query(out)


def _redact_query(uri: str) -> str:
    head, sep, query = uri.partition("?")
    if not sep:
        return uri
    query, hash_sep, fragment = query.partition("#")
    parts = []
    for item in query.split("&"):
        key, eq, value = item.partition("=")
        if eq and value and not has_reference(value) and is_secret_key(unquote(key)):
            scrubber.learn(unquote(value))
            value = REDACTED
        parts.append(f"{key}{eq}{value}")
    return f"{head}?{'&'.join(parts)}{hash_sep}{fragment}"


def redact(doc: Any, key: str = "") -> Any:
    """A copy of a document fit for logs, status and the audit log."""
    if isinstance(doc, Mapping):
        return {k: redact(v, str(k)) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return [redact(v, key) for v in doc]
    if isinstance(doc, str):
        if has_reference(doc):
            return redact_uri(doc) if "://" in doc else doc
        if is_secret_key(key):
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
        if isinstance(value, str) and value and not has_reference(value) and is_secret_key(str(key)):
            found.append((("source", "consumerProperties", str(key)), f"'{key}'"))
    uri = source.get("uri")
    if isinstance(uri, str) and uri_password(uri):
        found.append((("source", "uri"), "the URI's password"))
    return found


def learn_literals(source: Any) -> None:
    """Teach the scrubber a spec's literal secrets (as soon as a process reads the spec, so
    an error quoting one, before any client is built, is scrubbed too)."""
    if not isinstance(source, Mapping):
        return
    props = source.get("consumerProperties")
    for key, value in (props.items() if isinstance(props, Mapping) else ()):
        if isinstance(value, str) and not has_reference(value) and is_secret_key(str(key)):
            scrubber.learn(value)
    uri = source.get("uri")
    if isinstance(uri, str):
        password = uri_password(uri)
        if password:
            scrubber.learn(password)

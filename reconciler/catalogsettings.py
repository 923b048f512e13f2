"""The ``catalog`` setting: which Iceberg catalog holds the output tables.

``sql`` (the default) is pyiceberg's SQL catalog inside the metadata database: the publish
moves the table's pointer and the checkpoints in one transaction. ``glue`` and ``rest`` are
the lake's own catalogs (pyiceberg's ``GlueCatalog`` and ``RestCatalog``): the table is then
the source of truth and the database follows it (RELIABILITY.md, "External catalogs").

Parsed once at start like every restart-only setting: the config file's ``catalog:`` map,
``RECONCILER_CATALOG`` (JSON) or ``--catalog`` (JSON), the last given winning whole. Property
values are kept as written: ``${env:...}``/``${file:...}`` references are resolved when the
catalog is opened (``reconciler.table.catalogs``), never here, so a secret is never part of
the settings the daemon logs on SIGHUP.
"""

from __future__ import annotations

import json
import re
from typing import Any

from reconciler.errors import PermanentError

TYPES = ("sql", "glue", "rest")
DEFAULT_NAMESPACE = "default"
WHERE = "setting catalog (--catalog, RECONCILER_CATALOG, config key catalog)"
# What pyiceberg cannot work without, per type (its own errors come late, from deep inside).
REQUIRED = {"rest": ("uri",)}
_KEYS = {"type", "namespace", "properties"}
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}$")
# pyiceberg keys that would make it load code or pick another catalog than the one typed.
_REFUSED = {"py-catalog-impl", "py-io-impl", "type"}


def parse(cli: dict[str, Any], env: dict[str, str], file_values: dict[str, Any]) -> dict[str, Any]:
    """The ``catalog`` setting as a plain map ``{type, namespace, properties}``, checked."""
    if cli.get("catalog"):
        where = "setting catalog (--catalog)"
        raw = _json(cli["catalog"], where)
    elif env.get("RECONCILER_CATALOG"):
        where = "setting catalog (RECONCILER_CATALOG)"
        raw = _json(env["RECONCILER_CATALOG"], where)
    elif file_values.get("catalog") is not None:
        raw, where = file_values["catalog"], "config file: catalog"
    else:
        return {}
    return check(raw, where)


def check(raw: Any, where: str = WHERE) -> dict[str, Any]:
    if isinstance(raw, str):  # `catalog: glue` says the type alone
        raw = {"type": raw}
    if not isinstance(raw, dict):
        raise PermanentError(f"{where}: must be a map, e.g. {{\"type\": \"glue\", \"namespace\": \"default\", "
                             "\"properties\": {\"glue.region\": \"eu-west-1\"}}")
    unknown = sorted(str(k) for k in set(raw) - _KEYS)
    if unknown:
        raise PermanentError(f"{where}: unknown key(s) {', '.join(unknown[:5])}; known: type, namespace, properties "
                             "(pyiceberg's own settings go under properties)")
    kind = str(raw.get("type") or "sql").strip().lower()
    if kind not in TYPES:
        raise PermanentError(f"{where}: type {printable_name(kind)} is not one of {', '.join(TYPES)}")
    namespace = str(raw.get("namespace") or DEFAULT_NAMESPACE)
    if not _NAME.match(namespace):
        raise PermanentError(f"{where}: namespace {printable_name(namespace)} is not a name (letters, digits, _ . -)")
    props = raw.get("properties") or {}
    if not isinstance(props, dict):
        raise PermanentError(f"{where}: properties must be a map of pyiceberg catalog properties")
    properties: dict[str, str] = {}
    for k, v in props.items():
        if isinstance(v, (dict, list)) or v is None:  # never echoed: it may be a secret
            raise PermanentError(f"{where}: properties.{printable_name(str(k))} must be a single value (a string, "
                                 "or a ${env:...}/${file:...} reference)")
        if str(k).strip().lower() in _REFUSED:
            raise PermanentError(f"{where}: properties.{k} is not allowed (the type says which catalog; "
                                 "no property may load code)")
        properties[str(k)] = str(v).lower() if isinstance(v, bool) else str(v)
    if kind == "sql":
        if properties or namespace != DEFAULT_NAMESPACE:
            raise PermanentError(f"{where}: type sql is the metadata database's own catalog (namespace default, "
                                 "no properties); set type glue or rest for the lake's catalog")
        return {}
    missing = [k for k in REQUIRED.get(kind, ()) if not properties.get(k)]
    if missing:
        raise PermanentError(f"{where}: type {kind} needs properties.{', properties.'.join(missing)} "
                             "(e.g. the catalog server's URL)")
    return {"type": kind, "namespace": namespace, "properties": properties}


def kind(value: dict[str, Any] | None) -> str:
    """The setting's type: ``sql`` for the default (an empty map)."""
    return (value or {}).get("type", "sql")


def printable_name(text: str) -> str:
    shown = text if re.fullmatch(r"[A-Za-z0-9_.:/-]{1,60}", text) else "(not shown)"
    return repr(shown)


def _json(text: Any, where: str) -> Any:
    if isinstance(text, dict):
        return text
    try:
        return json.loads(str(text))
    except ValueError:
        # The text is never echoed: a property in it may be a credential.
        raise PermanentError(f"{where}: not JSON, e.g. '{{\"type\": \"glue\", \"properties\": "
                             "{\"glue.region\": \"eu-west-1\"}}'") from None

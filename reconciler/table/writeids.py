"""Write ids, and finding the write a file belongs to from its path alone.

Every write of files into a table (a batch, a compaction, an import, an expiry) has an
id, recorded in the database before its first file (``Store.begin_write``), so that no
clean-up deletes a file a process may still commit. Its files carry the id:

* data files under ``<table>/data/batch=<id>/`` (a batch) or ``data/compacted/<id>/``;
* metadata files (the metadata JSON, manifest list and manifests a staging writes) carry
  a *tag*: a UUID made of the id and the staging attempt, where pyiceberg puts a random
  UUID (``00012-<tag>.metadata.json``, ``snap-<snapshot>-0-<tag>.avro``,
  ``<tag>-m0.avro``). A tag has version nibble 8 and variant nibble ``a`` (a UUIDv8,
  RFC 9562's layout for vendor data), so it is never mistaken for pyiceberg's own
  random UUIDv4 names.
"""

from __future__ import annotations

import re
import secrets
import uuid

BATCH_DIR_PREFIX = "batch="
COMPACTED_DIR = "compacted"

_ID = re.compile(r"^[0-9a-f]{24}$")
_TAG = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-a[0-9a-f]{3}-[0-9a-f]{12}")


def new_write_id() -> str:
    """A fresh write id: 24 hex digits (96 random bits)."""
    return secrets.token_hex(12)


def is_write_id(text: str) -> bool:
    return bool(_ID.match(text))


def tag(write_id: str, attempt: int = 0) -> uuid.UUID:
    """The UUID a write's staging attempt puts in its metadata files' names."""
    if not _ID.match(write_id) or not 0 <= attempt < 16**6:
        raise ValueError(f"not a write id or attempt: {write_id!r}, {attempt}")
    w = write_id
    return uuid.UUID(f"{w[0:12]}8{w[12:15]}a{w[15:18]}{w[18:24]}{attempt:06x}")


def write_id_of_name(name: str) -> str | None:
    """The write id in a metadata file's name, or None (a name pyiceberg chose)."""
    m = _TAG.search(name)
    if m is None:
        return None
    h = m.group(0).replace("-", "")
    return h[0:12] + h[13:16] + h[17:20] + h[20:26]


def write_id_of_data_path(relative: str) -> str | None:
    """The write id of a data file from its path under ``<table>/data/``, or None."""
    parts = relative.replace("\\", "/").split("/")
    if not parts:
        return None
    if parts[0].startswith(BATCH_DIR_PREFIX):
        return parts[0][len(BATCH_DIR_PREFIX):] or None
    if parts[0] == COMPACTED_DIR and len(parts) > 1 and _ID.match(parts[1]):
        return parts[1]
    return None

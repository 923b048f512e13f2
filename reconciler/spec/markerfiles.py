"""Retiring consumed marker files: ``<id>.reset.yaml`` → ``.applied`` or ``.rejected``.

The result is appended as YAML comments so the renamed file tells its own story.
Renaming can fail (read-only checkout, permissions); the request is recorded in the
database first, so a marker that cannot be renamed is still applied only once and
the next tick tries the rename again.
"""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime
from pathlib import Path

import yaml

log = logging.getLogger(__name__)


def retire(path: str, status: str, result: dict) -> str | None:
    """Rename ``path`` to ``path.<status>`` with ``result`` appended; returns the new path or None."""
    src = Path(path)
    dst = src.with_name(src.name + f".{status}")
    if dst.exists():
        dst = src.with_name(src.name + f".{datetime.now(UTC):%Y%m%dT%H%M%S}.{status}")
    try:
        body = src.read_bytes()
        stamp = datetime.now(UTC).isoformat(timespec="seconds")
        comment = yaml.safe_dump(result, sort_keys=False, default_flow_style=False, allow_unicode=True)
        lines = [f"# {status} at {stamp} by stream-reconciler"] + [f"# {line}" for line in comment.splitlines()]
        tmp = dst.with_name("." + dst.name + ".tmp")
        tmp.write_bytes(body + (b"" if body.endswith(b"\n") or not body else b"\n") + ("\n".join(lines) + "\n").encode())
        os.replace(tmp, dst)
        src.unlink()
        return str(dst)
    except FileNotFoundError:
        return None  # someone else retired it already
    except OSError as exc:
        log.warning("marker %s was %s but could not be renamed: %s; will retry", path, status, exc.strerror)
        return None

"""Retiring consumed marker files: ``<id>.reset.yaml`` → ``.applied`` or ``.rejected``.

The result is appended as YAML comments so the renamed file tells its own story; a
marker that is a symlink, not a regular file, or oversized is only renamed (never
followed or read: a symlink to a file outside the directory must not be copied in).
Renaming can fail (read-only checkout, permissions); the request is recorded in the
database first, so a marker that cannot be renamed is still applied only once and
the next tick tries the rename again.
"""

from __future__ import annotations

import logging
import os
import stat
from datetime import UTC, datetime
from pathlib import Path

import yaml

from reconciler.spec.yamlsafe import MAX_BYTES

log = logging.getLogger(__name__)


def retire(path: str, status: str, result: dict) -> str | None:
    """Rename ``path`` to ``path.<status>`` with ``result`` appended; returns the new path or None."""
    src = Path(path)
    dst = src.with_name(src.name + f".{status}")
    n = 1
    while dst.exists():  # never overwrite an earlier result (two retirements in the same second)
        dst = src.with_name(src.name + f".{datetime.now(UTC):%Y%m%dT%H%M%S}{f'-{n}' if n > 1 else ''}.{status}")
        n += 1
    try:
        st = src.lstat()
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BYTES:
            # A symlink (maybe to a file outside the directory), FIFO or huge file is moved
            # as it is: never followed, read or copied (its result is in the database).
            os.replace(src, dst)
            return str(dst)
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with open(fd, "rb") as fh:
            body = fh.read(MAX_BYTES + 1)
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

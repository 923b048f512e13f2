"""Which spec parses a datasource's dead letters again, and with what (``replay``'s first
step): each lineage's current spec (a backfill's letters are parsed by its main's: the
fix is made in the main's file), refused when it is invalid; and what a batch's tasks get
besides the spec, so a replay decodes and types exactly as the batch would have: the
format's schema or descriptor file read from the spec's directory (a path relative to it)
and, with schemaDiscovery, the table's column types (a discovered column keeps its type).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from reconciler.errors import PermanentError
from reconciler.table.deadletters import lineage


class ReplayRefused(PermanentError):
    """A replay that must not run (no such datasource or supervisor, an invalid spec): nothing changed."""


def specs_of(actual: dict[str, Any], datasource: str, supervisor: str | None) -> dict[str, Any]:
    """Main supervisor id -> its current spec, for the lineages that write ``datasource``."""
    writers = {sid: r for sid, r in actual.items()
               if r.spec_document.get("dataSchema", {}).get("datasource") == datasource}
    if supervisor is not None:
        if supervisor not in actual:
            raise ReplayRefused(f"no supervisor '{supervisor}' (see `reconciler status`)")
        if supervisor not in writers:
            raise ReplayRefused(f"supervisor '{supervisor}' does not write datasource {datasource}")
    if not writers:
        known = sorted({r.spec_document.get("dataSchema", {}).get("datasource") for r in actual.values()} - {None})
        raise ReplayRefused(f"no supervisor writes datasource '{datasource}'"
                            + (f"; datasources: {', '.join(known)}" if known else ""))
    out = {}
    for main in sorted({lineage(sid) for sid in writers}):
        rec = actual.get(main) or writers.get(main)
        if rec is None:
            continue
        if rec.spec_error:
            raise ReplayRefused(f"the spec of supervisor {main} is invalid ({rec.spec_error}); fix "
                                f"{rec.spec_path or 'its file'} first: dead letters are parsed with the current spec")
        if rec.spec_document.get("dataSchema", {}).get("datasource") != datasource:
            continue  # the main writes elsewhere now: its backfill's letters stay
        out[main] = rec.spec
    return out


def how_to_parse(tables: Any, actual: dict[str, Any], datasource: str, specs: dict[str, Any]) -> dict[str, dict]:
    """Main id -> what its tasks get besides the spec, so a replay decodes and types as a
    batch does: the format's schema file read from the spec's directory, and with
    schemaDiscovery the table's column types (a discovered column keeps its type)."""
    from reconciler.pipeline.batch import plain_types
    from reconciler.pipeline.formats import schema_files

    table = tables.load(datasource) if any(s.data_schema.schema_discovery for s in specs.values()) else None
    types = plain_types(table.schema().as_arrow()) if table is not None else {}
    out = {}
    for main, spec in specs.items():
        path = actual[main].spec_path if main in actual else None
        spec_dir = os.path.dirname(os.path.abspath(path)) if path else None
        try:
            files = schema_files(spec.data_schema, spec_dir)
        except ValueError as exc:  # the file is gone or unreadable: say which, replay nothing
            raise ReplayRefused(f"supervisor {main}: {exc}") from None
        out[main] = {"files": files, "table_types": types if spec.data_schema.schema_discovery else None}
    return out


def with_types(how: dict, again: dict | None) -> dict:
    """``how`` with the joined types ``again`` as the table's (a spec with schemaDiscovery)."""
    if not again or how.get("table_types") is None:
        return how
    return {**how, "table_types": {**how["table_types"], **again}}


def rejoin(files: list, parsed: dict, parse: Callable[[Any, dict], Any]) -> dict:
    """The files parsed again with their new columns' joined types (``discovered.settle``
    over every file's report) when some file decided a type the join does not read as
    itself; else nothing. The same join as a batch's, so the letters of many batches come
    back as the rows of one."""
    from reconciler.pipeline.discovered import settle

    found = [parsed[f.path].found for f in files if parsed[f.path].found is not None]
    again = settle(found)[1] if found else {}
    return {f.path: parse(f, again) for f in files} if again else {}

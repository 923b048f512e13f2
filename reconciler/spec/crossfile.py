"""Rules that compare spec files: what no single file shows, but the daemon would refuse.

Each datasource is one Iceberg table, and each has a dead-letter table ``<D>_deadletter``
(``table.catalog.deadletter_table``). So, among the valid specs of one directory (or of the
files ``validate`` is given together):

* a datasource may not be another datasource's dead-letter table (datasource
  ``clicks_deadletter`` beside datasource ``clicks`` would silently be the dead letters of
  ``clicks``, or the two would fail each other's publishes);
* the supervisors of one datasource must agree on ``rollup`` and on every column they
  share: its type (``bytes`` a string dimension in one, a long metric in the other) and
  its spelling (``user`` and ``User`` are one column to readers): the table takes the
  first one's schema, and every publish of the other would fail.

Like duplicate ids, a conflict makes every file involved invalid (each keeps its last
valid spec): files say nothing of which came first, and ``validate`` must say what the
daemon says.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from reconciler.model import SupervisorSpec
from reconciler.spec.columns import Column, output_columns
from reconciler.spec.yamlsafe import YamlPath, format_field

DEADLETTER_SUFFIX = "_deadletter"  # the same suffix as table.catalog's dead-letter tables

_DATASOURCE: YamlPath = ("dataSchema", "datasource")
_ROLLUP: YamlPath = ("dataSchema", "granularity", "rollup")


@dataclass(frozen=True)
class Entry:
    """One valid spec of the group and where it was read from."""

    path: str
    spec: SupervisorSpec


Findings = dict[str, list[tuple[YamlPath, str]]]  # path -> (field, message)


def findings(entries: Sequence[Entry]) -> Findings:
    """What conflicts, by path (a path without conflicts is absent); positions are added by
    the caller, only for the files concerned."""
    out: Findings = {}
    by_datasource: dict[str, list[Entry]] = {}
    for e in entries:
        by_datasource.setdefault(e.spec.data_schema.datasource, []).append(e)
    for ds, group in by_datasource.items():
        owner = ds.removesuffix(DEADLETTER_SUFFIX) if ds.endswith(DEADLETTER_SUFFIX) else None
        for other in by_datasource.get(owner, ()) if owner else ():
            for e in group:
                _add(out, e, _DATASOURCE, f"datasource {ds!r} is the dead-letter table of datasource {owner!r} "
                                          f"({other.path}): choose another name")
            _add(out, other, _DATASOURCE, f"the dead letters of datasource {owner!r} go to table {ds!r}, which "
                                          f"{group[0].path} declares as a datasource: one of them must change")
        if len(group) > 1:
            _agree(out, ds, group)
    return out


def _agree(out: Findings, ds: str, group: list[Entry]) -> None:
    first = group[0]
    for e in group[1:]:
        if e.spec.data_schema.rollup != first.spec.data_schema.rollup:
            for a, b in ((e, first), (first, e)):
                _add(out, a, _ROLLUP, f"datasource {ds!r} is also written by {b.path} with rollup: "
                                      f"{str(b.spec.data_schema.rollup).lower()}: the supervisors of one "
                                      "datasource must agree on rollup")
    columns: dict[str, tuple[Column, Entry]] = {}
    for e in group:
        for col in output_columns(e.spec.document.get("dataSchema") or {}):
            seen = columns.get(col.name.lower())
            if seen is None:
                columns[col.name.lower()] = (col, e)
                continue
            other, owner = seen
            if owner is e or (other.name, other.type) == (col.name, col.type):
                continue
            for (mine, me), (theirs, them) in (((col, e), (other, owner)), ((other, owner), (col, e))):
                why = (f"is {mine.type} here but {theirs.type}" if mine.type != theirs.type
                       else f"is spelled {theirs.name!r}")
                _add(out, me, mine.at, f"column {mine.name!r} {why} in {them.path} ({format_field(theirs.at)}): "
                                       f"datasource {ds!r} is one table, its columns must agree")


def _add(out: Findings, e: Entry, at: YamlPath, message: str) -> None:
    found = out.setdefault(e.path, [])
    if (at, message) not in found:
        found.append((at, message))

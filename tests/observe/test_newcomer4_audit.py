"""Issue 46.4, a fourth newcomer's run of the pages: what an audit entry and a suspend say.

- A ``source-fingerprint`` entry's details read ``0 [49,999, 1,795,875,046,286]``: an (offset,
  epoch-ms) pair drawn as a range, its time grouped by thousands. They read as words now, and
  what is stored is unchanged.
- ``reconciler suspend`` and a file's ``suspended: true`` both showed a bare ``SUSPENDED``; the
  CLI said ``SUSPENDED (by operator)`` and the reason was only in the audit log. Both pages say
  who suspended it and why, as the CLI does.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import sqlalchemy as sa

from reconciler.control.actual import State
from reconciler.observe import statuspage, supervisorpage
from reconciler.observe.status import all_status
from reconciler.store.tables import audit_log
from tests.observe.test_status_restarted import _spec

NOW = datetime(2026, 11, 28, 14, 30, tzinfo=UTC)


def _page(store, sid: str) -> str:
    [item] = all_status(store, sid, with_latest=False)
    return supervisorpage.render(item, observed=None, samples=[], batches=[],
                                 audit=list(reversed(store.history(sid)))[:50], now=NOW)


def _main(store) -> None:
    store.create_supervisor(_spec(), "specs/clicks.yaml", actor="t")
    store.set_state("clicks", State.RUNNING)


def test_a_fingerprint_reads_as_words_and_is_stored_as_before(store):
    _main(store)
    store.note_fingerprint("clicks", 0, {"0": (49_999, 1_795_875_046_286), "1": (7, 1_795_875_000_000)}, actor="stream")
    page = _page(store, "clicks")
    row = next(r for r in page.split("<tr>") if "source-fingerprint" in r)
    details = row.split("<td class=details>")[1].split("</td>")[0]
    assert "partition 0: the record at offset 49,999 written 2026-11-28 14:10:46Z" in details, details
    assert "partition 1: the record at offset 7 written 2026-11-28 14:10:00Z" in details, details
    assert "1,795,875,046,286" not in details and "[49,999" not in details
    with store.engine.connect() as c:  # the stored entry is what the store reads back
        stored = json.loads(c.execute(sa.select(audit_log.c.details).where(
            audit_log.c.action == "source-fingerprint")).scalar_one())
    assert stored["fingerprint"] == {"0": [49_999, 1_795_875_046_286], "1": [7, 1_795_875_000_000]}
    assert store.source_fingerprint("clicks", 0) == {"0": (49_999, 1_795_875_046_286), "1": (7, 1_795_875_000_000)}


def test_an_operators_suspend_is_said_on_both_pages(store):
    _main(store)
    store.suspend_by_operator("clicks", "INC-7 <broker upgrade>", actor="cli:alice")
    items = all_status(store, with_latest=False)
    index = statuspage.render(items, [], (True, {"role": "leader"}), {}, NOW)
    row = index.split('id="sup-clicks"')[1].split("</tr>")[0]
    assert "SUSPENDED" in row and "by operator: INC-7 &lt;broker upgrade&gt;" in row, row
    page = _page(store, "clicks")
    badge = page.split("<p class=state>")[1].split("</p>")[0]
    assert "by operator: INC-7 &lt;broker upgrade&gt;" in badge, badge
    assert "SUSPENDED (by operator: INC-7 &lt;broker upgrade&gt;)" in page.split("id=summary")[1]

    # lifted, while its file asks for a suspend: suspended still, with no operator to name
    store.resume_by_operator("clicks", None, actor="cli:alice", file_suspended=True)
    store.set_state("clicks", State.SUSPENDED)
    items = all_status(store, with_latest=False)
    index = statuspage.render(items, [], (True, {"role": "leader"}), {}, NOW)
    assert "by operator" not in index.split('id="sup-clicks"')[1].split("</tr>")[0]
    assert "by operator" not in _page(store, "clicks").split("<h2>")[0]

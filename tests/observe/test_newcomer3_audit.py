"""Issue 46, the third newcomer run, item 4: audit details said the same things differently on one
page. ``create-backfill`` showed ``[125000, 137500]`` (closed, no separators) beside its reset's
``[125,000, 137,500)``; a CLI reset's "by / trigger" cell said ``cli:root (operation …)`` twice;
"1 batches". One format for ranges (half-open, separators) on the page and in ``history``.

The reset is the CLI's (``from_cli``, its actor as ``reconciler reset`` sets it) applied by the real
store (SQLite); the pages and ``history`` render what the store holds."""

from __future__ import annotations

from reconciler.control.actual import State
from reconciler.control.requests import from_cli
from reconciler.control.resets import Positions, compute_reset
from reconciler.model import PartitionRange, Position
from reconciler.observe import render, supervisorpage
from reconciler.observe.status import all_status
from tests.observe.test_status_restarted import _spec

OP = "27ead4fd2645"
BID = "clicks-backfill-1"


def _reset(store) -> None:
    """``clicks`` at 125,000 reset to latest (137,500) by ``reconciler reset``, with a backfill."""
    store.create_supervisor(_spec(), "specs/clicks.yaml", actor="t")
    store.set_state("clicks", State.RUNNING)
    store.init_checkpoints("clicks", {"0": 125_000})
    request = from_cli("clicks", Position("latest"), operation_id=OP, backfill=True, reason="incident 7")
    positions = Positions(earliest={"0": 0}, latest={"0": 137_500})
    store.apply_reset(request, lambda cp: compute_reset(Position("latest"), cp, positions, backfill=True),
                      initial={}, actor=f"cli:{request.source}")


def _page(store, sid: str) -> str:
    [item] = [i for i in all_status(store, with_latest=False) if i["id"] == sid]
    return supervisorpage.render(item, observed=None, samples=[], batches=store.recent_batches(sid, 20),
                                 audit=list(reversed(store.history(sid))))


def _audit_row(page: str, action: str) -> str:
    table = page.split("<table id=audit>")[1].split("</table>")[0]
    return next(r for r in table.split("<tr>") if f"<td>{action}</td>" in r)


def test_ranges_are_written_one_way_on_the_pages_and_in_history(store):
    _reset(store)
    created = _audit_row(_page(store, BID), "create-backfill")
    assert "ranges: 0 [125,000, 137,500)" in created, created
    assert "[125000, 137500]" not in created
    reset = _audit_row(_page(store, "clicks"), "reset-and-backfill")
    assert "0 [125,000, 137,500)" in reset, reset

    # ``history`` keeps the plain form its lines have had since the first release (scripts read
    # them), half-open too
    text = render.history_text(store.history(BID))
    assert "    ranges: 0: [125000, 137500)" in text, text
    text = render.history_text(store.history("clicks"))
    assert "backfill supervisor: clicks-backfill-1 (12500 records)" in text, text


def test_a_cli_resets_author_is_said_once(store):
    _reset(store)
    row = _audit_row(_page(store, "clicks"), "reset-and-backfill")
    assert row.count(f"(operation {OP})") == 1, row
    line = next(x for x in render.history_text(store.history("clicks")).splitlines() if "reset-and-backfill" in x)
    assert line.count(f"(operation {OP})") == 1 and "trigger:" not in line, line
    # a trigger that says something else than the author is still shown
    created = _audit_row(_page(store, BID), "create-backfill")
    assert "reconciler<br><span class=muted>reset of clicks</span>" in created, created
    assert render.trigger_beside("policy", "policy: lag policy breach since 10:00:00Z") == \
        "policy: lag policy breach since 10:00:00Z"


def test_one_batch_is_a_batch(store):
    _reset(store)
    store.set_state(BID, State.RUNNING)
    store.publish(supervisor_id=BID, epoch=1, batch_id="b1", datasource="clicks",
                  ranges=[PartitionRange("0", 125_000, 130_000)], files=[], records=5_000, unparseable=0)
    page = _page(store, BID)
    assert "5,000 (0 unparseable, 1 batch)" in page and "1 batches" not in page
    assert "0 [125,000, 130,000)" in page.split("<table id=batches>")[1]  # the batches' offsets too
    store.publish(supervisor_id=BID, epoch=1, batch_id="b2", datasource="clicks",
                  ranges=[PartitionRange("0", 130_000, 137_500)], files=[], records=7_500, unparseable=0)
    assert "12,500 (0 unparseable, 2 batches)" in _page(store, BID)
    assert [render.plural(n, "batch") for n in (0, 1, 2, 1000)] == ["0 batches", "1 batch", "2 batches",
                                                                   "1,000 batches"]

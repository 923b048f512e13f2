"""Issue 46, the third newcomer run, item 3: with the broker down the page said the error once above
the table, but "Recent alerts" repeated the whole four-line error for each supervisor. The audit
entries are the store's own (a real SQLite file), written as the runtime writes them."""

from __future__ import annotations

from reconciler.control.actual import DetailedState, State
from reconciler.observe import statuspage
from reconciler.observe.status import all_status
from reconciler.observe.statuspage import ALERT_ACTIONS
from tests.observe.test_newcomer_page import DOWN
from tests.observe.test_status_restarted import _spec

SAID = DOWN.replace("'", "&#x27;")
IDS = ("clicks", "clicks-rollup", "views")


def _unhealthy(store, sids=IDS) -> None:
    for sid in sids:
        if store.get(sid) is None:
            store.create_supervisor(_spec(sid), f"specs/{sid}.yaml", actor="t")
            store.set_state(sid, State.RUNNING)
        store.set_detailed(sid, State.UNHEALTHY_SUPERVISOR, DetailedState.LOST_CONTACT_WITH_STREAM, DOWN)


def _alerts_table(html: str) -> str:
    return html.split("<table id=alerts>")[1].split("</table>")[0]


def test_a_brokers_error_is_said_once_in_the_alerts_too(store):
    _unhealthy(store)
    items = all_status(store, with_latest=False)
    alerts = store.recent_audit(ALERT_ACTIONS)
    assert [e["reason"] for e in alerts] == [DOWN] * 3  # three entries, one per supervisor
    html = statuspage.render(items, [], (False, {"role": "leader"}), {}, alerts=alerts)
    assert html.count(SAID) == 1, html.count(SAID)  # in the banner only (was once more per supervisor)
    table = _alerts_table(html)
    assert table.count("<tr>") == 2  # the header and one row
    assert "3 supervisors: views, clicks-rollup, clicks" in table
    assert '<a href="#err-1">see [1] above</a>' in table

    # recovered: the banner says nothing any more, the alert says the error once for the three
    for sid in IDS:
        store.set_detailed(sid, State.RUNNING, DetailedState.RUNNING, None)
    html = statuspage.render(all_status(store, with_latest=False), [], (True, {"role": "leader"}), {},
                             alerts=store.recent_audit(ALERT_ACTIONS))
    table = _alerts_table(html)
    assert html.count(SAID) == 1 and table.count(SAID) == 1
    assert "3 supervisors: views, clicks-rollup, clicks</td><td>recovered" in table
    assert "3 supervisors: views, clicks-rollup, clicks</td><td>unhealthy" in table


def test_alerts_of_different_moments_or_words_stay_apart(store):
    _unhealthy(store, ("clicks",))
    store.set_detailed("clicks", State.RUNNING, DetailedState.RUNNING, None)
    _unhealthy(store, ("clicks", "views"))
    store.set_detailed("views", State.UNHEALTHY_TASKS, DetailedState.UNHEALTHY_TASKS, "a task failed")
    html = statuspage.render([], [], (True, {"role": "leader"}), {}, alerts=store.recent_audit(ALERT_ACTIONS))
    rows = _alerts_table(html).split("<tbody>")[1].split("</tr>")[:-1]
    # newest first: two unhealthy with the same words, then the recovery between, then the first failure
    assert [r.split("<td>")[2].split("</td>")[0] for r in rows] == [
        "2 supervisors: views, clicks", "clicks", "clicks"]
    assert [r.split("<td>")[3].split("</td>")[0] for r in rows] == ["unhealthy", "recovered", "unhealthy"]
    # the resets list is never grouped: each operation is its own
    assert "supervisors:" not in statuspage._resets(store.recent_audit(ALERT_ACTIONS))

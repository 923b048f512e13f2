"""Issue 41.7: the status page's recent resets and recent alerts are two lists. A lag policy at
its threshold wrote an alert every round, and on one shared list of 20 they pushed another
team's reset off the page. A real SQLite store and the daemon's own page rendering."""

from __future__ import annotations

from reconciler.control.actual import State
from reconciler.daemon import HttpEndpoint
from reconciler.model import SupervisorSpec
from reconciler.observe import statuspage
from reconciler.observe.metrics import Metrics
from reconciler.store.store import Store


def create(store: Store, sid: str) -> None:
    doc = {"id": sid, "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9", "topic": sid},
           "dataSchema": {"datasource": sid, "timestamp": {"column": "ts"}}}
    store.create_supervisor(SupervisorSpec.from_document(doc), None, actor="test")
    store.set_state(sid, State.RUNNING)


def test_a_reset_stays_on_the_page_when_30_alerts_follow_it(store):
    create(store, "team-a")
    create(store, "team-b")
    store.audit("team-a", "reset-and-backfill", "cli", reason="lag alarm INC-42", details={"position": "latest"})
    for i in range(30):  # a policy at its threshold: a breach and its end, round after round
        store.audit("team-b", "lag-breach" if i % 2 == 0 else "lag-breach-end", "policy", reason=f"flap {i}")
    html = HttpEndpoint(store, Metrics())._status_page("/")
    resets = html.split("<table id=resets>")[1].split("</table>")[0]
    alerts = html.split("<table id=alerts>")[1].split("</table>")[0]
    assert "team-a" in resets and "lag alarm INC-42" in resets and "lag-breach" not in resets
    assert alerts.count("<tr>") == 1 + 20  # the header and the newest 20 alerts
    assert "flap 29" in alerts and "flap 9" not in alerts and "reset-and-backfill" not in alerts
    assert html.index("Recent resets") < html.index("Recent alerts")


def test_the_two_lists_share_no_action():
    assert not set(statuspage.RESET_ACTIONS) & set(statuspage.ALERT_ACTIONS)
    assert {"reset", "reset-and-backfill", "retention-loss"} <= set(statuspage.RESET_ACTIONS)
    assert {"lag-breach", "lag-breach-end", "unhealthy", "recovered"} == set(statuspage.ALERT_ACTIONS)

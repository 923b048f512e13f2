"""One spec never stops the plan of the others (issue 29): whatever planning one supervisor
raises becomes an action or a note on that supervisor, naming its file and the reason."""

from __future__ import annotations

import pytest

from reconciler.control import plan as plan_mod
from reconciler.control.actual import State
from reconciler.control.plan import ActionKind, plan
from reconciler.model import SupervisorSpec
from tests.control.test_plan import actual, desired, document, record, spec

BAD_URI = "rabbitmq-stream://guest:guest@[fd00::5:5552/%2f"  # Python's URL parser raises on it


def rabbit(sid: str, uri: str) -> SupervisorSpec:
    doc = document(sid)
    doc["source"] = {"type": "rabbitmq", "uri": uri, "streams": [f"{sid}-0"]}
    return SupervisorSpec.from_document(doc)


def test_a_uri_the_parser_rejects_never_stops_the_plan():
    """A spec stored before validation refused such URIs, updated to another one: the old
    code raised ValueError out of plan() and every supervisor's pass aborted."""
    old = rabbit("orders", BAD_URI)
    new = rabbit("orders", "rabbitmq-stream://guest:guest@[fd00::5]:5552/%2f")
    p = plan(desired(new, spec("clicks"), rabbit("events", BAD_URI)),
             actual(record(old), record("gone")))
    kinds = {(a.kind, a.supervisor_id) for a in p.actions}
    assert (ActionKind.CREATE, "clicks") in kinds and (ActionKind.CREATE, "events") in kinds
    assert (ActionKind.TERMINATE, "gone") in kinds
    assert any(a.supervisor_id == "orders" for a in p.actions)


@pytest.mark.parametrize("existing", [True, False])
def test_whatever_one_spec_raises_is_reported_on_it(monkeypatch, existing):
    real = plan_mod._diff_valid

    def diff(s, path, rec, act):
        if s.id == "hostile":
            raise ValueError("Invalid IPv6 URL")
        return real(s, path, rec, act)

    monkeypatch.setattr(plan_mod, "_diff_valid", diff)
    records = [record("hostile", State.RUNNING)] if existing else []
    p = plan(desired(spec("hostile"), spec("clicks")), actual(*records))
    assert [(a.kind, a.supervisor_id) for a in p.actions if a.supervisor_id == "clicks"] == [(ActionKind.CREATE, "clicks")]
    reason = "specs/hostile.yaml: cannot be planned: ValueError: Invalid IPv6 URL"
    if existing:
        [mark] = [a for a in p.actions if a.supervisor_id == "hostile"]
        assert (mark.kind, mark.path, mark.error) == (ActionKind.MARK_INVALID, "specs/hostile.yaml", reason)
    else:
        assert f"{reason}; nothing is created from it" in p.notes

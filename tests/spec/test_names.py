"""File names that are not valid UTF-8 (issue 29): reported escaped as invalid files, never
stored; a marker named that way is rejected and renamed, and never blocks a pass."""

from __future__ import annotations

import os

from reconciler.control.actual import State
from reconciler.control.apply import Applier
from reconciler.control.reconcile import reconcile_once
from reconciler.spec.loader import load_directory
from reconciler.spec.names import BAD_NAME, shown
from reconciler.store.store import Store


def spec_text(sid: str) -> str:
    return (f"id: {sid}\nsource: {{type: kafka, bootstrapServers: 'h:9092', topic: {sid}}}\n"
            f"dataSchema: {{datasource: {sid}, timestamp: {{column: ts}}}}\n")


def _bytes_dir(path) -> bytes:
    return os.fsencode(str(path))


def test_a_name_that_is_not_utf8_is_shown_escaped_and_invalid(tmp_path):
    d = _bytes_dir(tmp_path)
    with open(os.path.join(d, b"bad\xff.yaml"), "w") as f:
        f.write(spec_text("bad"))
    with open(os.path.join(d, b"good.reset\xfe.yaml"), "w") as f:  # a spec name (.yaml), not a marker
        f.write(spec_text("good2"))
    with open(os.path.join(d, b"good\xfe.reset.yaml"), "w") as f:
        f.write("resetTo: latest\n")
    (tmp_path / "good.yaml").write_text(spec_text("good"))
    state = load_directory(str(tmp_path))
    bad = f"{tmp_path}/bad\\xff.yaml"
    assert set(state.by_id()) == {"good"}
    assert str(state.invalid[bad]) == f"{bad}: {BAD_NAME}"
    assert state.invalid_ids["bad"] == bad, "its id is recovered: a supervisor renamed so keeps its last spec"
    assert list(state.bad_markers) == [f"{tmp_path}/good\\xfe.reset.yaml"]
    assert not state.markers and not state.rejected_markers
    for p in state.problems:
        p.path.encode("utf-8")  # printable, loggable, storable
    assert shown("caf\udce9.yaml") == "caf\\xe9.yaml"


def test_the_pass_goes_on_stores_nothing_of_it_and_renames_the_marker(tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    d = _bytes_dir(specs)
    with open(os.path.join(d, b"bad\xff.yaml"), "w") as f:
        f.write(spec_text("bad"))
    marker = os.path.join(d, b"good\xff.reset.yaml")
    with open(marker, "w") as f:
        f.write("resetTo: latest\n")
    (specs / "good.yaml").write_text(spec_text("good"))
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    store.migrate()
    try:
        result = reconcile_once(str(specs), Applier(store, actor="test"))
        assert [(a.kind, a.supervisor_id) for a in result.plan.actions] == [("create", "good")]
        assert all(r.ok for r in result.results)
        actual = store.read_actual()
        assert set(actual.supervisors) == {"good"} and actual.supervisors["good"].state == State.PENDING
        assert not actual.handled_tokens, "no request recorded from a marker named that way"
        assert not os.path.exists(marker) and os.path.exists(marker + b".rejected")
        with open(marker + b".rejected") as f:
            assert "not valid UTF-8" in f.read()
        again = reconcile_once(str(specs), Applier(store, actor="test"))  # and the next pass is quiet
        assert again.plan.actions == () and again.results == ()
    finally:
        store.close()

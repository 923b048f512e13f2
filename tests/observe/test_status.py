"""``status`` for every supervisor, whatever one of them holds (issue 29): a value the URL
parser rejects, a lookup that raises, a client stuck in I/O; and the newest librdkafka secret
properties shown as ``***``."""

from __future__ import annotations

import threading
import time

import pytest

from reconciler.model import SupervisorSpec
from reconciler.observe import status as status_mod
from reconciler.observe.status import all_status
from reconciler.store.store import Store


def _spec(sid: str, **props) -> SupervisorSpec:
    return SupervisorSpec.from_document({
        "id": sid, "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9", "topic": sid,
                              "consumerProperties": props},
        "dataSchema": {"datasource": sid, "timestamp": {"column": "ts"}}})


@pytest.fixture
def store(tmp_path):
    s = Store(f"sqlite:///{tmp_path / 'r.db'}")
    s.migrate()
    s.create_supervisor(_spec("good"), "specs/good.yaml", actor="test")
    s.create_supervisor(_spec("rack", **{"client.rack": "http://[rack-a"}), "specs/rack.yaml", actor="test")
    s.create_supervisor(_spec("oauth", **{"sasl.oauthbearer.assertion.private.key.passphrase": "pass-PLANTED-1",
                                          "sasl.oauthbearer.assertion.private.key.pem": "pem-PLANTED-2"}),
                        "specs/oauth.yaml", actor="test")
    s.create_supervisor(_spec("hung"), "specs/hung.yaml", actor="test")
    s.create_supervisor(_spec("broken"), "specs/broken.yaml", actor="test")
    yield s
    s.close()


class _Adapter:
    def __init__(self, sid: str, forever: threading.Event):
        self.sid, self.forever = sid, forever

    def latest(self):
        if self.sid == "hung":
            self.forever.wait()  # a client stuck in I/O: no timeout of its own
        if self.sid == "broken":
            raise ValueError("Invalid IPv6 URL")
        return {"0": 5}

    def close(self):
        pass


def test_one_supervisor_never_breaks_the_report_of_the_others(store, monkeypatch):
    forever = threading.Event()
    monkeypatch.setattr(status_mod, "adapter_for", lambda source, timeout: _Adapter(source.topic, forever))
    monkeypatch.setattr(status_mod, "ASK_DEADLINE", 0.5)
    try:
        started = time.monotonic()
        items = {s["id"]: s for s in all_status(store)}
        took = time.monotonic() - started
    finally:
        forever.set()
    assert set(items) == {"good", "rack", "oauth", "hung", "broken"}
    assert took < 5, "the report waited for the stuck lookup"
    assert items["good"]["partitions"][0]["latest"] == 5 and items["good"]["streamError"] is None
    assert items["rack"]["source"]["consumerProperties"]["client.rack"] == "http://[rack-a"
    assert items["hung"]["streamError"] == "no answer from the stream within 0.5s (given up)"
    assert items["broken"]["streamError"] == "ValueError: Invalid IPv6 URL"
    props = items["oauth"]["source"]["consumerProperties"]
    assert set(props.values()) == {"***"}


def test_status_page_and_cli_survive_an_unparseable_value(store, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from reconciler import settings as settings_mod
    from reconciler.cli import cli

    env = {e: None for _, e, _, _ in settings_mod.describe()} | {"RECONCILER_CONFIG": None}
    env |= {"RECONCILER_DB": str(store.engine.url), "RECONCILER_STATE_DIR": str(tmp_path)}
    result = CliRunner().invoke(cli, ["status", "--no-lag"], env=env)
    assert result.exit_code == 0, result.output
    for sid in ("good", "rack", "oauth", "hung", "broken"):
        assert sid in result.stdout
    assert "PLANTED" not in result.stdout
    as_json = CliRunner().invoke(cli, ["status", "--no-lag", "-o", "json"], env=env)
    assert as_json.exit_code == 0 and "PLANTED" not in as_json.stdout

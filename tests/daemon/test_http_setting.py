"""The daemon's ``http`` setting: a taken address fails the start naming the setting,
``http: off`` runs without a listener (issue 46.3), and the page of a running daemon is
rendered once for requests that arrive together (issue 41.3)."""

from __future__ import annotations

import http.client
import logging
import os
import socket
import subprocess
import threading
import time

import pytest

from reconciler import settings as settings_mod
from reconciler.daemon import Daemon, HttpEndpoint
from reconciler.daemon.http import http_off
from reconciler.errors import Misconfigured
from reconciler.observe import statuspage
from reconciler.observe.metrics import Metrics
from reconciler.store.store import Store
from tests.daemon.test_watch import daemon_thread
from tests.e2e import helpers


@pytest.fixture
def taken():
    """A port some other process listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield s.getsockname()[1]


def _get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def test_reconciler_run_on_a_taken_port_exits_2_naming_the_http_setting(tmp_path, taken):
    (tmp_path / "specs").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECONCILER_") and k != "STATE_DIRECTORY"}
    env |= {"RECONCILER_CONFIG": os.devnull, "RECONCILER_SPECS": str(tmp_path / "specs"),
            "RECONCILER_STATE_DIR": str(tmp_path / "state"), "RECONCILER_HTTP": f"127.0.0.1:{taken}"}
    proc = subprocess.run([str(helpers.RECONCILER_BIN), "run"], env=env, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"Error: setting http (--http, RECONCILER_HTTP): cannot listen on 127.0.0.1:{taken}: "
                           "Address already in use"), proc.stderr
    assert "http: off" in last
    assert "READY=1" not in proc.stderr and "continuing without" not in proc.stderr


def test_the_daemon_does_not_start_and_leaves_nothing_open(tmp_path, taken):
    s = helpers.make_settings(tmp_path, http=f"127.0.0.1:{taken}")
    daemon = Daemon(s)
    with pytest.raises(Misconfigured, match=r"setting http .*cannot listen on 127\.0\.0\.1:\d+"):
        daemon.run(timeout=10)  # (the old daemon went on without HTTP: 1 after 10 s)
    assert daemon.metrics.last_loop == 0  # the loop never went round


@pytest.mark.parametrize("where", ["option", "env", "config", "config-quoted", "empty"])
def test_http_off_is_said_in_any_of_the_settings_places(tmp_path, where):
    config = tmp_path / "config.yaml"
    config.write_text({"config": "http: off\n", "config-quoted": "http: 'OFF'\n"}.get(where, ""))
    cli = {"option": {"http": "off"}, "empty": {"http": ""}}.get(where, {})
    env = {"RECONCILER_HTTP": "off"} if where == "env" else {}
    s = settings_mod.load(cli, config=str(config), env=env)
    assert http_off(s.http) and s.http in ("off", "OFF", ""), s.http
    endpoint = HttpEndpoint(None, Metrics())
    endpoint.start(s.http)
    assert endpoint._server is None


def test_a_daemon_with_http_off_runs_without_a_listener(tmp_path, caplog):
    s = helpers.make_settings(tmp_path, http="off")
    with caplog.at_level(logging.INFO, logger="reconciler.daemon"), daemon_thread(s) as daemon:
        assert daemon._http is not None and daemon._http._server is None
    assert any("http is off" in r.getMessage() for r in caplog.records)


def test_sighup_to_a_taken_port_keeps_the_old_address(tmp_path, taken, caplog):
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    store.migrate()
    endpoint = HttpEndpoint(store, Metrics())
    endpoint.start("127.0.0.1:0")
    try:
        old = endpoint._server.server_address[1]
        endpoint._address = f"127.0.0.1:{old}"  # what the settings said
        with caplog.at_level(logging.ERROR, logger="reconciler.daemon"):
            endpoint.switch(f"127.0.0.1:{taken}")
        assert endpoint._server is not None and endpoint._server.server_address[1] == old
        assert _get(old, "/healthz")[0] == 503  # answers (the loop of this test never ran)
        assert any("setting http" in r.getMessage() and "keeping" in r.getMessage() for r in caplog.records)
    finally:
        endpoint.stop()
        store.close()


def test_a_daemons_page_is_rendered_once_for_requests_that_arrive_together(tmp_path, monkeypatch):
    renders: list[int] = []
    real = statuspage.render

    def slow_render(*args, **kwargs):
        renders.append(1)
        time.sleep(0.5)  # 400 supervisors' worth: every request below arrives meanwhile
        return real(*args, **kwargs)

    monkeypatch.setattr(statuspage, "render", slow_render)
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    store.migrate()
    endpoint = HttpEndpoint(store, Metrics())
    endpoint.start("127.0.0.1:0")
    port = endpoint._server.server_address[1]
    answers: list[tuple[int, bytes]] = []
    try:
        threads = [threading.Thread(target=lambda: answers.append(_get(port, "/"))) for _ in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert [status for status, _ in answers] == [200] * 10
        assert len({body for _, body in answers}) == 1 and b"<title>stream-reconcil" in answers[0][1]
        assert renders == [1] and endpoint.pages.renders == 1
    finally:
        endpoint.stop()
        store.close()

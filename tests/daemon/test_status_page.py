"""The status page (issue 14): loaded in a real headless browser (Debian's chromium) from a
daemon ingesting from a real Kafka broker, with a backfill made by a real reset. The page must
show the supervisor table, the backfill's progress and the reset; and (issue 32) the charts of
lag in records and in time over the last hour (inline SVG, no script), the age of the table's
last commit, the lag policy, and a page per supervisor with its partitions, recent batches and
audit entries. Screenshots are kept as test artifacts (``$TEST_ARTIFACTS`` or ``test-artifacts/``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

import devservices
from reconciler.daemon import Daemon
from reconciler.errors import RetryableError
from reconciler.store.store import Store
from tests.e2e import helpers as h

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _browser(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--hide-scrollbars", *args], capture_output=True, text=True, timeout=120)


def _wait(what, cond, timeout=180.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    pytest.fail(f"no {what} within {timeout}s")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is installed by scripts/setup.sh --with-test-services")
def test_status_page_in_a_real_browser(tmp_path, kafka_broker, topic, spark):
    port = devservices.free_port()
    s = h.make_settings(tmp_path, http=f"127.0.0.1:{port}", lag_interval=0.5)
    name = topic(partitions=2)
    doc = h.spec_doc("page", h.kafka_source(kafka_broker.bootstrap, name),
                     lagPolicy={"maxRecords": 1_000_000, "action": "alert"})
    h.write_spec(s.specs, doc)
    first = devservices.make_records(2000)
    devservices.produce_kafka(kafka_broker.bootstrap, name, first, one_record_per_batch=False)

    daemon = Daemon(s)
    thread = threading.Thread(target=lambda: daemon.run(timeout=600), name="daemon", daemon=True)
    thread.start()
    Path(s.state_dir).mkdir(parents=True, exist_ok=True)
    store = None
    try:
        _wait("the database", lambda: (Path(s.state_dir) / "reconciler.db").exists(), 60)
        store = Store(s.db_url)

        def ingested() -> bool:
            try:  # the file exists before the daemon's migration made its tables
                return store.get("page") is not None and sum(store.checkpoints("page").values()) > 0
            except RetryableError:
                return False

        _wait("the first batch", ingested)

        h.write_spec(s.specs, {**doc, "suspended": True})
        _wait("SUSPENDED", lambda: store.get("page").state == "SUSPENDED", 60)
        second = devservices.make_records(3000, start=2000)
        ends = devservices.produce_kafka(kafka_broker.bootstrap, name, second)
        code, out = h.run_cli(s, "reset", "page", "--to", "latest", "--reason", "lag alarm INC-42")
        assert code == 0, out
        h.write_spec(s.specs, doc)  # resume: the main goes on from the new checkpoint
        _wait("the backfill completed", lambda: store.get("page-backfill-1") is not None
              and store.get("page-backfill-1").state == "COMPLETED")
        _wait("the main caught up", lambda: store.checkpoints("page") == {str(p): e for p, e in ends.items()})

        time.sleep(2)  # a few more lag observations for the charts
        url = f"http://127.0.0.1:{port}/"
        dom = _browser("--dump-dom", url)
        assert dom.returncode == 0, dom.stderr
        html = dom.stdout
        artifacts = Path(os.environ.get("TEST_ARTIFACTS", ROOT / "test-artifacts"))
        artifacts.mkdir(parents=True, exist_ok=True)
        shot = artifacts / "status-page.png"
        taken = _browser("--window-size=1600,900", f"--screenshot={shot}", url)
        assert taken.returncode == 0 and shot.stat().st_size > 10_000, taken.stderr
        page_url = f"http://127.0.0.1:{port}/supervisors/page"
        one = _browser("--dump-dom", page_url)
        assert one.returncode == 0, one.stderr
        one_html = one.stdout
        shot = artifacts / "status-page-supervisor.png"
        taken = _browser("--window-size=1400,1200", f"--screenshot={shot}", page_url)
        assert taken.returncode == 0 and shot.stat().st_size > 10_000, taken.stderr
        import urllib.error
        import urllib.request

        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/supervisors/nobody", timeout=10)
        assert missing.value.code == 404
    finally:
        daemon.request_stop()
        thread.join(120)
        if store is not None:
            store.close()

    assert '<table id="supervisors">' in html
    assert 'id="sup-page"' in html and 'id="sup-page-backfill-1"' in html
    row = html.split('id="sup-page-backfill-1"')[1].split("</tr>")[0]
    assert "<progress" in row and "3,000 / 3,000 (100%) completed" in row and "COMPLETED" in row
    resets = html.split('<table id="resets">')[1].split("</table>")[0]
    assert "reset-and-backfill" in resets and "lag alarm INC-42" in resets and "page-backfill-1" in resets
    assert 'http-equiv="refresh"' in html
    # issue 32: charts of the last hour, lag in time, the last commit's age, the policy, a link to its page
    main = html.split('id="sup-page"')[1].split("</tr>")[0]
    assert '<a href="/supervisors/page">' in main
    for chart in ("chart lag-records", "chart lag-seconds"):
        svg = main.split(f'class="{chart}"')[1].split("</svg>")[0]
        assert int(svg.split('data-points="')[1].split('"')[0]) >= 2, svg
    assert "<script" not in html and "<script" not in one_html
    assert main.split('class="num lag-seconds">')[1].startswith("0s")  # caught up: no record waits
    assert " ago" in main.split('class="num last-commit">')[1].split("</td>")[0]
    assert ">ok<" in main.split('class="policy">')[1]
    # the supervisor's own page: partitions, recent batches, audit entries
    assert '<h1 id="supervisor">page</h1>' in one_html
    partitions = one_html.split('<table id="partitions">')[1].split("</table>")[0]
    assert partitions.count("<tr>") == 3  # the header and two partitions
    batches = one_html.split('<table id="batches">')[1].split("</table>")[0]
    assert batches.count("<tr>") >= 2
    audit = one_html.split('<table id="audit">')[1].split("</table>")[0]
    assert "reset-and-backfill" in audit and "lag alarm INC-42" in audit and "create" in audit
    assert one_html.count("<svg") == 2

    # exactly once, main and backfill together
    h.assert_exactly_once(h.key_counts(spark, s, "page"), h.keys(first + second))

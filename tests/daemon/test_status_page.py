"""The status page (issue 14): loaded in a real headless browser (Debian's chromium) from a
daemon ingesting from a real Kafka broker, with a backfill made by a real reset. The page must
show the supervisor table, the backfill's progress and the reset; and (issue 32) the charts of
lag in records and in time over the last hour (inline SVG, no script), the age of the table's
last commit, the lag policy, and a page per supervisor with its partitions, recent batches and
audit entries. Issue 46: a suspended supervisor stays observed (its lag and lag in time on the
page while suspended, its history after the resume); three charts with a time axis and the
reset marked; the supervisors table fits 900 px. Screenshots (healthy, suspended, after a reset
with a backfill) are kept as test artifacts (``$TEST_ARTIFACTS`` or ``test-artifacts/``); the
README's are made by ``TEST_ARTIFACTS=docs/screenshots`` (and checked by eye).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

import devservices
from reconciler.daemon import Daemon
from reconciler.errors import RetryableError
from reconciler.store.store import Store
from tests.browser import CHROMIUM, needs_chromium
from tests.e2e import helpers as h

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]


def _browser(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--hide-scrollbars", *args], capture_output=True, text=True, timeout=120)


def _shoot(artifacts: Path, name: str, url: str, size: str = "1200,900") -> None:
    shot = artifacts / f"{name}.png"
    taken = _browser(f"--window-size={size}", f"--screenshot={shot}", url)
    assert taken.returncode == 0 and 10_000 < shot.stat().st_size < 300_000, taken.stderr


def _dom(url: str) -> str:
    dom = _browser("--dump-dom", url)
    assert dom.returncode == 0, dom.stderr
    return dom.stdout


def _widths_at_900(url: str, tmp_path: Path) -> tuple[int, int]:
    """The supervisors table's and the page's widths laid out by chromium in a 900 px window
    (the page has no script: one is added to a copy, which reports them in the DOM)."""
    html = urllib.request.urlopen(url, timeout=10).read().decode()
    probe = ("<script>document.body.setAttribute('data-widths', document.getElementById('supervisors')"
             ".scrollWidth + ',' + document.documentElement.scrollWidth)</script>")
    copy = tmp_path / "at900.html"
    copy.write_text(html.replace('<meta http-equiv="refresh" content="5">', "").replace("</body>", probe + "</body>"))
    dom = _browser("--window-size=900,900", "--dump-dom", copy.as_uri())
    table, page = dom.stdout.split('data-widths="')[1].split('"')[0].split(",")
    return int(table), int(page)


def _status(url: str) -> str:
    return urllib.request.urlopen(url, timeout=10).read().decode()


def _wait(what, cond, timeout=180.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    pytest.fail(f"no {what} within {timeout}s")


@needs_chromium
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
        url = f"http://127.0.0.1:{port}/"
        page_url = f"http://127.0.0.1:{port}/supervisors/page"
        artifacts = Path(os.environ.get("TEST_ARTIFACTS", ROOT / "test-artifacts"))
        artifacts.mkdir(parents=True, exist_ok=True)
        time.sleep(3)  # a few lag observations for the charts
        _shoot(artifacts, "status-healthy", url)
        _shoot(artifacts, "supervisor-healthy", page_url)

        h.write_spec(s.specs, {**doc, "suspended": True})
        _wait("SUSPENDED", lambda: store.get("page").state == "SUSPENDED", 60)
        second = devservices.make_records(3000, start=2000)
        ends = devservices.produce_kafka(kafka_broker.bootstrap, name, second)
        # issue 46.2: suspended, it is still observed: its lag grows on the page, in time too
        _wait("the suspended lag observed", lambda: '<td class=num>3,000</td>' in _status(url), 30)
        time.sleep(2)
        suspended = _dom(url).split('id="sup-page"')[1].split("</tr>")[0]
        assert "st-SUSPENDED" in suspended and ">3,000<" in suspended
        assert "?" not in suspended.split('class="num lag-seconds">')[1].split("</td>")[0]
        _shoot(artifacts, "status-suspended", url)
        _shoot(artifacts, "supervisor-suspended", page_url)
        code, out = h.run_cli(s, "reset", "page", "--to", "latest", "--reason", "lag alarm INC-42")
        assert code == 0, out
        h.write_spec(s.specs, doc)  # resume: the main goes on from the new checkpoint
        _wait("the backfill completed", lambda: store.get("page-backfill-1") is not None
              and store.get("page-backfill-1").state == "COMPLETED")
        _wait("the main caught up", lambda: store.checkpoints("page") == {str(p): e for p, e in ends.items()})

        time.sleep(3)  # a few more lag observations for the charts
        html = _dom(url)
        _shoot(artifacts, "status-after-reset", url)
        one_html = _dom(page_url)
        _shoot(artifacts, "supervisor-after-reset", page_url, "1200,1400")
        _shoot(artifacts, "status-after-reset-900px", url, "900,900")  # checked by eye at 900 px too
        _shoot(artifacts, "supervisor-after-reset-900px", page_url, "900,1400")
        table_width, page_width = _widths_at_900(url, tmp_path)
        import urllib.error

        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/supervisors/nobody", timeout=10)
        assert missing.value.code == 404
        with pytest.raises(urllib.error.HTTPError) as unknown:  # it answered /metrics with 200
            urllib.request.urlopen(f"http://127.0.0.1:{port}/foo/bar", timeout=10)
        assert unknown.value.code == 404 and "/supervisors/ID" in unknown.value.read().decode()
    finally:
        daemon.request_stop()
        thread.join(120)
        if store is not None:
            store.close()

    assert '<table id="supervisors">' in html
    assert 'id="sup-page"' in html and 'id="sup-page-backfill-1"' in html
    row = html.split('id="sup-page-backfill-1"')[1].split("</tr>")[0]
    assert "<progress" in row and "3,000 / 3,000 (100%) completed" in row and "COMPLETED" in row
    # issue 46: a completed backfill has no lag, in its row and its charts, and its ingestion is charted
    assert row.split('class="num lag-seconds">')[1].startswith("0s")
    done = html.split('id="charts-page-backfill-1"')[1].split("</tr>")[0]
    assert "now 0 ·" in done.split('class="chart lag-records"')[1] and "now 0s ·" in done.split('lag-seconds"')[1]
    assert "no samples" not in done.split('class="chart ingest-rate"')[1].split("</svg>")[0]
    resets = html.split('<table id="resets">')[1].split("</table>")[0]
    assert "reset-and-backfill" in resets and "lag alarm INC-42" in resets and "page-backfill-1" in resets
    assert 'http-equiv="refresh"' in html
    # issue 32: charts of the last hour, lag in time, the last commit's age, the policy, a link to its page
    main = html.split('id="sup-page"')[1].split("</tr>")[0]
    assert '<a href="/supervisors/page">' in main
    main_charts = html.split('id="charts-page"')[1].split("</tr>")[0]
    for chart in ("chart lag-records", "chart lag-seconds", "chart ingest-rate"):
        svg = main_charts.split(f'class="{chart}"')[1].split("</svg>")[0]
        assert int(svg.split('data-points="')[1].split('"')[0]) >= 2, svg
        assert '<g class="marker reset">' in svg and 'class="tick"' in svg  # the reset on the time axis
    records = main_charts.split('class="chart lag-records"')[1].split("</svg>")[0]
    assert "max 3,000" in records  # the lag built up while suspended is still in the history
    assert table_width <= 860 and page_width <= 900, (table_width, page_width)  # readable at 900 px
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
    assert one_html.count("<svg") == 3

    # exactly once, main and backfill together
    h.assert_exactly_once(h.key_counts(spark, s, "page"), h.keys(first + second))

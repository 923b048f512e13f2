"""The status page is rendered once for the requests that ask for it together (issue 41.3)."""

from __future__ import annotations

import http.client
import threading
import time

from reconciler.observe.metrics import Metrics, serve
from reconciler.observe.snapshot import SharedRender


def _get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def test_concurrent_page_requests_over_real_sockets_share_one_rendering():
    calls: list[str] = []

    def render(path: str) -> str:
        calls.append(path)
        time.sleep(0.5)  # long enough for every request to arrive while it runs
        return f"<!doctype html><p>rendering {len(calls)}</p>" + "z" * 500_000

    shared = SharedRender(render, max_age=30.0)
    srv = serve(Metrics(), "127.0.0.1:0", page=shared.get)
    port = srv.server_address[1]
    answers: list[tuple[int, bytes]] = []
    try:
        threads = [threading.Thread(target=lambda: answers.append(_get(port, "/"))) for _ in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(answers) == 12 and {status for status, _ in answers} == {200}
        assert {body for _, body in answers} == {answers[0][1]} and b"rendering 1" in answers[0][1]
        assert calls == ["/"] and shared.renders == 1
        assert _get(port, "/")[0] == 200 and calls == ["/"]  # within max_age: the same bytes again
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_rendering_older_than_max_age_is_renewed_and_paths_are_apart():
    calls: list[str] = []
    shared = SharedRender(lambda path: calls.append(path) or f"{path} {len(calls)}", max_age=0.2)
    assert shared.get("/") == "/ 1" and shared.get("/") == "/ 1"
    assert shared.get("/supervisors/a") == "/supervisors/a 2"
    time.sleep(0.25)
    assert shared.get("/") == "/ 3"
    assert shared.renders == 3


def test_a_failed_rendering_reaches_its_waiters_and_is_not_kept():
    gate = threading.Event()
    attempts: list[int] = []

    def render(path: str) -> str:
        attempts.append(1)
        if len(attempts) == 1:
            gate.wait(5)
            raise RuntimeError("database is locked")
        return "fine"

    shared = SharedRender(render, max_age=30.0)
    errors: list[str] = []

    def ask() -> None:
        try:
            shared.get("/")
        except RuntimeError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=ask) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    gate.set()
    for t in threads:
        t.join(5)
    assert errors == ["database is locked"] * 3 and len(attempts) == 1
    assert shared.get("/") == "fine" and len(attempts) == 2


def test_max_age_zero_still_shares_a_rendering_in_flight():
    started, release = threading.Event(), threading.Event()
    calls: list[int] = []

    def render(path: str) -> str:
        calls.append(1)
        started.set()
        release.wait(5)
        return "page"

    shared = SharedRender(render, max_age=0.0)
    got: list[str | None] = []
    first = threading.Thread(target=lambda: got.append(shared.get("/")))
    first.start()
    started.wait(5)
    second = threading.Thread(target=lambda: got.append(shared.get("/")))
    second.start()
    time.sleep(0.1)
    release.set()
    first.join(5)
    second.join(5)
    assert got == ["page", "page"] and calls == [1]

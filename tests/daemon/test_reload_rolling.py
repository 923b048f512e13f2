"""SIGHUP applies ``rollingCompaction`` to the running leader's compactor (issue 45), as it
applies ``compactInterval``: in the same term, from its next look on."""

from __future__ import annotations

import threading

from reconciler import settings as settings_mod
from reconciler.daemon import Daemon
from tests.daemon.test_reload import _config, _wait, clean_environment  # noqa: F401 - autouse fixture


def test_reload_turns_the_rolling_compaction_on_and_off(tmp_path):
    (tmp_path / "specs").mkdir()
    config = _config(tmp_path, rollingCompaction="0")
    daemon = Daemon(settings_mod.load({}, config), config_path=config)
    thread = threading.Thread(target=daemon.run, kwargs={"timeout": 120}, daemon=True)
    thread.start()
    try:
        _wait(lambda: daemon.manager is not None)
        compactor, token = daemon.manager.compactor, daemon.lease_token
        assert compactor.rolling_every == 0 and compactor.next_rolling() == float("inf")
        _config(tmp_path, rollingCompaction="1s")
        daemon.request_reload()
        _wait(lambda: compactor.rolling_every == 1.0)
        assert daemon.lease_token == token and daemon.manager.compactor is compactor
        _wait(lambda: compactor._last_rolling is not None)  # due a second after the term began: it ran
        _wait(lambda: not compactor.running)
        assert compactor.last_error is None, compactor.last_error
        _config(tmp_path, rollingCompaction="0")
        daemon.request_reload()
        _wait(lambda: compactor.rolling_every == 0.0)
        assert compactor.next_rolling() == float("inf")
    finally:
        daemon.request_stop()
        thread.join(60)
    assert not thread.is_alive()

"""A local session's Python workers are reached over a Unix socket in a short private
directory (``sparkconf.local_socket_conf``), or over TCP where no such path fits."""

from __future__ import annotations

import os
import tempfile

import pytest

from reconciler.pipeline import sparkconf


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(sparkconf, "_socket_dir", None)


def test_the_socket_directory_is_private_and_short_enough_for_a_socket(fresh):
    conf = sparkconf.local_socket_conf()
    path = conf["spark.python.unix.domain.socket.dir"]
    assert conf["spark.python.unix.domain.socket.enabled"] == "true"
    assert os.path.isdir(path) and os.stat(path).st_mode & 0o777 == 0o700
    assert len(f"{path}/.{'u' * 36}.sock") <= 107
    assert sparkconf.local_socket_conf() == conf  # one directory per process


def test_a_long_temporary_directory_gives_way_to_tmp(fresh, monkeypatch, tmp_path):
    long = tmp_path / ("deep" * 20)
    long.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long))
    path = sparkconf.local_socket_conf()["spark.python.unix.domain.socket.dir"]
    assert path.startswith("/tmp/rsock-")


def test_no_short_enough_path_keeps_tcp(fresh, monkeypatch):
    monkeypatch.setattr(sparkconf, "_SOCKET_PATH_MAX", 20)
    assert sparkconf.local_socket_conf() == {}
    assert sparkconf.local_socket_conf() == {}  # decided once


def test_a_session_on_a_cluster_master_gets_none_of_it():
    assert not any("unix.domain" in key for key in {**sparkconf.STATIC_CONF, **sparkconf.SQL_CONF})

"""``DUPLEX_FAULTS`` parsing and the log faults it installs (the reliability tests rely on them)."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest

from duplex_actors.config import ConfigError
from duplex_actors.faults import Faults
from duplex_actors.log import writer


def test_log_faults_parse_with_their_options(tmp_path: Path) -> None:
    f = Faults.parse(f"log_create_error={tmp_path}/a:EACCES,fsync_stall={tmp_path}/b:250")
    assert f.log_create_error == tmp_path / "a" and f.log_create_errno == errno.EACCES
    assert f.fsync_stall == tmp_path / "b" and f.fsync_stall_ms == 250 and f.active
    assert Faults.parse(f"log_create_error={tmp_path}/a").log_create_errno == errno.ENOSPC
    assert Faults.parse(f"fsync_error={tmp_path}/c").fsync_errno == errno.EIO
    g = Faults.parse(f"fsync_error={tmp_path}/c:ENOSPC")
    assert g.fsync_error == tmp_path / "c" and g.fsync_errno == errno.ENOSPC
    with pytest.raises(ConfigError, match="unknown errno"):
        Faults.parse(f"log_create_error={tmp_path}/a:ENOTANERRNO")
    with pytest.raises(ConfigError, match="fsync_stall wants PATH:MS"):
        Faults.parse(f"fsync_stall={tmp_path}/b")


def test_installed_log_faults_fire_only_while_their_trigger_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer, "_create_file", writer._create_file)  # restored after the test
    monkeypatch.setattr(os, "fdatasync", os.fdatasync)
    create, stall = tmp_path / "create", tmp_path / "stall"
    Faults.parse(f"log_create_error={create}:EACCES,fsync_stall={stall}:50").install_log_faults()
    create.touch()
    with pytest.raises(PermissionError) as info:
        writer._create_file(tmp_path / "x.dlog")
    assert info.value.errno == errno.EACCES and not (tmp_path / "x.dlog").exists()
    assert isinstance(writer.probe_dir(tmp_path), PermissionError)  # the probe goes through it too
    create.unlink()
    fd = writer._create_file(tmp_path / "x.dlog")
    try:
        stall.touch()
        t0 = time.perf_counter()
        os.fdatasync(fd)
        stalled = time.perf_counter() - t0
    finally:
        os.close(fd)
    assert stalled >= 0.05  # a lower bound: the injected sleep
    assert writer.probe_dir(tmp_path) is None

"""Telling a dead local lease owner from a live or remote one."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from tether.runtime.ops.runner import op_id_for
from tether.runtime.takeover import owner_is_dead


def test_live_dead_and_remote_owners() -> None:
    host = socket.gethostname()
    assert owner_is_dead(f"{host}:{os.getpid()}") is False
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert owner_is_dead(f"{host}:{child.pid}") is True
    assert owner_is_dead(f"some-other-host:{child.pid}") is False
    assert owner_is_dead(None) is False
    assert owner_is_dead("worker-without-pid") is False


def test_op_ids_are_deterministic_and_distinct() -> None:
    assert op_id_for("t1", 3, 0) == op_id_for("t1", 3, 0)
    ids = {op_id_for(t, r, c) for t in ("t1", "t2") for r in (1, 2, 11) for c in (0, 1)}
    assert len(ids) == 12

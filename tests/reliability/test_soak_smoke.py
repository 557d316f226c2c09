"""The soak (`benchmarks/soak.py`) at a small size: a task of 6 items x 8 tickets against
the real ticket service, its `tether` process SIGKILLed 4 times and resumed, on SQLite
and on PostgreSQL. Asserts what must hold whatever the machine's speed: the task is
satisfied, each intended effect happened once (no duplicate, none missing, each ticket
made by the op journaled for it), the log is gapless with one final result per intent,
`rebuild` equals the log, and the kills did happen. The figures are printed, not
asserted; the full run is `python benchmarks/soak.py --full`."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ITEMS, CALLS, KILLS = 6, 8, 4

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _soak(tmp_path: Path, *args: str) -> dict[str, object]:
    out = tmp_path / "soak.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--items", str(ITEMS),
           "--calls", str(CALLS), "--kills", str(KILLS), "--json", str(out), *args]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=280)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "seed=" in proc.stdout
    (result,) = json.loads(out.read_text())
    return dict(result)


def _check(r: dict[str, object]) -> None:
    assert r["violations"] == []
    assert r["status"] == "satisfied"
    assert (r["tickets"], r["duplicates"], r["missing"]) == (ITEMS * CALLS, 0, 0)
    assert r["rounds"] == ITEMS * CALLS
    assert r["kills"] == KILLS and r["processes"] == KILLS + 1


def test_soak_sqlite(tmp_path: Path) -> None:
    _check(_soak(tmp_path, "--store", "sqlite"))


@pytest.mark.postgres
def test_soak_postgres(tmp_path: Path, pg_schema_url: Callable[[], str]) -> None:
    base = pg_schema_url().split("?", 1)[0]  # the fixture skips when there is no server
    _check(_soak(tmp_path, "--store", "postgres", "--pg-url", base))

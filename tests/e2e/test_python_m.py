"""`python -m tether` is the `tether` command, as `python -m tether.cli` is."""

from __future__ import annotations

import subprocess
import sys


def test_python_m_tether_runs_the_command() -> None:
    for module in ("tether", "tether.cli"):
        proc = subprocess.run(
            [sys.executable, "-m", module, "--help"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        assert "durable runtime for long-running LLM agents" in proc.stdout

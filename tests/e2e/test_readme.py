"""The README's Python examples run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_readme_has_python_examples() -> None:
    assert len(python_blocks()) >= 1


def test_readme_python_examples_run(tmp_path: Path) -> None:
    for n, block in enumerate(python_blocks()):
        script = tmp_path / f"example_{n}.py"
        script.write_text(block, encoding="utf-8")
        res = subprocess.run(
            [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60
        )
        assert res.returncode == 0, f"README example {n} failed:\n{res.stderr}"

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


def _section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def test_readme_sources_walkthrough_runs(tmp_path: Path) -> None:
    """The "Sources, evidence and change" spec and commands, run as written: the spec
    is the YAML block, the commands the bash block, with the scripted analyst of the
    end-to-end scenario as the model and the task's id for TASK. The documents are the
    test corpus."""
    import json
    import shlex
    import shutil

    from tests.support.cli import cli_env, describe, tether

    section = _section("Sources, evidence and change")
    (spec,) = re.findall(r"```yaml\n(.*?)```", section, re.S)
    (commands,) = re.findall(r"```bash\n(.*?)```", section, re.S)
    name = spec.splitlines()[0].lstrip("# ").strip()
    (tmp_path / name).write_text(spec, encoding="utf-8")
    shutil.copytree(README.parent / "tests" / "data" / "corpus_ab", tmp_path / "corpus")
    env = cli_env(TETHER_DB=f"sqlite:///{tmp_path / 'tether.db'}")
    task = ""
    shown: list[str] = []
    for line in commands.splitlines():
        args = shlex.split(line.split("#")[0])
        if not args:
            continue
        assert args[0] == "tether", line
        args = [task if a == "TASK" else a for a in args[1:]]
        if "--model" in args:
            args[args.index("--model") + 1] = "scripted:tests.e2e.ab_policies:analyst"
        res = tether(*args, cwd=tmp_path, env=env, timeout=120)
        assert res.returncode == 0, f"{line}\n{describe(res)}"
        shown.append(res.stdout)
        if not task:
            listed = tether("list", "--json", cwd=tmp_path, env=env)
            task = json.loads(listed.stdout)[0]["task_id"]
    assert "sources: A 1.0 (snapshot), B 2.0 (snapshot)" in shown[1]
    tree = shown[3]
    for kind in ("source_snapshot", "evidence", "claim", "report_section", "report"):
        assert kind in tree, tree
    assert tree.count("changed from version 2.0 to 3.0") >= 9  # snapshot, 3 quotes, 3 claims...
    assert "sources: A 1.0 (snapshot), B 3.0 (snapshot)" in shown[-1]
    assert "invalid artifact" in shown[-1]
    report = (tmp_path / "report.md").read_text()
    assert "B 3.0" in report and "B 2.0" not in report and "## Open questions" in report

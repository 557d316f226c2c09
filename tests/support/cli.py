"""Running the real `tether` command in a subprocess, for the end-to-end tests.

- `tether(*args, cwd=...)`: run the installed console script (or `python -m tether.cli`
  when it is not next to the interpreter) with a controlled environment: no
  `TETHER_*` variables, no provider keys, the repository root on `PYTHONPATH` so that
  `--model scripted:tests.e2e.policies:<name>` imports.
- `assert_clean_error(proc, code, ...)`: the exit code, and a short one-paragraph
  message on stderr without a traceback.
- `write_spec(path, n_items)`: a small spec whose items are judged by `done_when` op
  rules (`models.judge: rules`), one file `out/<id>.txt` per item.
- `gated_run(folder, ...)`: a `tether run` held in its second model call (mid-turn),
  returned once its first round wrote its file; `wait_for_file` is that wait.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DONE = "scripted:tests.e2e.policies:done_policy"
SLOW = "scripted:tests.e2e.policies:slow_policy"
FAST = "scripted:tests.e2e.policies:fast_policy"
GATED = "scripted:tests.e2e.policies:gated_policy"

_DROP_PREFIXES = ("TETHER_",)
_DROP = {
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
    "DEEPSEEK_API_KEY",
    "DEEPSEEK_BASE_URL",
    "FORCE_COLOR",
    "PYTHONSTARTUP",
}


def tether_command() -> list[str]:
    """The `tether` entry point next to the running interpreter, else `python -m`."""
    exe = Path(sys.executable).parent / "tether"
    if exe.is_file() and os.access(exe, os.X_OK):
        return [str(exe)]
    found = shutil.which("tether", path=str(Path(sys.executable).parent))
    if found:
        return [found]
    return [sys.executable, "-m", "tether.cli"]


def cli_env(**extra: str | None) -> dict[str, str]:
    """A clean environment for the CLI; `extra` sets (or, with None, removes) variables."""
    env = {
        k: v for k, v in os.environ.items() if k not in _DROP and not k.startswith(_DROP_PREFIXES)
    }
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + old if old else "")
    env["NO_COLOR"] = "1"
    env["TERM"] = "dumb"
    env["COLUMNS"] = "200"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def tether(
    *args: str | Path,
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> subprocess.CompletedProcess[str]:
    """Run `tether ARGS` in `cwd` and capture its output."""
    return subprocess.run(
        [*tether_command(), *map(str, args)],
        cwd=cwd,
        env=env if env is not None else cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def tether_many(
    calls: list[tuple[tuple[str | Path, ...], Path]],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> list[subprocess.CompletedProcess[str]]:
    """Run several independent `tether` commands `(args, cwd)` at once (the interpreter
    start-up dominates each one); results in the order given."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = [pool.submit(tether, *a, cwd=c, env=env, timeout=timeout) for a, c in calls]
        return [f.result() for f in futures]


def popen_tether(
    *args: str | Path, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """Start `tether ARGS` in `cwd` without waiting."""
    return subprocess.Popen(
        [*tether_command(), *map(str, args)],
        cwd=cwd,
        env=env if env is not None else cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )


def describe(proc: subprocess.CompletedProcess[str]) -> str:
    """Exit code and output, for assertion messages."""
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


def assert_ok(proc: subprocess.CompletedProcess[str]) -> None:
    """Exit 0."""
    assert proc.returncode == 0, describe(proc)


def assert_clean_error(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    """Exit `code`, nothing on stdout, and on stderr one short paragraph without a
    traceback that contains every needle (case-insensitive). Returns the message."""
    assert proc.returncode == code, describe(proc)
    msg = proc.stderr.strip()
    assert msg, f"no error message on stderr\n{describe(proc)}"
    assert "Traceback" not in msg, describe(proc)
    assert 'File "' not in msg, describe(proc)
    assert "\n\n" not in msg, f"more than one paragraph\n{describe(proc)}"
    assert len(msg) <= 1200 and len(msg.splitlines()) <= 12, f"too long\n{describe(proc)}"
    assert proc.stdout.strip() == "", f"unexpected output on stdout\n{describe(proc)}"
    for needle in needles:
        assert needle.lower() in msg.lower(), f"{needle!r} not in the message\n{describe(proc)}"
    return msg


def spec_dict(n_items: int = 3, *, name: str = "small", **extra: Any) -> dict[str, Any]:
    """A spec with `n_items` items, each done when `out/<id>.txt` was written."""
    items = [
        {
            "id": f"i{n}",
            "title": f"Write out/i{n}.txt",
            "done_when": {"kind": "op", "tool": "write_file", "args": {"path": f"out/i{n}.txt"}},
        }
        for n in range(1, n_items + 1)
    ]
    spec: dict[str, Any] = {
        "name": name,
        "objective": f"Write {n_items} small files under out/",
        "items": items,
        "tools": ["write_file"],
        "models": {"judge": "rules"},
    }
    spec.update(extra)
    return spec


def write_spec(path: Path, n_items: int = 3, **extra: Any) -> Path:
    """Write `spec_dict(n_items, **extra)` as YAML to `path`."""
    path.write_text(yaml.safe_dump(spec_dict(n_items, **extra), sort_keys=False), "utf-8")
    return path


def json_out(proc: subprocess.CompletedProcess[str]) -> Any:
    """The JSON a successful `--json` command printed."""
    assert_ok(proc)
    return json.loads(proc.stdout)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (relative path -> bytes)."""
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def wait_for_file(path: Path, proc: subprocess.Popen[str], timeout: float = 60.0) -> None:
    """Wait until `path` exists; fail (with the process's output) if `proc` ends first
    or `timeout` passes."""
    import pytest

    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"tether run ended early ({proc.returncode})\n{out}\n{err}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{path} never appeared")
        time.sleep(0.02)


def gated_run(
    folder: Path, db: str, n_items: int, *, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], str]:
    """`tether run --db DB` of a `write_spec` task in `folder` whose model holds its
    second answer until a file `release` exists there: returned once the first round
    wrote `out/i1.txt` (the run is then mid-turn), with the task id."""
    write_spec(folder / "spec.yaml", n_items, name="gated")
    proc = popen_tether("run", "spec.yaml", "--model", GATED, "--db", db, cwd=folder, env=env)
    wait_for_file(folder / "out" / "i1.txt", proc)
    tasks = json_out(tether("list", "--json", "--db", db, cwd=folder))
    return proc, str(tasks[0]["task_id"])


def finish(proc: subprocess.Popen[str], timeout: float = 60.0) -> tuple[str, str]:
    """Wait for `proc` to end: its (stdout, stderr); killed if it does not end in time."""
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return out or "", err or ""

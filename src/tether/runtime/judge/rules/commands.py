"""Shell commands the judges run: a rule's `command` check and the contract's
acceptance commands."""

from __future__ import annotations

import asyncio
from pathlib import Path


async def run_command(command: str, cwd: Path | None, timeout: float) -> tuple[int, str]:
    """Run `command` in a shell in `cwd`; its exit code and its output (stdout and
    stderr together). A command past `timeout` seconds is killed: exit -1."""
    proc = await asyncio.create_subprocess_shell(
        command,
        cwd=str(cwd) if cwd else None,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return -1, f"timed out after {timeout}s"
    return proc.returncode if proc.returncode is not None else -1, out.decode(errors="replace")

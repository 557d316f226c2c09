"""Fail points for fault-injection tests.

`TETHER_FAILPOINTS="name[=count[:action]],..."` acts the count-th time (default: first)
the process reaches the named point. The default action, `exit`, ends the process at once
with `os._exit(137)`: exiting without cleanup is the point, it imitates a SIGKILL at
exactly that step. `stop` freezes the process with SIGSTOP instead (a GC pause, a frozen
VM, a debugger), holding whatever it holds at that step, until a SIGCONT or a SIGKILL.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Final

KNOWN: Final[frozenset[str]] = frozenset(
    {
        "before_model_call",
        "after_model_response",
        "after_op_intent",
        "after_op_dispatch",
        "after_op_result",
        "after_compensation",
        "after_round_commit",
        "before_ledger_write",
        "during_compaction",
        "during_commit",
        "during_claim",
        "before_notice_send",
        "after_notice_send",
        "after_notice_commit",
        "before_verify_commit",
        "after_verify_commit",
        "before_takeover_commit",
        "before_edit_apply",
        "after_edit_apply",
        "after_pause_request",
        "before_pause_apply",
    }
)
ACTIONS: Final[frozenset[str]] = frozenset({"exit", "stop"})

_config: dict[str, tuple[int, str]] | None = None
_hits: dict[str, int] = {}


def _parse(text: str) -> dict[str, tuple[int, str]]:
    """The fail points of `text`. A part that names no known point, or has a count or
    action that cannot be, is left out with a line on stderr: a misspelt fail point
    must not let a fault test pass by never firing."""
    out: dict[str, tuple[int, str]] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, _, rest = part.partition("=")
        name = name.strip()
        count_text, _, action = rest.partition(":")
        action = action.strip() or "exit"
        problem = ""
        if name not in KNOWN:
            problem = f"unknown point {name!r}; known: {', '.join(sorted(KNOWN))}"
        elif action not in ACTIONS:
            problem = f"unknown action {action!r} for {name}; known: exit, stop"
        elif count_text.strip() and not (count_text.strip().isdigit() and int(count_text) > 0):
            problem = f"the count of {name} must be a whole number from 1, not {count_text!r}"
        if problem:
            sys.stderr.write(f"tether: TETHER_FAILPOINTS: {problem} (ignored)\n")
            continue
        out[name] = (int(count_text) if count_text.strip() else 1, action)
    return out


def reset() -> None:
    """Re-read the environment (tests that change it in-process)."""
    global _config
    _config = None
    _hits.clear()


def hit(name: str) -> None:
    """Mark that the process reached `name`; exit if the fail point says so."""
    global _config
    if _config is None:
        _config = _parse(os.environ.get("TETHER_FAILPOINTS", ""))
    if not _config or name not in _config:
        return
    _hits[name] = _hits.get(name, 0) + 1
    count, action = _config[name]
    if _hits[name] != count:
        return
    if action == "stop":
        sys.stderr.write(f"tether: fail point {name} reached, stopping (pid {os.getpid()})\n")
        sys.stderr.flush()
        # To this thread: a SIGSTOP sent to the process may be taken by another thread,
        # and this one would run on (and commit) until the group stop reaches it.
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
        return
    sys.stderr.write(f"tether: fail point {name} reached, exiting\n")
    sys.stderr.flush()
    os._exit(137)

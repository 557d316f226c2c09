"""Property: progress is measured from what a round did.

Hypothesis draws the rounds an agent spends on one item, mixing honest rounds that
bring something new for it (a file never read, a new scratch write, a probe whose answer
changes, a check that fails differently from before) with rounds that bring nothing (the
same read with the same result, the same failing call failing the same way, words only),
then the write that finishes the item, and runs them through the engine with the rules
judge. What the runtime must do:

- an item whose rounds keep producing new information, with at most one round between
  them that brings nothing (a words-only round between working rounds is tolerated), is
  never blocked before the per-item cap (`limits.max_rounds_per_item`), and is blocked
  at the cap if it is still open then;
- a stretch of rounds that brings nothing (the same call with the same result, the same
  failure, or talk) blocks the item within the stated bound: `no_progress_rounds` rounds
  after the last round that moved it, plus the one tolerated words-only round;
- a block never happens inside an honest stretch, and the item after a blocked one still
  runs and finishes.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.adversarial._honest import block_events, registry_with
from tests.support.adversarial import assert_honest, contract
from tests.support.loop import ledger_of, run_task
from tether import errors
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.store.memory import MemoryStore
from tether.tools.registry import Tool, tool

#: Kinds of round that bring something new for the item.
NEW = ("read_new", "write_new", "probe", "check")
#: Kinds of round that bring nothing.
NOTHING = ("reread", "fail_same", "talk")


@dataclass
class Script:
    """The rounds for the item `target`, then the write that finishes it."""

    kinds: list[str]

    def moved(self) -> list[bool]:
        """Which rounds bring something new (a call failing for the first time is new,
        as a failure that changed is; `fail_same` again is not)."""
        out = []
        failed_before = False
        for k in self.kinds:
            if k == "fail_same":
                out.append(not failed_before)
                failed_before = True
            else:
                out.append(k in NEW)
        return out


def _tools(counter: dict[str, int]) -> list[Tool]:
    @tool(name="probe", effect="read", description="Read a gauge that changes.")
    def probe() -> str:
        counter["probe"] = counter.get("probe", 0) + 1
        return f"gauge reading {counter['probe'] * 7}"

    @tool(name="check", effect="read", description="Run the checks.")
    def check() -> str:
        counter["check"] = counter.get("check", 0) + 1
        raise errors.ToolFailed(f"{40 - counter['check']} checks failed")

    return [probe, check]


def _actor(script: Script) -> Any:
    rounds = iter(enumerate(script.kinds))

    def actor(request: ModelRequest) -> ModelResponse:
        nxt = request.ledger["next"] if request.ledger else None
        if nxt == "after":
            return ModelResponse(
                "the other item", (tool_call("write_file", path="out/after.txt", content="a"),)
            )
        if nxt != "target":
            return ModelResponse("nothing open")
        n, kind = next(rounds, (-1, "finish"))
        if n == 0:
            # The first round always reads the seed, so a later round can repeat it.
            return ModelResponse("reading", (tool_call("read_file", path="seed.txt"),))
        call = {
            "read_new": lambda: tool_call("read_file", path=f"notes/n{n}.txt"),
            "write_new": lambda: tool_call("write_file", path=f"scratch/s{n}.txt", content=f"v{n}"),
            "probe": lambda: tool_call("probe"),
            "check": lambda: tool_call("check"),
            "reread": lambda: tool_call("read_file", path="seed.txt"),
            "fail_same": lambda: tool_call("read_file", path="missing.txt"),
            "finish": lambda: tool_call("write_file", path="out/target.txt", content="done"),
        }.get(kind)
        if call is None:  # talk
            return ModelResponse("Thinking about the next step; no call this round.")
        return ModelResponse(kind, (call(),))

    return actor


async def _run(
    script: Script, limits: dict[str, int]
) -> tuple[list[tuple[int, str, str]], str, dict[str, str]]:
    spec = contract(
        [
            {
                "id": "target",
                "title": "write out/target.txt",
                "done_when": {"kind": "file", "path": "out/target.txt"},
            },
            {
                "id": "after",
                "title": "write out/after.txt",
                "done_when": {"kind": "file", "path": "out/after.txt"},
            },
        ],
        tools=["read_file", "write_file", "list_files", "probe", "check"],
        **({"limits": limits} if limits else {}),
    )
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp)
        (ws / "seed.txt").write_text("seed\n")
        (ws / "notes").mkdir()
        for n in range(len(script.kinds)):
            (ws / "notes" / f"n{n}.txt").write_text(f"note {n}\n")
        store = await MemoryStore.open()
        counter: dict[str, int] = {}
        tid, result = await run_task(
            store,
            spec,
            ws,
            ScriptedModel(policy=_actor(script)),
            registry=registry_with(store, _tools(counter)),
        )
        blocks = await block_events(store, tid)
        led = await ledger_of(store, tid)
        await assert_honest(store, tid, spec)
        await store.close()
    return blocks, result.status, {d.id: s.status for d, s in led.items()}


def _runs(moved: Sequence[bool]) -> list[tuple[int, int]]:
    """(first round, length) of each stretch of rounds that brought nothing (rounds
    numbered from 1)."""
    out: list[tuple[int, int]] = []
    for k, m in enumerate(moved, start=1):
        if m:
            continue
        if out and out[-1][0] + out[-1][1] == k:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((k, 1))
    return out


SETTINGS = settings(
    max_examples=50,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@st.composite
def honest_script(draw: Any) -> Script:
    """Rounds that bring something new, with at most one round that brings nothing
    between two that do."""
    kinds = ["read_new"]
    for _ in range(draw(st.integers(0, 14))):
        kind = draw(st.sampled_from([*NEW, "talk"]))
        moved = Script([*kinds, kind]).moved()
        if not moved[-1] and not moved[-2]:
            kind = "read_new"  # never two rounds in a row that bring nothing
        kinds.append(kind)
    return Script(kinds)


@SETTINGS
@given(script=honest_script(), cap=st.integers(4, 12), npr=st.integers(2, 4))
def test_new_information_is_never_blocked_before_the_cap(
    script: Script, cap: int, npr: int
) -> None:
    blocks, status, statuses = asyncio.run(
        _run(script, {"max_rounds_per_item": cap, "no_progress_rounds": npr})
    )
    rounds = len(script.kinds) + 1  # and the finishing write
    assert all(r >= cap for r, _, _ in blocks), (blocks, script.kinds)
    if rounds <= cap:
        assert blocks == [] and status == "satisfied", (blocks, script.kinds)
    else:
        # Still open at the cap: blocked there, by the cap, and the next item ran.
        assert [(r, i) for r, i, _ in blocks] == [(cap, "target")], (blocks, script.kinds)
        assert "max_rounds_per_item" in blocks[0][2]
        assert statuses == {"target": "blocked", "after": "done"}


@st.composite
def mixed_script(draw: Any) -> Script:
    """Honest rounds and stretches of rounds that bring nothing, in any order."""
    kinds = ["read_new"]
    for _ in range(draw(st.integers(1, 6))):
        kinds += draw(st.lists(st.sampled_from(NEW), min_size=1, max_size=3))
        kinds += draw(st.lists(st.sampled_from(NOTHING), min_size=0, max_size=6))
    return Script(kinds)


@SETTINGS
@given(script=mixed_script(), npr=st.integers(2, 4))
def test_a_stretch_that_brings_nothing_is_blocked_within_the_bound(
    script: Script, npr: int
) -> None:
    blocks, status, statuses = asyncio.run(_run(script, {"no_progress_rounds": npr}))
    moved = script.moved()
    runs = _runs(moved)
    first_long = next((start for start, n in runs if n >= npr + 1), None)
    target_blocks = [r for r, i, _ in blocks if i == "target"]
    if first_long is not None:
        # Blocked within the bound after the stretch began, not before it.
        assert target_blocks, (script.kinds, blocks)
        assert target_blocks[0] <= first_long - 1 + npr + 1, (script.kinds, blocks)
    if target_blocks:
        # Only a stretch of at least two rounds that bring nothing may block it, and
        # only once it is under way.
        block_at = target_blocks[0]
        assert any(
            start < block_at and start + n - 1 >= block_at and n >= 2 for start, n in runs
        ), (
            script.kinds,
            blocks,
        )
        assert statuses["target"] == "blocked" and statuses["after"] == "done"
    else:
        assert status == "satisfied" and blocks == [], (script.kinds, blocks)
    if all(n <= 1 for _, n in runs):
        assert blocks == [], (script.kinds, blocks)

"""Failure class 5: progress padding.

The item's only real call fails the same way every round, and the judge dresses each
round up as progress by attaching an unrelated successful op: re-citing an old one,
citing a new but identical read, or a fresh read of something else. What the judge
attaches is not what progress is measured from: a round whose failure was seen before
is an attempt, a repeated identical failure is non-convergent whatever else the round
did, the same read with the same result is nothing new, and padding with ever-new calls
meets the per-item round cap. The item is blocked and the items after it start.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.adversarial import (
    assert_honest,
    assert_status_agrees,
    change,
    contract,
    op_rule_items,
    payload,
    plain_items,
    refs,
    say,
    statuses,
    verdict,
    warnings,
    write,
)
from tests.support.loop import events_of, ledger_of, run_task
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.runtime.round import progress as P
from tether.store.memory import MemoryStore

SEEDS = [f"seed{n}.txt" for n in range(8)]


@pytest.fixture
async def store() -> MemoryStore:
    return await MemoryStore.open()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    for name in SEEDS:
        (tmp_path / name).write_text(f"{name}\n")
    return tmp_path


def failing_call(n: int, *, vary: bool) -> Any:
    path = f"secrets/deploy-{n}.key" if vary else "secrets/deploy.key"
    return tool_call("read_file", path=path)


Padding = Callable[[int], list[Any]]

#: What the actor adds to its failing call on the n-th round for the item.
PADDING: dict[str, Padding] = {
    "reuse-old": lambda n: [tool_call("read_file", path=SEEDS[0])] if n == 0 else [],
    "new-identical": lambda n: [tool_call("read_file", path=SEEDS[0])],
    "new-distinct": lambda n: [tool_call("read_file", path=SEEDS[n % len(SEEDS)])],
    "listing": lambda n: [tool_call("list_files", path=".")],
    "many-distinct": lambda n: [tool_call("read_file", path=s) for s in SEEDS[n : n + 3]],
}


def padded_actor(
    padding: Padding, *, vary: bool = False
) -> Callable[[ModelRequest], ModelResponse]:
    count = {"n": 0}

    def actor(request: ModelRequest) -> ModelResponse:
        nxt = request.ledger["next"] if request.ledger else None
        if nxt != "deploy":
            return say(f"writing {nxt}", write(str(nxt))) if nxt else say("done")
        n = count["n"]
        count["n"] += 1
        return say(
            "Deploying (steady progress, almost there).",
            failing_call(n, vary=vary),
            *padding(n),
        )

    return actor


def padding_judge(*, reuse: bool) -> Callable[[ModelRequest], str]:
    """Attaches a successful op to the deploy item every round, as progress."""
    first: list[str] = []

    def judge(request: ModelRequest) -> str:
        if payload(request)["focus_item"] != "deploy":
            return verdict([], "continue")
        ok = refs(request)
        if not first:
            first.extend(ok)
        cited = first if reuse else ok
        return verdict(
            [change("deploy", "in_progress", cited, note="steady progress")],
            "continue",
            "good progress on deploy",
        )

    return judge


def spec_for(**limits: Any) -> Any:
    items = plain_items("deploy") + op_rule_items("announce")
    return contract(items, limits=limits) if limits else contract(items)


async def deploy_rounds(store: MemoryStore, tid: str) -> int:
    return sum(1 for r in await events_of(store, tid, "round.started") if r["item"] == "deploy")


@pytest.mark.parametrize("padding", list(PADDING))
async def test_padding_a_repeated_failure_still_blocks_the_item(
    store: MemoryStore, workspace: Path, padding: str
) -> None:
    # Generous attempt and no-progress limits: only non-convergence can block it.
    spec = spec_for(max_attempts_per_item=10, no_progress_rounds=10)
    tid, result = await run_task(
        store,
        spec,
        workspace,
        ScriptedModel(policy=padded_actor(PADDING[padding])),
        judge=ScriptedModel(policy=padding_judge(reuse=padding == "reuse-old")),
    )
    assert result.status == "waiting" and result.waiting is not None
    assert result.waiting["kind"] == "decision"
    assert await statuses(store, tid) == {"deploy": "blocked", "announce": "done"}
    led = await ledger_of(store, tid)
    deploy = led.item("deploy")
    # Every round after the first failed the same way again: each of those is an attempt.
    assert deploy.attempts == spec.limits.same_failure_repeats - 1
    assert deploy.note.startswith("non-convergent"), deploy.note
    assert "secrets/deploy.key" in deploy.note
    # Blocked at the same-failure limit (3): padding bought no extra rounds.
    assert await deploy_rounds(store, tid) == spec.limits.same_failure_repeats
    blocked = await warnings(store, tid, "item_blocked")
    assert [w["details"]["item"] for w in blocked] == ["deploy"]
    # The item after it started and was finished by its rule.
    rounds = await events_of(store, tid, "round.started")
    assert rounds[-1]["item"] == "announce"
    partial = result.waiting["partial"]
    assert [(b["id"], b["attempts"] > 0) for b in partial["blocked"]] == [("deploy", True)]
    assert [d["id"] for d in partial["done"]] == ["announce"]
    await assert_honest(store, tid, spec)
    await assert_status_agrees(store, tid)


@pytest.mark.parametrize("padding", ["new-distinct", "many-distinct"])
async def test_fresh_padding_with_varying_failures_ends_when_nothing_new_comes(
    store: MemoryStore, workspace: Path, padding: str
) -> None:
    """The failing call changes every round (never the same failure twice: no attempt, never
    non-convergent) and the padding reads are fresh while the seed files last: once they
    only repeat, the rounds do nothing new and the item is blocked, at default limits."""
    spec = spec_for()
    tid, result = await run_task(
        store,
        spec,
        workspace,
        ScriptedModel(policy=padded_actor(PADDING[padding], vary=True)),
        judge=ScriptedModel(policy=padding_judge(reuse=False)),
    )
    assert result.status == "waiting"
    led = await ledger_of(store, tid)
    deploy = led.item("deploy")
    assert deploy.status == "blocked"
    assert deploy.attempts == 0
    assert deploy.note.startswith(f"no progress in {spec.limits.no_progress_rounds} rounds")
    # At most one round per seed file (each read once is new), a few failing calls tried
    # for the first time (`FRESH_FAILURES`: news, like a guessed path), then the rounds
    # without progress.
    bound = len(SEEDS) + P.FRESH_FAILURES + spec.limits.no_progress_rounds
    assert await deploy_rounds(store, tid) <= bound
    assert led.item("announce").status == "done"
    await assert_honest(store, tid, spec)


async def test_padding_with_ever_new_calls_meets_the_per_item_cap(
    store: MemoryStore, workspace: Path
) -> None:
    """Every round writes something never written before next to its failing call: each
    round looks new, so only `limits.max_rounds_per_item` (at its default) stops it."""

    def actor(request: ModelRequest) -> ModelResponse:
        nxt = request.ledger["next"] if request.ledger else None
        if nxt != "deploy":
            return say(f"writing {nxt}", write(str(nxt))) if nxt else say("done")
        n = sum(1 for r in act_requests_seen if r == "deploy")
        act_requests_seen.append("deploy")
        return say(
            "Deploying, one more try.",
            failing_call(n, vary=True),
            tool_call("write_file", path=f"scratch/try-{n}.txt", content=f"try {n}\n"),
        )

    act_requests_seen: list[str] = []
    spec = spec_for()
    cap = spec.limits.max_rounds_per_item
    assert cap is not None
    tid, result = await run_task(
        store,
        spec,
        workspace,
        ScriptedModel(policy=actor),
        judge=ScriptedModel(policy=padding_judge(reuse=False)),
    )
    assert result.status == "waiting"
    led = await ledger_of(store, tid)
    deploy = led.item("deploy")
    assert deploy.status == "blocked"
    assert deploy.note.startswith(f"not finished in {cap} rounds"), deploy.note
    assert await deploy_rounds(store, tid) == cap
    assert led.item("announce").status == "done"
    await assert_honest(store, tid, spec)


async def test_item_limits_from_the_contract_are_honoured(
    store: MemoryStore, workspace: Path
) -> None:
    """The same failure again is an attempt: with the item's own `max_attempts: 2` (and a
    raised same-failure limit) it is blocked at its second repeat, the third round."""
    items = [{"id": "deploy", "title": "deploy", "max_attempts": 2}, *op_rule_items("announce")]
    spec = contract(items, limits={"same_failure_repeats": 5})
    tid, _ = await run_task(
        store,
        spec,
        workspace,
        ScriptedModel(policy=padded_actor(PADDING["new-distinct"])),
        judge=ScriptedModel(policy=padding_judge(reuse=False)),
    )
    led = await ledger_of(store, tid)
    assert led.item("deploy").status == "blocked"
    assert led.item("deploy").note.startswith("failed 2 attempts"), led.item("deploy").note
    assert (led.item("deploy").attempts, await deploy_rounds(store, tid)) == (2, 3)
    await assert_honest(store, tid, spec)


async def test_padding_without_failures_is_no_progress_when_repeated(
    store: MemoryStore, workspace: Path
) -> None:
    """No call fails; the only 'progress' is the same read again and again."""
    spec = spec_for()

    def reader(request: ModelRequest) -> ModelResponse:
        nxt = request.ledger["next"] if request.ledger else None
        if nxt == "deploy":
            return say("checking the config again", tool_call("read_file", path=SEEDS[1]))
        return say(f"writing {nxt}", write(str(nxt))) if nxt else say("done")

    tid, result = await run_task(
        store,
        spec,
        workspace,
        ScriptedModel(policy=reader),
        judge=ScriptedModel(policy=padding_judge(reuse=False)),
    )
    assert result.status == "waiting"
    deploy = (await ledger_of(store, tid)).item("deploy")
    assert deploy.status == "blocked" and deploy.attempts == 0
    assert deploy.note.startswith("no progress")
    # The first read was new evidence (progress); the repeats were not.
    assert await deploy_rounds(store, tid) == 1 + spec.limits.no_progress_rounds
    await assert_honest(store, tid, spec)


def _churner(counter: dict[str, int]) -> Callable[[ModelRequest], ModelResponse]:
    """Appends a new junk line to out/report.md every round, forever."""

    def churner(request: ModelRequest) -> ModelResponse:
        counter["n"] += 1
        line = f"row {counter['n']}: pending\n"
        call = tool_call("append_file", path="out/report.md", content=line)
        return say("Adding to the report.", call)

    return churner


async def test_a_file_churned_forever_is_blocked_at_the_item_cap(
    store: MemoryStore, workspace: Path
) -> None:
    """The file rule's check sees its file change every round (a junk line appended):
    a new hash says something changed, not how far the item got, so the per-item cap
    blocks it at its 40th round."""
    spec = contract(
        [{"id": "report", "title": "the totals report",
          "done_when": {"kind": "file", "path": "out/report.md", "contains": "TOTAL: 500"}}],
        tools=["append_file", "read_file"],
    )  # fmt: skip
    count = {"n": 0}
    tid, result = await run_task(store, spec, workspace, ScriptedModel(policy=_churner(count)))
    assert result.status == "waiting"
    report = (await ledger_of(store, tid)).item("report")
    assert report.status == "blocked" and "not finished in 40 rounds" in report.note, report
    assert count["n"] == 40
    await assert_honest(store, tid, spec)


async def test_a_check_whose_output_moves_forever_ends_at_the_task_cap(
    store: MemoryStore, workspace: Path
) -> None:
    """The item's command check reports how far it got ("N of 500 rows"), and the junk
    rows move it every round: past the per-item cap the item goes on (an honest sync
    counts its files up the same way) until the task's own `max_rounds` stops it,
    waiting for a person, the item open and never done."""
    count_rows = (
        "import sys; n = sum(1 for _ in open('out/report.md')); "
        "print(n, 'of 500 rows'); sys.exit(n < 500)"
    )
    check = f'{sys.executable} -c "{count_rows}"'
    spec = contract(
        [{"id": "report", "title": "the totals report",
          "done_when": {"kind": "command", "command": check}}],
        limits={"max_rounds": 60},
        tools=["append_file", "read_file"],
    )  # fmt: skip
    count = {"n": 0}
    tid, result = await run_task(store, spec, workspace, ScriptedModel(policy=_churner(count)))
    assert result.status == "waiting" and result.waiting is not None
    assert "60" in result.waiting["reason"] and "rounds" in result.waiting["reason"]
    report = (await ledger_of(store, tid)).item("report")
    assert report.status == "in_progress", report
    assert count["n"] == 60  # past the per-item cap of 40, to the task's cap
    await assert_honest(store, tid, spec)

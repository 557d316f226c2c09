"""A contract's `limits`: the loop guards and breaker thresholds (`tether.spec` holds
the rest of the contract and names these too)."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field

from tether._spec_model import _Strict

#: `limits.max_rounds` when the contract leaves it out: this many rounds per checklist
#: item, and never fewer than `DEFAULT_MAX_ROUNDS` (a checklist of thousands of items
#: must not wait for a person at its 201st round; the per-item guards catch a loop).
ROUNDS_PER_ITEM: Final = 10
DEFAULT_MAX_ROUNDS: Final = 200


class Limits(_Strict):
    """Loop guards and breaker thresholds."""

    max_rounds: int = Field(
        default=DEFAULT_MAX_ROUNDS,
        gt=0,
        description="rounds in all, then the task waits for a person; left out: "
        f"{ROUNDS_PER_ITEM} per checklist item, at least {DEFAULT_MAX_ROUNDS}",
    )
    max_rounds_per_milestone: int | None = Field(default=None, gt=0)
    max_attempts_per_item: int = Field(
        default=3,
        gt=0,
        description="rounds on one item whose failure it has seen before (the same call "
        "failing the same way again) before it is blocked",
    )
    no_progress_rounds: int = Field(
        default=3,
        gt=0,
        description="rounds in a row on one item that did nothing new for it (the same calls "
        "with the same results, or words only; an answer cut off by the output token limit "
        "is not counted) before it is blocked",
    )
    same_failure_repeats: int = Field(
        default=3,
        gt=0,
        description="the same call failing the same way (same normalised message) this often "
        "blocks the item as non-convergent",
    )
    max_calls_per_round: int = Field(
        default=64,
        gt=0,
        le=1000,
        description="tool calls one round runs; a response asking for more has the rest "
        "left out, and the model is told which were not run",
    )
    max_rounds_per_item: int | None = Field(
        default=40,
        gt=0,
        description="rounds one item may take before it is blocked, however new each round "
        "looks (a backstop against padding with ever-new arguments), at its first round past "
        "them in which it changed nothing or its done_when check (a command's output, an "
        "artifact count) said nothing new, and at 3 times them in any case; null: no cap",
    )
    max_crash_restarts: int = Field(
        default=5,
        gt=0,
        description="restarts after a crash without a round finished in between before "
        "the task fails (environment_unrecoverable) instead of crashing again",
    )
    stall_after: float | None = Field(
        default=None,
        gt=0,
        description="seconds without a heartbeat before a running task whose lease expired "
        "is marked stalled; default: the workers' setting (600)",
    )
    round_timeout: float | None = Field(
        default=None,
        gt=0,
        le=7 * 24 * 3600,
        description="seconds a round may run (checked at each lease renewal) before it is "
        "cancelled and counted as a crash of its worker; none by default",
    )
    probe_after: float | None = Field(
        default=300.0,
        gt=0,
        le=7 * 24 * 3600,
        description="seconds a round in flight may go without a committed event before "
        "the model is asked a status probe (DONE, WORKING or STUCK); null: never",
    )
    on_probe_failure: Literal["restart_round", "ask_human"] = Field(
        default="restart_round",
        description="what a STUCK answer or two unusable answers in a row do: cancel the "
        "round and recover it like a crash (counted), or make the task wait for a person",
    )
    breaker_failure_rate: float = Field(default=0.3, gt=0, le=1)
    breaker_min_calls: int = Field(default=10, gt=0)
    breaker_cooldown_seconds: float = Field(default=60.0, gt=0)

"""How a stop ends: the contract's `on_budget_exhausted` and `on_unanswered`.

A task parked because its budget is used up (`suspended`, waiting for a raised limit)
or waiting for a person who does not answer (an approval, a decision, a question)
either waits for ever — `wait`, the default — or ends `failed` once a deadline has
passed — `fail`:

    on_budget_exhausted: wait                       # the default
    on_budget_exhausted: fail                       # fail as soon as it is used up
    on_unanswered: {action: fail, after: 48h}       # 48 hours after the wait began

`after` is a number of seconds or a duration (`90s`, `30m`, `48h`, `7d`). Unset, `fail`
fails the budget stop at once, and the unanswered wait when it would be escalated (the
contract's `notify.suspend_after`, else the installation's 24 h). The failed task's
stop reason says why: `budget_exhausted`, or the wait's own (`needs_user_input`, or
`max_rounds` for a round limit nobody raised).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tether.schedule import duration_seconds

__all__ = ["StopPolicy", "parse_duration"]

#: The longest deadline (a year): beyond it, `wait` says the same thing.
MAX_AFTER = 366 * 86400.0


def parse_duration(value: Any) -> float:
    """Seconds from a number or a duration text (`90s`, `30m`, `48h`, `7d`)."""
    if isinstance(value, bool):
        raise ValueError("must be a duration such as 48h, not a boolean")
    if isinstance(value, int | float):
        return float(value)
    seconds = duration_seconds(value) if isinstance(value, str) else None
    if seconds is None:
        shown = repr(value)[:40]
        raise ValueError(f"must be seconds or a duration such as 30m, 48h or 7d, not {shown}")
    return seconds


class StopPolicy(BaseModel):
    """What ends a stop: `wait` (for ever; the default) or `fail` (`after` a deadline,
    in seconds once parsed). Written as `wait`, `fail` or `{action: fail, after: 48h}`."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    action: Literal["wait", "fail"] = "wait"
    after: float | None = Field(
        default=None,
        ge=0,
        le=MAX_AFTER,
        description="seconds (or 30m, 48h, 7d) from the stop until the task fails",
    )

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return {"action": value} if isinstance(value, str) else value

    @field_validator("after", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        return None if value is None else parse_duration(value)

    @model_validator(mode="after")
    def _after_needs_fail(self) -> StopPolicy:
        if self.action == "wait" and self.after is not None:
            raise ValueError("`after` is the deadline of `action: fail`; `wait` has none")
        return self

    def deadline(self, default: float) -> float | None:
        """Seconds from the stop until the task fails (`default` when `after` is unset),
        or None: it waits."""
        if self.action == "wait":
            return None
        return self.after if self.after is not None else default

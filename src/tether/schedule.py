"""Recurring tasks: a contract's `schedule`, and the times its occurrences fall on.

A contract with a `schedule` is not one task but a series: `tether submit` stores the
schedule, and workers start each occurrence as a task of its own (its own ledger,
budget and log), linked to the schedule by its id. This module is the pure part: the
schedule as written in a contract, and when its occurrences are due.

```yaml
schedule:
  every: 24h            # or: cron: "0 9 * * 1-5" (five fields), with timezone:
  timezone: Europe/Paris
  start: 2026-12-07T09:00:00+01:00   # default: when it is submitted
  count: 30             # an end: a number of occurrences, or until: <date>, or both
  missed: run_once      # a worker that was away: run the latest missed one late, or skip
  grace: 10m            # with `missed: skip`, how late an occurrence may still start
  overlap: skip         # the previous occurrence still running: skip this one, or allow
```

Cron expressions are read by `cronsim` (the parser healthchecks.io maintains), imported
only when a cron schedule is used; intervals need nothing.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
from collections.abc import Iterator
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def duration_seconds(text: str) -> float | None:
    """Seconds from duration text (`90`, `90s`, `30m`, `1h30m`, `1d`, `2w`), None when it
    is not one: the one reader of durations (contracts' schedules and stop deadlines,
    the worker's options), each caller saying what it refuses."""
    text = text.strip().lower().replace(" ", "")
    if _NUMBER.fullmatch(text):
        return float(text)
    if not text or _PART.sub("", text) != "":
        return None
    return sum(float(n) * _UNITS[u] for n, u in _PART.findall(text))


def parse_duration(value: Any) -> float:
    """Seconds from a number of seconds or text such as `90s`, `30m`, `1h30m`, `1d`."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or text such as 30m, 24h, 1d")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        found = duration_seconds(value)
        if found is None:
            raise ValueError(f"{value!r} is not a duration: write e.g. 90s, 30m, 24h, 1d, 1h30m")
        seconds = found
    else:
        raise ValueError("a duration is a number of seconds or text such as 30m, 24h, 1d")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError("a duration must be more than zero seconds")
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration)]


def zone(name: str) -> _dt.tzinfo:
    """The time zone `name`; UTC needs no time-zone database (a slim container has none)."""
    if name.upper() in ("UTC", "Z"):
        return _dt.UTC
    return ZoneInfo(name)


def _aware(value: _dt.datetime, tz: _dt.tzinfo) -> _dt.datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=tz)


class Schedule(BaseModel):
    """When a contract's occurrences are started: every `every` seconds from `start`, or
    at the times of a five-field `cron` expression in `timezone`; until `until` and/or
    for `count` occurrences (skipped ones count: "daily for 30 days" ends after 30 days).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    every: Duration | None = None
    cron: str | None = Field(default=None, min_length=9, max_length=200)
    timezone: str = Field(default="UTC", min_length=1, max_length=100)
    start: _dt.datetime | None = None
    until: _dt.datetime | None = None
    count: int | None = Field(default=None, ge=1, le=1_000_000)
    #: A worker that was away when occurrences fell due: start the latest of them once,
    #: late (`run_once`), or start none that is more than `grace` late (`skip`).
    missed: Literal["run_once", "skip"] = "run_once"
    grace: Duration = 600.0
    #: The previous occurrence has not ended yet: skip this one (as Temporal schedules
    #: do by default), or start it beside the other (`allow`).
    overlap: Literal["skip", "allow"] = "skip"

    @model_validator(mode="after")
    def _one_rule(self) -> Schedule:
        if self.every is None and self.cron is None:
            raise ValueError("a schedule needs either `every` (an interval) or `cron`")
        if self.every is not None and self.cron is not None:
            raise ValueError("a schedule has either `every` (an interval) or `cron`, not both")
        try:
            tz = zone(self.timezone)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"timezone {self.timezone!r} is not a known time zone") from exc
        if self.cron is not None:
            from cronsim import CronSim, CronSimError

            try:
                CronSim(self.cron, _dt.datetime(2026, 1, 1, tzinfo=tz))
            except CronSimError as exc:
                raise ValueError(f"cron {self.cron!r}: {exc}") from exc
        start, until = self.start, self.until
        if start is not None and until is not None and _aware(until, tz) <= _aware(start, tz):
            raise ValueError("`until` is not after `start`")
        return self

    @property
    def tz(self) -> _dt.tzinfo:
        """The schedule's time zone."""
        return zone(self.timezone)

    def describe(self) -> str:
        """`every 24h` or `cron 0 9 * * 1-5 (Europe/Paris)`, and its end."""
        if self.every is not None:
            when = f"every {format_duration(self.every)}"
        else:
            when = f"cron {self.cron}" + (f" ({self.timezone})" if self.timezone != "UTC" else "")
        ends = []
        if self.count is not None:
            ends.append(f"{self.count} times")
        if self.until is not None:
            ends.append(f"until {_aware(self.until, self.tz).isoformat(timespec='minutes')}")
        return when + (", " + ", ".join(ends) if ends else "")


def format_duration(seconds: float) -> str:
    """`1d`, `24h` → `1d`, `90m` → `1h30m`: the shortest exact form."""
    rest, parts = int(seconds), []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size:
            parts.append(f"{rest // size}{unit}")
            rest %= size
    return "".join(parts) or f"{seconds:g}s"


def first_at(schedule: Schedule, submitted_at: float) -> float:
    """The time of occurrence 1: `start` (for cron, the first cron time at or after it),
    by default the moment the schedule was submitted."""
    tz = schedule.tz
    start = (
        _aware(schedule.start, tz)
        if schedule.start is not None
        else _dt.datetime.fromtimestamp(submitted_at, tz)
    )
    if schedule.cron is None:
        return start.timestamp()
    return _cron_after(schedule, start.timestamp() - 1)


def _cron_after(schedule: Schedule, t: float) -> float:
    """The first cron time strictly after `t`."""
    from cronsim import CronSim

    assert schedule.cron is not None
    it = CronSim(schedule.cron, _dt.datetime.fromtimestamp(t, schedule.tz))
    return next(it).timestamp()


def following(schedule: Schedule, at: float) -> float:
    """The time of the occurrence after the one at `at`."""
    if schedule.every is not None:
        return at + schedule.every
    return _cron_after(schedule, at)


def ended(schedule: Schedule, n: int, at: float) -> bool:
    """True when occurrence `n` (falling at `at`) is past the schedule's end."""
    if schedule.count is not None and n > schedule.count:
        return True
    return schedule.until is not None and at > _aware(schedule.until, schedule.tz).timestamp()


#: How many due occurrences one look walks at most (a worker away for years with a
#: one-minute cron); past it, the walk jumps to now and the rest count as missed.
MAX_WALK = 10_000


def due(schedule: Schedule, n: int, at: float, now: float) -> Iterator[tuple[int, float]]:
    """The occurrences from `n` (at `at`) that are due by `now`, in order."""
    walked = 0
    while at <= now and not ended(schedule, n, at):
        yield n, at
        walked += 1
        if walked >= MAX_WALK and schedule.every is not None:
            # Jump the interval's arithmetic instead of walking it.
            skip = max(0, math.floor((now - at) / schedule.every) - 1)
            n, at = n + skip, at + skip * schedule.every
        n, at = n + 1, following(schedule, at)


__all__ = [
    "Duration",
    "Schedule",
    "due",
    "duration_seconds",
    "ended",
    "first_at",
    "following",
    "format_duration",
    "parse_duration",
]

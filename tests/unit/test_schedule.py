"""A contract's `schedule`: how it is written, and when its occurrences fall due."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether import errors
from tether import schedule as S
from tether.spec import parse_spec

BASE = {"objective": "Digest the day's news", "items": [{"id": "d", "title": "Digest"}]}


def spec_with(schedule: object) -> object:
    return parse_spec({**BASE, "schedule": schedule})


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("30m", 1800), ("24h", 86400), ("1d", 86400), ("1h30m", 5400), (45, 45)],
)
def test_durations_read_as_people_write_them(text: object, seconds: float) -> None:
    assert S.parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "5q", "1h 2x", "-3m", 0, -1, True, "h", float("inf")])
def test_a_bad_duration_is_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        S.parse_duration(bad)


@given(st.integers(min_value=1, max_value=10**8))
def test_a_duration_written_back_reads_the_same(seconds: int) -> None:
    assert S.parse_duration(S.format_duration(seconds)) == seconds


@pytest.mark.parametrize(
    ("schedule", "problem"),
    [
        ({"every": "1h", "cron": "0 9 * * *"}, "either `every`"),
        ({}, "either `every`"),
        ({"cron": "61 * * * *"}, "cron '61 * * * *'"),
        ({"every": "1h", "timezone": "Mars/Olympus"}, "not a known time zone"),
        ({"every": "1h", "count": 0}, "count"),
        ({"every": "1h", "missed": "later"}, "missed"),
        ({"every": "1h", "hourly": True}, "hourly"),
        (
            {"every": "1h", "start": "2026-12-07T00:00:00Z", "until": "2026-12-06T00:00:00Z"},
            "`until` is not after `start`",
        ),
    ],
)
def test_a_bad_schedule_says_what_is_wrong_and_where(schedule: object, problem: str) -> None:
    with pytest.raises(errors.SpecError) as info:
        spec_with(schedule)
    text = str(info.value) + " ".join(info.value.problems)
    assert "schedule" in text and problem in text


def test_a_contract_without_a_schedule_has_none() -> None:
    assert parse_spec(BASE).schedule is None  # type: ignore[attr-defined]


def at(text: str) -> float:
    return dt.datetime.fromisoformat(text).timestamp()


def test_an_interval_falls_every_period_from_its_start_until_its_count() -> None:
    rule = S.Schedule(every="1d", start="2026-12-01T09:00:00Z", count=3)  # type: ignore[arg-type]
    first = S.first_at(rule, submitted_at=0)
    assert first == at("2026-12-01T09:00:00+00:00")
    found = list(S.due(rule, 1, first, now=at("2026-12-31T00:00:00+00:00")))
    assert [n for n, _ in found] == [1, 2, 3]
    assert found[-1][1] == at("2026-12-03T09:00:00+00:00")
    assert S.ended(rule, 4, S.following(rule, found[-1][1]))


def test_without_a_start_the_first_occurrence_is_the_moment_it_was_submitted() -> None:
    rule = S.Schedule(every="1h")  # type: ignore[arg-type]
    assert S.first_at(rule, submitted_at=1_800_000_000.0) == 1_800_000_000.0


def test_a_cron_schedule_follows_its_time_zone_across_a_dst_change() -> None:
    rule = S.Schedule(cron="0 9 * * *", timezone="Europe/Paris", start="2026-03-27T00:00:00")  # type: ignore[arg-type]
    first = S.first_at(rule, submitted_at=0)
    times = [t for _, t in S.due(rule, 1, first, now=at("2026-03-31T00:00:00+00:00"))]
    local = [dt.datetime.fromtimestamp(t, S.zone("Europe/Paris")) for t in times]
    assert [x.hour for x in local] == [9, 9, 9, 9]
    # 9:00 in Paris is 08:00 UTC before the change (March 29) and 07:00 UTC after it.
    utc = [dt.datetime.fromtimestamp(t, dt.UTC).hour for t in times]
    assert utc == [8, 8, 7, 7]


def test_until_ends_a_schedule_at_a_date() -> None:
    rule = S.Schedule(every="1d", start="2026-12-01T00:00:00Z", until="2026-12-03T12:00:00Z")  # type: ignore[arg-type]
    found = list(S.due(rule, 1, S.first_at(rule, 0), now=at("2027-01-01T00:00:00+00:00")))
    assert [n for n, _ in found] == [1, 2, 3]


def test_nothing_is_due_before_its_time() -> None:
    rule = S.Schedule(every="1h")  # type: ignore[arg-type]
    assert list(S.due(rule, 1, 1000.0, now=999.0)) == []


def test_a_long_absence_is_walked_in_bounded_steps() -> None:
    rule = S.Schedule(every="1s")  # type: ignore[arg-type]
    found = list(S.due(rule, 1, 0.0, now=10_000_000.0))
    assert len(found) < 2 * S.MAX_WALK  # not ten million occurrences
    assert found[-1][1] <= 10_000_000.0 < found[-1][1] + 2 * rule.every  # type: ignore[operator]


def test_describe_says_when_and_until() -> None:
    rule = S.Schedule(cron="0 9 * * 1-5", timezone="Europe/Paris", count=30)  # type: ignore[arg-type]
    assert rule.describe() == "cron 0 9 * * 1-5 (Europe/Paris), 30 times"
    assert S.Schedule(every="24h").describe() == "every 1d"  # type: ignore[arg-type]

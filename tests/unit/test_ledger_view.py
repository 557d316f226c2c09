"""The ledger view of a long checklist: bounded whatever the number of items, and paged."""

from __future__ import annotations

import re

import pytest

from tether import ledger as L
from tether import ledger_view as V


def _ledger(n: int, *, milestones: int = 4, long_titles: bool = False) -> L.Ledger:
    per = max(1, n // milestones)
    title = "migrate file {k:05d} " + ("with a long description " * 8 if long_titles else "")
    return L.from_spec(
        "Migrate every file of the archive to the new layout",
        [
            (f"f-{k:05d}", title.format(k=k).strip(), f"m{min(k // per, milestones - 1)}")
            for k in range(n)
        ],
        acceptance=[("a1", "every file is migrated")],
        milestones=[(f"m{j}", f"batch {j}") for j in range(milestones)],
    )


def _worked(led: L.Ledger, *, done: int, blocked: int) -> L.Ledger:
    ids = [d.id for d, _ in led.items()]
    for i in ids[:done]:
        led = L.complete(led, i, [f"artifact:{i}.out"]).ledger
    for i in ids[done : done + blocked]:
        led = L.block(
            led, i, f"the source of {i} is unreadable (permission denied on the share)"
        ).ledger
    nxt = led.next_item()
    assert nxt is not None
    led = L.start(led, nxt).ledger
    return L.record_attempt(led, nxt, "wrote part 1 of 3").ledger


def _focus_chars(text: str) -> int:
    lines = text.splitlines()
    start = lines.index("Focus item (the one named Next):")
    block = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        block.append(line)
    return sum(len(x) + 1 for x in block)


@pytest.mark.parametrize("n", [26, 100, 1_000, 10_000])
@pytest.mark.parametrize("long_titles", [False, True])
def test_the_view_stays_under_its_bound_whatever_the_number_of_items(
    n: int, long_titles: bool
) -> None:
    led = _worked(_ledger(n, long_titles=long_titles), done=n // 3, blocked=min(40, n // 4))
    changed = [d.id for d, _ in list(led.items())[: n // 3]]
    for text in (
        V.render(led),
        V.render(led, header="CURRENT GOAL LEDGER", compact=True, changed=changed),
    ):
        assert len(text) - _focus_chars(text) <= V.VIEW_LIMIT_CHARS, text
        assert text.splitlines()[-1] == f"Next: {led.next_item()}"


def test_the_view_holds_counts_focus_next_changes_and_blocked_items() -> None:
    led = _worked(_ledger(10_000), done=3_000, blocked=12)
    focus = led.next_item()
    assert focus == "f-03012"
    text = V.render(led, header="CURRENT GOAL LEDGER", changed=["f-02999", "f-00005"])
    assert text.startswith("CURRENT GOAL LEDGER (version ")
    assert "Objective: Migrate every file of the archive to the new layout" in text
    assert "Progress: 3000/10000 done, 6988 open, 12 blocked, 0 skipped" in text
    # By milestone, each with its counts.
    assert "  m0 (batch 0): 2500/2500 done, 0 open, 0 blocked" in text
    assert "  m1 (batch 1): 500/2500 done, 1988 open, 12 blocked" in text
    # The focus item in full: its milestone, attempts and last note.
    assert (
        "  [~] f-03012: migrate file 03012 (milestone m1; attempts 1; last: wrote part 1 of 3)"
        in text
    )
    # The next few open items, then how many more.
    assert "  [ ] f-03013: migrate file 03013" in text
    assert "  ... and 6982 more open" in text
    # What changed since the model's last view, with evidence.
    assert "  [x] f-02999: migrate file 02999 (evidence artifact:f-02999.out)" in text
    # Blocked items with their reasons, up to the bound, then a count.
    assert "[!] f-03000: migrate file 03000 (blocked: the source of f-03000 is unreadable" in text
    assert "more blocked (ledger_items(status='blocked'))" in text
    assert "ledger_items(status=..., milestone=..., after=..., limit=...)" in text
    # Deterministic: the same state gives the same bytes.
    again = L.Ledger.from_parts(led.skeleton.to_dict(), led.state_dict(), led.version)
    assert V.render(again, header="CURRENT GOAL LEDGER", changed=["f-02999", "f-00005"]) == text


def test_a_short_ledger_is_still_listed_item_by_item() -> None:
    led = _ledger(V.FULL_VIEW_MAX_ITEMS)
    assert not V.paged(led)
    text = V.render(led)
    assert all(f"[ ] {d.id}: {d.title}" in text for d, _ in led.items())
    assert V.LEDGER_ITEMS_TOOL not in text
    assert V.paged(_ledger(V.FULL_VIEW_MAX_ITEMS + 1))


def test_pages_walk_every_matching_item_once_in_order() -> None:
    led = _worked(_ledger(1_000), done=250, blocked=30)
    seen: list[str] = []
    after = None
    while True:
        page = V.page(led, status="open", after=after, limit=100)
        lines = page.splitlines()
        rows = [m.group(1) for x in lines[1:] if (m := re.match(r"\[.\] (\S+):", x))]
        assert len(rows) <= 100
        seen += rows
        if not lines[-1].startswith("More: "):
            break
        after = lines[-1].split("after=")[1].strip("'.")
    assert seen == [d.id for d, s in led.items() if s.status in L.OPEN_STATUSES]
    assert len(seen) == 720


def test_pages_filter_by_status_and_milestone() -> None:
    led = _worked(_ledger(1_000), done=250, blocked=30)
    blocked = V.page(led, status="blocked")
    assert blocked.startswith("30 of 30 matching items (status='blocked'):")
    assert "[!] f-00250: migrate file 00250 (milestone m1; blocked: the source" in blocked
    m3 = V.page(led, milestone="m3", limit=5)
    assert m3.startswith("5 of 250 matching items (milestone='m3'):")
    assert "More: call ledger_items with after='f-00754'." in m3
    assert V.page(led, status="waived") == "0 of 0 matching items (status='waived'):\n(none)"
    with pytest.raises(KeyError):
        V.page(led, after="no-such-item")


def test_a_requests_ledger_tells_its_next_item_without_listing_the_items(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`request.ledger or {}` and `request.ledger["next"]` (what a model reads most)
    build nothing; any other key gives the whole ledger, `next` included."""
    led = _ledger(40)
    data = V.LedgerData(led, "f-00003")
    built: list[int] = []
    real = L.Ledger.to_dict

    def counted(self: L.Ledger) -> dict[str, object]:
        built.append(1)
        return real(self)

    monkeypatch.setattr(L.Ledger, "to_dict", counted)
    assert (data or {}).get("next") == "f-00003"
    assert "next" in data and data["next"] == "f-00003"
    assert built == []
    assert data["version"] == led.version and len(data["items"]) == 40
    assert data["next"] == "f-00003" and dict(data)["next"] == "f-00003"
    assert built == [1]

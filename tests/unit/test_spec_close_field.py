"""An unknown contract field that misspells an allowed one names it, wherever it is (a
rule's kind included); one that resembles nothing keeps the general hint."""

from __future__ import annotations

from typing import Any

import pytest

from tether import errors
from tether.spec import parse_spec

ITEM = {"id": "a", "title": "x"}


@pytest.mark.parametrize(
    ("extra", "where", "meant"),
    [
        ({"limts": {}}, "limts", "limits"),
        ({"limits": {"max_round": 3}}, "limits.max_round", "max_rounds"),
        ({"context": {"input_budget": 3000}}, "context.input_budget", "input_budget_tokens"),
        ({"items": [{"id": "a", "titel": "x"}]}, "items.0.titel", "title"),
        (
            {"items": [{**ITEM, "done_when": {"kind": "file", "paht": "x"}}]},
            "items.0.done_when.paht",
            "path",
        ),
        ({"budget": {"money_us": 3}}, "budget.money_us", "money_usd"),
    ],
)
def test_a_misspelt_field_names_the_one_meant(
    extra: dict[str, Any], where: str, meant: str
) -> None:
    data = {"objective": "o", "items": [ITEM], **extra}
    with pytest.raises(errors.SpecError) as info:
        parse_spec(data)
    assert f"{where}: unknown field (did you mean {meant!r}?)" in str(info.value)


def test_a_field_like_nothing_keeps_the_general_hint() -> None:
    with pytest.raises(errors.SpecError) as info:
        parse_spec({"objective": "o", "items": [ITEM], "zzzz": 1})
    assert "zzzz: unknown field (check the spelling; allowed fields are listed in the docs)" in (
        str(info.value)
    )

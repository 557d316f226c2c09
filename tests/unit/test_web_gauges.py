"""The dashboard's budget gauges print figures for people: whole numbers as integers."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi", reason="the web extra is not installed (pip install -e '.[web]')")

from tether.web.pages import _gauges


def test_gauge_figures_read_as_numbers_people_write() -> None:
    doc = {
        "budget": {
            "limits": {"tokens": 2_000_000, "money_usd": 5.0, "rounds": None},
            "used": {"tokens": 15369, "money_usd": 0.01234567},
        }
    }
    tokens, money = _gauges(doc)
    assert (tokens["used_text"], tokens["limit_text"]) == ("15,369", "2,000,000")
    assert (money["used_text"], money["limit_text"]) == ("0.0123", "5")

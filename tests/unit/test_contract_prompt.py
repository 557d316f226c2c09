"""The contract part of the system prompt names the sources the task may read."""

from __future__ import annotations

from tether.runtime.round.context import render_contract
from tether.spec import parse_spec


def _spec(**extra: object) -> object:
    return parse_spec({"objective": "compare", "items": [{"id": "a", "title": "a"}], **extra})


def test_declared_sources_are_listed_with_their_versions() -> None:
    text = render_contract(
        _spec(
            sources=[
                {"id": "A", "version": "1.0", "location": "a.md", "title": "Product A"},
                {"id": "B", "version": "2.0", "location": "b.csv", "kind": "dataset"},
            ]
        )
    )
    assert text.endswith(
        "Sources (read them with read_source; cite what you read):\n"
        "  - A version 1.0 (document: Product A)\n"
        "  - B version 2.0 (dataset)"
    )


def test_no_sources_no_line() -> None:
    assert "Sources" not in render_contract(_spec())

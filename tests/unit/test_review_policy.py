"""The contract's `review`: every written form, what each means, and the mistakes
refused with where they are."""

from __future__ import annotations

from typing import Any

import pytest

from tether import errors
from tether.review import ReviewPolicy
from tether.spec import parse_spec

BASE: dict[str, Any] = {"objective": "x", "items": [{"id": "a", "title": "A"}]}


@pytest.mark.parametrize(
    ("review", "model", "human"),
    [
        (False, False, False),
        (True, True, False),
        ("model", True, False),
        ("human", False, True),
        (["model", "human"], True, True),
        ({"model": True, "then": "human"}, True, True),
        ({"model": "openai:gpt-4.1", "then": "human"}, "openai:gpt-4.1", True),
        ({"model": True}, True, False),
        ({"human": True}, False, True),
    ],
)
def test_every_form_of_review(review: Any, model: bool | str, human: bool) -> None:
    spec = parse_spec({**BASE, "review": review})
    assert (spec.review.model, spec.review.human) == (model, human)
    assert spec.review.by_model is (model is not False)
    # The stored form reads back the same.
    again = parse_spec(spec.model_dump(mode="json"), stored=True)
    assert again.review == spec.review


def test_a_named_reviewer_model_is_the_reviewer_unless_models_review_names_one() -> None:
    policy = ReviewPolicy.model_validate({"model": "m1", "then": "human"})
    assert policy.reviewer(None) == "m1" and policy.reviewer("m2") == "m2"
    assert ReviewPolicy(model=True).reviewer(None) is None


@pytest.mark.parametrize(
    ("review", "needle"),
    [
        ("sometimes", "expected true, false"),
        (["human", "model"], "signs off last"),
        (["model", "model"], "twice"),
        ({"model": True, "then": "model"}, "`then` may only be `human`"),
        ({"then": "human", "human": False}, "not both"),
        ({"model": "", "then": "human"}, "empty"),
        ({"people": 2}, "review.people"),
    ],
)
def test_mistakes_are_refused_naming_review(review: Any, needle: str) -> None:
    with pytest.raises(errors.SpecError) as info:
        parse_spec({**BASE, "review": review})
    text = str(info.value) + " ".join(info.value.problems)
    assert "review" in text and needle in text

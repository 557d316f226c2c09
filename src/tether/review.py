"""Who reviews a task's work before it is delivered: the contract's `review`.

- `review: false` (the default): the acceptance checks alone;
- `review: true` or `review: model`: an independent reviewer model checks the work;
- `review: human`: a person signs off (`tether approve TASK`, or `tether reject TASK
  --hint ...` to send items back to work) after the completion check passed;
- `review: [model, human]` or `review: {model: true, then: human}`: the reviewer model
  first, then the person. `model` may name the reviewer's model (`{model: NAME}`) instead
  of `models.review`.

Python: `TaskSpec(review="human")`, `TaskSpec(review=ReviewPolicy(model=True, human=True))`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

_WHO = ("model", "human")


class ReviewPolicy(BaseModel):
    """The review before delivery: `model` (a reviewer model; True, or its model's
    name) and `human` (a person signs off after it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: bool | str = False
    human: bool = False

    @model_validator(mode="before")
    @classmethod
    def _forms(cls, value: Any) -> Any:
        if isinstance(value, bool):
            return {"model": value}
        if isinstance(value, str):
            return _from_list([value])
        if isinstance(value, list):
            return _from_list(value)
        if isinstance(value, dict) and "then" in value:
            rest = {k: v for k, v in value.items() if k != "then"}
            if value["then"] != "human":
                raise ValueError(f"`then` may only be `human`, not {value['then']!r}")
            if "human" in rest:
                raise ValueError("give `then: human` or `human: true`, not both")
            return {**rest, "human": True}
        return value

    @model_validator(mode="after")
    def _named_model(self) -> ReviewPolicy:
        if isinstance(self.model, str) and not self.model.strip():
            raise ValueError("`model` names the reviewer's model; it is empty")
        return self

    @property
    def by_model(self) -> bool:
        """An independent reviewer model checks the work."""
        return self.model is not False

    @property
    def model_name(self) -> str | None:
        """The reviewer's model when `review` names it."""
        return self.model if isinstance(self.model, str) else None

    def reviewer(self, models_review: str | None) -> str | None:
        """The reviewer model's name: `models.review`, else the one named here."""
        return models_review or self.model_name


def _from_list(value: list[Any]) -> dict[str, Any]:
    bad = [v for v in value if v not in _WHO]
    if bad:
        raise ValueError(
            f"expected true, false, `model`, `human`, a list of them or "
            f"{{model: ..., then: human}}; got {bad[0]!r}"
        )
    if len(set(value)) != len(value):
        raise ValueError("names a reviewer twice")
    if value == ["human", "model"]:
        raise ValueError("the person signs off last: write [model, human]")
    return {"model": "model" in value, "human": "human" in value}


def policy_field() -> Any:
    """`TaskSpec.review`'s field."""
    return Field(default_factory=ReviewPolicy)

"""The base of every contract model: strict, frozen, and storable field by field."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from tether.spec_values import storable


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)

    @field_validator("*", mode="after")
    @classmethod
    def _storable_text_and_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # Every field: no NUL characters or unpaired surrogates in text, no integers
        # beyond 64 bits (nested models have checked their own fields; `workspace` is a
        # path, checked by `load_spec` and `create_task`).
        if isinstance(value, BaseModel) or info.field_name == "workspace":
            return value
        return storable(value)

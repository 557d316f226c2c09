"""Choosing the models of a task from its spec and the command line."""

from __future__ import annotations

import os

from tether import errors
from tether.models.base import Model
from tether.models.registry import resolve_model
from tether.runtime.engine import ModelSet
from tether.spec import TaskSpec

RULES_ONLY = "rules"


def build_models(spec: TaskSpec, override: str | None = None) -> ModelSet:
    """Actor from `--model`, the spec or `TETHER_MODEL`; judge, compaction and review
    from the spec, defaulting to the actor's model. `models.judge: rules` judges by
    `done_when` rules alone."""
    actor_name = override or spec.models.actor or os.environ.get("TETHER_MODEL")
    if not actor_name:
        raise errors.UserError(
            "no model to run the task: pass --model (for example --model openai:gpt-4.1-mini) "
            "or set models.actor in the spec or TETHER_MODEL in the environment"
        )
    cache: dict[str, Model] = {}

    def get(name: str) -> Model:
        if name not in cache:
            cache[name] = resolve_model(name)
        return cache[name]

    actor = get(actor_name)
    judge_name = spec.models.judge
    judge = None if judge_name == RULES_ONLY else get(judge_name) if judge_name else actor
    compact = get(spec.models.compact) if spec.models.compact else actor
    review = None
    if spec.review:
        review = get(spec.models.review) if spec.models.review else (judge or actor)
    return ModelSet(actor=actor, judge=judge, compact=compact, review=review)

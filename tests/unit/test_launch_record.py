"""The launch record (`runtime.launch`): what `run` remembers and how `resume` applies
it over the stored spec."""

from __future__ import annotations

from tether.runtime import launch
from tether.spec import parse_spec

SPEC = {"name": "s", "objective": "o", "items": [{"id": "a", "title": "A"}]}


def _spec(**models: object) -> object:
    return parse_spec({**SPEC, "models": models} if models else SPEC, source="test")


def test_the_command_line_model_and_options_come_back() -> None:
    spec = _spec(judge="rules")
    rec = launch.record(spec, model="scripted:m:f", options={"timeout": 5.0, "max_retries": None})
    assert rec["models"] == {
        "actor": "scripted:m:f", "judge": "rules", "compact": "scripted:m:f", "review": None
    }  # fmt: skip
    assert rec["actor_from"] == "--model" and rec["model_options"] == {"timeout": 5.0}
    back = launch.apply(spec, rec)
    assert (back.models.actor, back.models.timeout, back.models.judge) == (
        "scripted:m:f", 5.0, "rules"
    )  # fmt: skip


def test_tether_model_is_remembered_and_the_spec_actor_is_not_overridden() -> None:
    rec = launch.record(_spec(), env={"TETHER_MODEL": "scripted:env:f"})
    assert rec["actor_from"] == "TETHER_MODEL"
    assert launch.apply(_spec(), rec).models.actor == "scripted:env:f"
    own = launch.record(_spec(actor="scripted:spec:f"), env={"TETHER_MODEL": "scripted:env:f"})
    assert own["actor_from"] == "spec" and own["models"]["actor"] == "scripted:spec:f"


def test_an_edit_of_the_models_after_the_launch_wins() -> None:
    rec = launch.record(_spec(actor="scripted:old:f"), model="scripted:cli:f")
    assert launch.apply(_spec(actor="scripted:old:f"), rec).models.actor == "scripted:cli:f"
    edited = _spec(actor="scripted:new:f")  # `tether edit --set models.actor=...`
    assert launch.apply(edited, rec).models.actor == "scripted:new:f"


def test_no_record_changes_nothing_and_tools_come_from_the_environment() -> None:
    spec = _spec()
    assert launch.apply(spec, None) is spec
    rec = launch.record(spec, env={"TETHER_TOOLS": "a:B, c:D"})
    assert launch.remembered_tools(rec) == ["a:B", "c:D"]
    assert launch.registry_for(lambda: None, rec, env={"TETHER_TOOLS": "x:Y"}) is None  # type: ignore[arg-type,return-value]

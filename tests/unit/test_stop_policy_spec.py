"""The contract's `on_budget_exhausted` / `on_unanswered`, the stop reasons each
terminal state accepts, and the environment a contract's tools need."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from tests.support.loop import spec_of

from tether import errors, lifecycle
from tether.runtime import launch
from tether.spec_policies import StopPolicy, parse_duration


@pytest.mark.parametrize(
    ("written", "action", "after"),
    [
        ("wait", "wait", None),
        ("fail", "fail", None),
        ({"action": "fail", "after": "48h"}, "fail", 48 * 3600.0),
        ({"action": "fail", "after": "30m"}, "fail", 1800.0),
        ({"action": "fail", "after": "2d"}, "fail", 172800.0),
        ({"action": "fail", "after": 90}, "fail", 90.0),
        ({"action": "fail", "after": "90s"}, "fail", 90.0),
    ],
)
def test_a_stop_policy_is_written_short_or_long(written: Any, action: str, after: Any) -> None:
    spec = spec_of(1, on_budget_exhausted=written, on_unanswered=written)
    assert spec.on_budget_exhausted == spec.on_unanswered == StopPolicy(action=action, after=after)  # type: ignore[arg-type]


def test_the_default_waits_and_deadlines_default_as_documented() -> None:
    spec = spec_of(1)
    assert spec.on_budget_exhausted.deadline(0.0) is None
    assert spec.on_unanswered.deadline(86400.0) is None
    assert StopPolicy(action="fail").deadline(86400.0) == 86400.0
    assert StopPolicy(action="fail", after=60).deadline(86400.0) == 60.0


@pytest.mark.parametrize(
    ("written", "needle"),
    [
        ({"action": "wait", "after": "1h"}, "`wait` has none"),
        ({"action": "fail", "after": "soon"}, "duration such as 30m"),
        ({"action": "fail", "after": -5}, "greater than or equal to 0"),
        ({"action": "fail", "after": "400d"}, "less than or equal to"),
        ({"action": "fail", "after": True}, "boolean"),
        ("explode", "on_unanswered.action"),
        ({"action": "fail", "when": "1h"}, "unknown field"),
    ],
)
def test_a_bad_stop_policy_is_a_spec_error(written: Any, needle: str) -> None:
    with pytest.raises(errors.SpecError) as exc:
        spec_of(1, on_unanswered=written)
    assert needle in str(exc.value)


def test_parse_duration_refuses_what_it_cannot_read() -> None:
    assert parse_duration("1.5h") == 5400.0
    with pytest.raises(ValueError, match="duration"):
        parse_duration([1])


def test_every_stop_reason_fits_a_terminal_state_and_no_other_is_declared() -> None:
    fitting = set().union(*lifecycle.TERMINAL_REASONS.values())
    assert fitting == set(lifecycle.STOP_REASONS)
    assert "internal_error" not in lifecycle.STOP_REASONS  # was never set: removed
    # The contract's stop policies end a task `failed` with these.
    assert {"budget_exhausted", "needs_user_input", "max_rounds"} <= lifecycle.TERMINAL_REASONS[
        "failed"
    ]
    assert "abandoned_by_user" in lifecycle.ABANDON_CODES
    assert "non_convergent" in lifecycle.ABANDON_CODES


def test_the_environment_names_every_missing_secret_and_never_a_value() -> None:
    spec = spec_of(
        1,
        tools=[{"name": "write_file", "secrets": ["TICKETS_TOKEN", "OTHER_KEY"]}],
        mcp_servers=[
            {
                "name": "notes",
                "command": "notes-server",
                "env": {"TOKEN": "Bearer ${NOTES_TOKEN}", "PLAIN": "x", "AGAIN": "${NOTES_TOKEN}"},
            },
            {
                "name": "api",
                "url": "${API_URL:-https://api.example.com}/mcp",
                "headers": {"Authorization": "Bearer ${env:API_TOKEN}"},
            },
        ],
    )
    assert launch.needed_env(spec) == {
        "TICKETS_TOKEN": ["tool write_file"],
        "OTHER_KEY": ["tool write_file"],
        "NOTES_TOKEN": ["MCP server notes"],
        "API_TOKEN": ["MCP server api"],  # API_URL has a default: not needed
    }
    env = {"OTHER_KEY": "s3cr3t-value", "TICKETS_TOKEN": "", "API_TOKEN": "a"}
    assert set(launch.missing_env(spec, env)) == {"TICKETS_TOKEN", "NOTES_TOKEN"}
    with pytest.raises(errors.UserError) as exc:
        launch.check_env(spec, env)
    msg = str(exc.value)
    assert "NOTES_TOKEN (for MCP server notes)" in msg and "TICKETS_TOKEN" in msg
    assert "s3cr3t-value" not in msg and "OTHER_KEY" not in msg
    launch.check_env(spec, {**env, "TICKETS_TOKEN": "t", "NOTES_TOKEN": "n"})  # ready


def test_the_environment_check_needs_no_mcp_extra_without_mcp_servers() -> None:
    # The core install has no mcp extra: `tools.mcp` is read only for a contract with
    # MCP servers (the doc tests run `tether run` in a core venv).
    code = (
        "import sys; from tests.support.loop import spec_of; "
        "from tether.runtime import launch; "
        "spec = spec_of(1, tools=[{'name': 'write_file', 'secrets': ['A']}]); "
        "launch.check_env(spec, {'A': 'x'}); "
        "print('tether.tools.mcp' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"

"""Configuration a user gets wrong is refused at start, naming what is wrong and where
(the fixes behind tests/e2e/test_docs_walk.py, checked here without a subprocess)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tether import errors
from tether.store.base import Store
from tether.tools.builtin.files import default_registry

_TOOL = """
from tether import tool

@tool(effect="write")
def {name}(path: str, content: str) -> str:
    return "ok"

TOOLS = [{name}]
"""


def _no_store() -> Store:
    raise AssertionError("no store here")


def _module(folder: Path, module: str, tool_name: str, monkeypatch: pytest.MonkeyPatch) -> str:
    (folder / f"{module}.py").write_text(_TOOL.format(name=tool_name), "utf-8")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.chdir(folder)
    monkeypatch.delitem(sys.modules, module, raising=False)
    return f"{module}:TOOLS"


def test_a_tether_tools_tool_named_like_a_built_in_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = _module(tmp_path, "cfg_shadow", "write_file", monkeypatch)
    with pytest.raises(errors.UserError, match="'write_file' of 'cfg_shadow:TOOLS' clashes"):
        default_registry(_no_store, {"TETHER_TOOLS": ref})


def test_two_tether_tools_modules_with_one_name_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = _module(tmp_path, "cfg_one", "make_ticket", monkeypatch)
    two = _module(tmp_path, "cfg_two", "make_ticket", monkeypatch)
    with pytest.raises(errors.UserError, match=r"'cfg_two:TOOLS' clashes .* 'cfg_one:TOOLS'"):
        default_registry(_no_store, {"TETHER_TOOLS": f"{one},{two}"})


def test_the_same_tether_tools_reference_twice_is_not_a_clash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = _module(tmp_path, "cfg_twice", "make_note", monkeypatch)
    reg = default_registry(_no_store, {"TETHER_TOOLS": f"{ref}, {ref}"})
    assert reg.get("make_note") is not None


# --- scripted answers files (models.registry.load_script)


@pytest.mark.parametrize(
    ("script", "needle"),
    [
        ("- txt: hi\n", "response 1 has an unknown key 'txt' (did you mean 'text'?)"),
        ("- text: a\n- {text: b, tool_call: []}\n", "response 2 has an unknown key 'tool_call'"),
        ("- tool_calls: [{nme: x}]\n", "response 1, tool call 1 has an unknown key 'nme'"),
        ("- tool_calls: [{arguments: {}}]\n", "tool call 1 needs a name"),
        ("- tool_calls: {name: x}\n", "tool_calls must be a list"),
    ],
)
def test_a_misspelt_script_key_is_refused(tmp_path: Path, script: str, needle: str) -> None:
    from tether.models.registry import load_script

    path = tmp_path / "answers.yaml"
    path.write_text(script, "utf-8")
    with pytest.raises(errors.UserError, match=re.escape(needle)):
        load_script(path)


def test_a_well_formed_script_is_read_as_before(tmp_path: Path) -> None:
    from tether.models.registry import load_script

    path = tmp_path / "answers.yaml"
    path.write_text(
        "- plain text\n- {text: t, tool_calls: [{id: c1, name: x, arguments: '{bad json'}]}\n",
        "utf-8",
    )
    assert len(load_script(path)) == 2


# --- prices, timeouts, schedules, webhook secrets


def test_a_malformed_prices_file_is_one_line(tmp_path: Path) -> None:
    from tether.models.pricing import load_price_file

    path = tmp_path / "prices.yaml"
    path.write_text("m: {input: 1.25, output: 10.0\n", "utf-8")
    with pytest.raises(errors.UserError) as caught:
        load_price_file(path)
    assert "line 2, column 1" in str(caught.value) and "\n" not in str(caught.value)


def test_a_zero_model_timeout_says_above_0() -> None:
    from tether.models.registry import _env_options

    with pytest.raises(errors.UserError, match="above 0 and at most 3600"):
        _env_options({"TETHER_MODEL_TIMEOUT": "0"})


def test_a_schedule_without_a_rule_says_it_needs_one() -> None:
    from pydantic import ValidationError

    from tether.schedule import Schedule

    with pytest.raises(ValidationError, match="needs either") as caught:
        Schedule.model_validate({"count": 3})
    assert "not both" not in str(caught.value)


def test_a_bad_whsec_secret_names_its_variable() -> None:
    from tether.runtime.watch.sinks import WebhookNotifier

    with pytest.raises(errors.UserError, match=r"^TETHER_WEBHOOK_SECRET: .*base64"):
        WebhookNotifier(
            "http://127.0.0.1:9/x", secret="whsec_!!!", secret_env="TETHER_WEBHOOK_SECRET"
        )


# --- tether serve's options


@pytest.mark.parametrize("value", ["127.0.0.1", "10.0.0.0/8, ::1", "*", "127.0.0.1,"])
def test_trusted_proxies_that_are_addresses_pass(value: str) -> None:
    from tether.cli.serve import _proxies

    assert _proxies(value) == value


def test_a_misspelt_trusted_proxy_is_refused() -> None:
    from tether.cli.serve import _proxies

    with pytest.raises(errors.UserError, match=re.escape("'127.0.0.l' is not an address")):
        _proxies("10.0.0.1,127.0.0.l")


@pytest.mark.parametrize("token", ["short", "a token with spaces in it", "comma,separated,token"])
def test_a_weak_shared_token_is_refused(token: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from tether.cli.serve import _shared_token

    monkeypatch.setenv("TETHER_TOKEN", token)
    with pytest.raises(errors.UserError, match="TETHER_TOKEN must be at least 16"):
        _shared_token()


def test_a_good_shared_token_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    from tether.cli.serve import _shared_token

    monkeypatch.setenv("TETHER_TOKEN", "test-token-0123456789")
    assert _shared_token() == "test-token-0123456789"
    monkeypatch.delenv("TETHER_TOKEN")
    assert _shared_token() is None

"""Choosing a model by name: providers, keys from the environment, scripts, errors."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tether.errors import UserError
from tether.models.base import Message, Model, ModelRequest
from tether.models.registry import load_script, resolve_model

REQUEST = ModelRequest(purpose="act", system="sys", messages=(Message("user", "hi"),))


@pytest.fixture
async def closing() -> AsyncIterator[Callable[[Any], Any]]:
    """Register adapters to close after the test (their HTTP clients)."""
    made: list[Any] = []

    def keep(model: Any) -> Any:
        made.append(model)
        return model

    yield keep
    for m in made:
        close = getattr(m, "aclose", None)
        if close is not None:
            await close()


# --- providers ----------------------------------------------------------------------------


async def test_openai(closing: Callable[[Any], Any]) -> None:
    from tether.models.openai import OpenAIModel

    m = closing(resolve_model("openai:gpt-4.1-mini", env={"OPENAI_API_KEY": "sk-1"}))
    assert isinstance(m, OpenAIModel)
    assert isinstance(m, Model)
    assert m.model == "gpt-4.1-mini"
    assert m.name == "openai:gpt-4.1-mini"
    assert m.client.api_key == "sk-1"
    assert str(m.client.base_url).startswith("https://api.openai.com")
    assert m.client.max_retries == 0  # our retry policy, not the SDK's


async def test_openai_base_url_from_env(closing: Callable[[Any], Any]) -> None:
    env = {"OPENAI_API_KEY": "sk-1", "OPENAI_BASE_URL": "http://127.0.0.1:9999/v1"}
    m = closing(resolve_model("openai:gpt-4.1", env=env))
    assert str(m.client.base_url) == "http://127.0.0.1:9999/v1/"


async def test_options_reach_the_adapter(closing: Callable[[Any], Any]) -> None:
    m = closing(resolve_model("openai:gpt-4.1", env={"OPENAI_API_KEY": "k"}, max_retries=1))
    assert m.retry.max_attempts == 2


async def test_anthropic(closing: Callable[[Any], Any]) -> None:
    from tether.models.anthropic import AnthropicModel

    m = closing(resolve_model("anthropic:claude-sonnet-4-6", env={"ANTHROPIC_API_KEY": "sk-ant"}))
    assert isinstance(m, AnthropicModel)
    assert m.model == "claude-sonnet-4-6"
    assert m.name == "anthropic:claude-sonnet-4-6"
    assert m.client.max_retries == 0


async def test_openai_compatible(closing: Callable[[Any], Any]) -> None:
    m = closing(resolve_model("openai-compatible:http://127.0.0.1:8000/v1#qwen3-8b", env={}))
    assert m.model == "qwen3-8b"
    assert str(m.client.base_url) == "http://127.0.0.1:8000/v1/"
    assert m.client.api_key == "none"
    assert m.max_tokens_field == "max_tokens"
    env = {"OPENAI_API_KEY": "sk-openai", "TETHER_OPENAI_COMPATIBLE_API_KEY": "sk-local"}
    keyed = closing(resolve_model("openai-compatible:http://h:1/v1#m", env=env))
    assert keyed.client.api_key == "sk-local"  # its own variable, never OpenAI's key


async def test_deepseek(closing: Callable[[Any], Any]) -> None:
    m = closing(resolve_model("deepseek:deepseek-chat", env={"DEEPSEEK_API_KEY": "ds"}))
    assert m.model == "deepseek-chat"
    assert str(m.client.base_url).startswith("https://api.deepseek.com")


@pytest.mark.parametrize(
    ("name", "var"),
    [
        ("openai:gpt-4.1-mini", "OPENAI_API_KEY"),
        ("anthropic:claude-haiku-4-5", "ANTHROPIC_API_KEY"),
        ("deepseek:deepseek-chat", "DEEPSEEK_API_KEY"),
    ],
)
def test_missing_key_is_a_user_error(name: str, var: str) -> None:
    with pytest.raises(UserError, match=var):
        resolve_model(name, env={})
    with pytest.raises(UserError, match=var):
        resolve_model(name, env={var: "   "})


def test_keys_come_from_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(UserError, match="OPENAI_API_KEY"):
        resolve_model("openai:gpt-4.1")


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("gpt-4.1", "no provider prefix"),
        ("bedrock:claude", "unknown model provider 'bedrock'"),
        ("openai:", "names no model"),
        ("openai-compatible:http://127.0.0.1:8000/v1", "BASE_URL#MODEL"),
        ("openai-compatible:http://127.0.0.1:8000/v1#", "BASE_URL#MODEL"),
        ("openai-compatible:127.0.0.1:8000/v1#m", "http://"),
        ("scripted:does/not/exist.yaml", "no file"),
    ],
)
def test_bad_names(name: str, fragment: str) -> None:
    with pytest.raises(UserError) as info:
        resolve_model(name, env={})
    assert fragment in str(info.value)


@pytest.mark.parametrize(("prefix", "package"), [("openai", "openai"), ("anthropic", "anthropic")])
def test_missing_sdk_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, prefix: str, package: str
) -> None:
    monkeypatch.setitem(sys.modules, package, None)  # makes `import package` fail
    monkeypatch.delitem(sys.modules, f"tether.models.{package}", raising=False)
    env = {"OPENAI_API_KEY": "k", "ANTHROPIC_API_KEY": "k"}
    with pytest.raises(UserError) as info:
        resolve_model(f"{prefix}:some-model", env=env)
    assert f"pip install 'tether[{package}]'" in str(info.value)


# --- scripted -----------------------------------------------------------------------------


async def test_scripted_from_yaml(tmp_path: Path) -> None:
    script = tmp_path / "script.yaml"
    script.write_text(
        textwrap.dedent(
            """\
            - text: reading
              tool_calls:
                - name: read_file
                  arguments: {path: a.txt}
            - all done
            """
        )
    )
    m = resolve_model(f"scripted:{script}")
    assert isinstance(m, Model)
    first = await m.complete(REQUEST)
    assert first.text == "reading"
    assert first.tool_calls[0].name == "read_file"
    assert first.tool_calls[0].arguments == {"path": "a.txt"}
    second = await m.complete(REQUEST)
    assert second.text == "all done"


async def test_scripted_from_json_with_responses_key(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": ["one", {"text": "two"}]}))
    m = resolve_model(f"scripted:{script}")
    assert (await m.complete(REQUEST)).text == "one"
    assert (await m.complete(REQUEST)).text == "two"


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("a: 1\n", "list of responses"),
        ("- [1, 2]\n", "response 1 must be a text or a mapping"),
        ("- text: [unclosed\n", "not valid YAML: line 2, column 1: expected ',' or ']'"),
        ("[]\n", "holds no responses"),
        ("responses: []\n", "holds no responses"),
    ],
)
def test_bad_scripts(tmp_path: Path, content: str, fragment: str) -> None:
    script = tmp_path / "bad.yaml"
    script.write_text(content)
    with pytest.raises(UserError) as info:
        load_script(script)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)  # one line


def test_a_bad_json_script_says_where(tmp_path: Path) -> None:
    script = tmp_path / "bad.json"
    script.write_text('[\n  "one",\n  ]\n')
    with pytest.raises(UserError) as info:
        load_script(script)
    assert "is not valid JSON: line 3, column 3: Expecting value" in str(info.value)


async def test_scripted_policy_from_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tether_test_policy_mod.py").write_text(
        textwrap.dedent(
            """\
            def act(request):
                return {"text": "saw " + request.messages[-1].content}

            NOT_CALLABLE = 3
            """
        )
    )
    monkeypatch.chdir(tmp_path)  # the working folder is importable
    monkeypatch.delitem(sys.modules, "tether_test_policy_mod", raising=False)
    m = resolve_model("scripted:tether_test_policy_mod:act")
    assert (await m.complete(REQUEST)).text == "saw hi"
    assert str(tmp_path) not in sys.path  # sys.path restored
    with pytest.raises(UserError, match="not a function"):
        resolve_model("scripted:tether_test_policy_mod:NOT_CALLABLE")
    with pytest.raises(UserError, match="has no 'missing'"):
        resolve_model("scripted:tether_test_policy_mod:missing")
    with pytest.raises(UserError, match="cannot import"):
        resolve_model("scripted:no_such_module_xyz:act")


async def test_scripted_models_keep_a_bounded_number_of_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model named on the command line keeps only its last request, and a
    `ScriptedModel` built by hand its last `KEEP_REQUESTS`: never every request seen."""
    from tether.models.scripted import KEEP_REQUESTS, ScriptedModel

    (tmp_path / "tether_test_policy_keep.py").write_text("def act(request):\n    return 'ok'\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "tether_test_policy_keep", raising=False)
    named = resolve_model("scripted:tether_test_policy_keep:act")
    script = tmp_path / "script.json"
    script.write_text(json.dumps(["x"] * 5))
    scripted = resolve_model(f"scripted:{script}")
    by_hand = ScriptedModel(policy=lambda request: "ok")
    for _ in range(KEEP_REQUESTS + 10):
        await named.complete(REQUEST)
        await by_hand.complete(REQUEST)
    for _ in range(5):
        await scripted.complete(REQUEST)
    assert isinstance(named, ScriptedModel) and isinstance(scripted, ScriptedModel)
    assert len(named.requests) == 1 and len(scripted.requests) == 1
    assert len(by_hand.requests) == KEEP_REQUESTS
    assert by_hand.calls == KEEP_REQUESTS + 10


@pytest.mark.parametrize(
    ("name", "extra", "sdk"),
    [
        ("openai:gpt-4.1-mini", "openai", "openai"),
        ("deepseek:deepseek-chat", "openai", "openai"),
        ("anthropic:claude-sonnet-4-5", "anthropic", "anthropic"),
        ("openai-compatible:https://api.openai.com/v1#gpt-4.1", "openai", "openai"),
    ],
)
def test_a_missing_extra_is_named_before_a_missing_key(
    monkeypatch: pytest.MonkeyPatch, name: str, extra: str, sdk: str
) -> None:
    """Without the SDK and without a key, the first thing to do is to install the extra:
    that is what the error says (a key set next would only meet the extra's error)."""
    from tether._extras import MissingExtra

    monkeypatch.setitem(sys.modules, sdk, None)  # `import openai` raises ImportError
    monkeypatch.delitem(sys.modules, f"tether.models.{sdk}", raising=False)
    with pytest.raises(MissingExtra) as info:
        resolve_model(name, env={})
    assert f"tether[{extra}]" in str(info.value)

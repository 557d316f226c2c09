"""Which key an `openai-compatible:URL#model` sends, seen by a real HTTP server.

`OPENAI_API_KEY` goes to OpenAI only: another server gets the key of its own variable,
`TETHER_OPENAI_COMPATIBLE_API_KEY`, or none at all (the placeholder `none`, which a
keyless local vLLM, llama.cpp or Ollama server ignores).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing

import pytest

pytest.importorskip(
    "openai", reason="the openai extra is not installed (pip install -e '.[openai]')"
)

from tests.support.fake_provider import FakeProvider, completion
from tests.support.fake_provider import model_request as request
from tether.errors import UserError
from tether.models._sdk import is_openai_url
from tether.models.openai import OpenAIModel
from tether.models.registry import COMPATIBLE_KEY_ENV, resolve_model
from tether.redact import redact

OPENAI_KEY = "sk-openai-meant-for-openai-only"
COMPATIBLE_KEY = "sk-compatible-server-key"


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with closing(FakeProvider()) as p:
        yield p


async def authorization_sent(model: object, provider: FakeProvider) -> str:
    """The Authorization header of one completion the model asks the server for."""
    assert isinstance(model, OpenAIModel)
    provider.queue(200, completion(content="Hello."))
    try:
        resp = await model.complete(request())
    finally:
        await model.aclose()
    assert resp.text == "Hello."
    (seen,) = provider.requests
    assert OPENAI_KEY not in str(seen.headers)
    return seen.headers["authorization"]


async def test_a_compatible_server_never_gets_the_openai_key(
    provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.delenv(COMPATIBLE_KEY_ENV, raising=False)
    model = resolve_model(f"openai-compatible:{provider.url}#qwen3-8b")
    # A keyless local server keeps working: it gets the placeholder, not OpenAI's key.
    assert await authorization_sent(model, provider) == "Bearer none"


async def test_a_compatible_server_gets_the_key_of_its_own_variable(
    provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.setenv(COMPATIBLE_KEY_ENV, COMPATIBLE_KEY)
    model = resolve_model(f"openai-compatible:{provider.url}#qwen3-8b")
    assert await authorization_sent(model, provider) == f"Bearer {COMPATIBLE_KEY}"
    # Its value is a secret like any *_KEY: masked in what tether stores or prints.
    assert COMPATIBLE_KEY not in redact(f"401: bad key {COMPATIBLE_KEY}")


async def test_the_adapter_built_in_python_never_sends_the_openai_key_elsewhere(
    provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    model = OpenAIModel("qwen3-8b", base_url=provider.url)
    assert await authorization_sent(model, provider) == "Bearer none"
    keyed = OpenAIModel("qwen3-8b", base_url=provider.url, api_key=COMPATIBLE_KEY)
    provider.requests.clear()
    assert await authorization_sent(keyed, provider) == f"Bearer {COMPATIBLE_KEY}"


async def test_openais_own_url_takes_the_openai_key() -> None:
    name = "openai-compatible:https://api.openai.com/v1#gpt-4.1-mini"
    model = resolve_model(name, env={"OPENAI_API_KEY": OPENAI_KEY})
    try:
        assert isinstance(model, OpenAIModel) and model.client.api_key == OPENAI_KEY
    finally:
        await model.aclose()
    own = resolve_model(name, env={"OPENAI_API_KEY": OPENAI_KEY, COMPATIBLE_KEY_ENV: "sk-c"})
    try:
        assert isinstance(own, OpenAIModel) and own.client.api_key == "sk-c"
    finally:
        await own.aclose()


def test_openais_own_url_without_a_key_is_a_clear_error() -> None:
    with pytest.raises(UserError) as info:
        resolve_model("openai-compatible:https://api.openai.com/v1#gpt-4.1-mini", env={})
    msg = str(info.value)
    assert COMPATIBLE_KEY_ENV in msg and "OPENAI_API_KEY" in msg and "gpt-4.1-mini" in msg


@pytest.mark.parametrize(
    "url",
    [
        "https://api.openai.com.attacker.example/v1",
        "https://attacker.example/api.openai.com/v1",
        "https://api.openai.com@attacker.example/v1",
        "http://api.openai.com/v1",  # the key would cross the network in the clear
        "http://127.0.0.1:8000/v1",
    ],
)
async def test_a_url_that_only_looks_like_openais_gets_no_key(url: str) -> None:
    assert not is_openai_url(url)
    model = resolve_model(f"openai-compatible:{url}#m", env={"OPENAI_API_KEY": OPENAI_KEY})
    try:
        assert isinstance(model, OpenAIModel) and model.client.api_key == "none"
        assert model.max_tokens_field == "max_tokens"
    finally:
        await model.aclose()


def test_openais_url_is_recognised_by_host() -> None:
    assert is_openai_url(None) and is_openai_url("https://api.openai.com/v1")
    assert is_openai_url("https://API.openai.com:443/v1/")
    assert not is_openai_url("https://[::1/v1")  # unparseable: not OpenAI

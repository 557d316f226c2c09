"""Choosing a model by name, as in a spec's `model:` or `tether run --model`.

- `openai:gpt-4.1-mini`: OpenAI chat completions; key `OPENAI_API_KEY`, base URL
  from `OPENAI_BASE_URL` if set.
- `anthropic:claude-sonnet-4-5`: the Anthropic messages API; key `ANTHROPIC_API_KEY`,
  base URL from `ANTHROPIC_BASE_URL` if set.
- `openai-compatible:http://127.0.0.1:8000/v1#qwen3`: any OpenAI-compatible server
  (vLLM, Ollama, llama.cpp, ...); key `TETHER_OPENAI_COMPATIBLE_API_KEY` if set, else
  `none` (a local server wants no key). `OPENAI_API_KEY` is never sent there, unless
  the URL is OpenAI's own (`https://api.openai.com/...`).
- `deepseek:deepseek-chat`: DeepSeek's OpenAI-compatible API; key `DEEPSEEK_API_KEY`.
- `scripted:path/to/script.yaml`: a `ScriptedModel` answering from a JSON/YAML list.
- `scripted:package.module:function`: a `ScriptedModel` asking a Python policy
  `f(request) -> response` (the working folder is importable).

Unknown prefixes, a missing SDK (`pip install 'tether[openai]'`, see `tether._extras`)
or a missing API key raise `errors.UserError` with a message that says what to do.

How long one request may take and how often a failed one is retried: the spec's
`models: {timeout: 60, max_retries: 1}`, else `TETHER_MODEL_TIMEOUT` (seconds) and
`TETHER_MODEL_RETRIES`, else 300 s and 3 retries.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tether import _imports
from tether._extras import needs
from tether._validation import http_url_problem
from tether.errors import UserError
from tether.models.base import Model

DEEPSEEK_BASE_URL = "https://api.deepseek.com"
#: The key of an `openai-compatible:` server: a variable of its own, so a key meant for
#: OpenAI never goes to whatever URL a model name names.
COMPATIBLE_KEY_ENV = "TETHER_OPENAI_COMPATIBLE_API_KEY"

FORMS = (
    "openai:MODEL, anthropic:MODEL, openai-compatible:BASE_URL#MODEL, deepseek:MODEL, "
    "scripted:PATH (JSON or YAML list of responses) or scripted:module:function"
)


def resolve_model(name: str, *, env: Mapping[str, str] | None = None, **options: Any) -> Model:
    """The `Model` a name stands for (see the module docstring for the forms).

    `env` replaces `os.environ` for keys and base URLs; `options` go to the adapter's
    constructor (for example `timeout=`, `max_retries=`).
    """
    environ: Mapping[str, str] = os.environ if env is None else env
    options = {**_env_options(environ), **options}
    text = name.strip()
    prefix, sep, rest = text.partition(":")
    rest = rest.strip()
    if not sep or not prefix:
        raise UserError(f"model name {name!r} has no provider prefix; use one of: {FORMS}")
    if not rest:
        raise UserError(f"model name {name!r} names no model after {prefix + ':'!r}")
    prefix = prefix.lower()
    if prefix in _HOSTED:
        adapter, env_prefix, default_url = _HOSTED[prefix]
        build = adapter(text)
        return build(
            rest,
            api_key=_require_key(environ, f"{env_prefix}_API_KEY", name),
            base_url=_env_url(environ, f"{env_prefix}_BASE_URL") or default_url,
            name=text,
            **options,
        )
    if prefix == "openai-compatible":
        base_url, hash_, model = rest.rpartition("#")
        if not hash_ or not base_url.strip() or not model.strip():
            raise UserError(
                f"model name {name!r}: write openai-compatible:BASE_URL#MODEL, for example "
                "openai-compatible:http://127.0.0.1:8000/v1#qwen3-8b"
            )
        base_url = base_url.strip()
        if not base_url.startswith(("http://", "https://")):
            raise UserError(
                f"model name {name!r}: the base URL must start with http:// or https://"
            )
        problem = http_url_problem(base_url)
        if problem:  # refused now, not by every request of the run
            raise UserError(f"model name {name!r}: the base URL {problem}")
        return _openai(text)(
            model.strip(),
            api_key=_compatible_key(environ, base_url, name),
            base_url=base_url,
            name=text,
            **options,
        )
    if prefix == "scripted":
        return _scripted(rest, name=text)
    raise UserError(f"unknown model provider {prefix!r} in {name!r}; use one of: {FORMS}")


def _env_url(environ: Mapping[str, str], var: str) -> str | None:
    """A provider's base URL from the environment (None when unset), refused with a
    `UserError` when no request could reach it (no host, a bad port, a space)."""
    url = environ.get(var, "").strip()
    if not url:
        return None
    problem = http_url_problem(url)
    if problem:
        raise UserError(f"{var}: the URL {problem}")
    return url


def _env_options(environ: Mapping[str, str]) -> dict[str, Any]:
    """`timeout` and `max_retries` from `TETHER_MODEL_TIMEOUT` / `TETHER_MODEL_RETRIES`."""
    out: dict[str, Any] = {}
    raw = environ.get("TETHER_MODEL_TIMEOUT", "").strip()
    if raw:
        try:
            seconds = float(raw)
        except ValueError:
            seconds = -1.0
        if not 0 < seconds <= 3600:  # also refuses NaN
            raise UserError(
                f"TETHER_MODEL_TIMEOUT={raw!r} is not a number of seconds above 0 and at most 3600"
            )
        out["timeout"] = seconds
    raw = environ.get("TETHER_MODEL_RETRIES", "").strip()
    if raw:
        if not raw.isdigit() or int(raw) > 10:
            raise UserError(f"TETHER_MODEL_RETRIES={raw!r} is not a whole number from 0 to 10")
        out["max_retries"] = int(raw)
    return out


def _require_key(environ: Mapping[str, str], var: str, name: str) -> str:
    key = environ.get(var, "").strip()
    if not key:
        raise UserError(f"model {name!r} needs an API key: set the environment variable {var}")
    return key


def _compatible_key(environ: Mapping[str, str], base_url: str, name: str) -> str:
    """The key for an `openai-compatible:` server: `TETHER_OPENAI_COMPATIBLE_API_KEY`;
    failing that `OPENAI_API_KEY`, but only for OpenAI's own URL; else the placeholder
    `none`, which a keyless local server ignores."""
    from tether.models._sdk import is_openai_url  # light, but only needed here

    key = environ.get(COMPATIBLE_KEY_ENV, "").strip()
    if key:
        return key
    if not is_openai_url(base_url):
        return "none"
    key = environ.get("OPENAI_API_KEY", "").strip()
    if not key:
        raise UserError(
            f"model {name!r} needs an API key: set the environment variable "
            f"{COMPATIBLE_KEY_ENV} (or OPENAI_API_KEY, which is sent to api.openai.com only)"
        )
    return key


def _openai(name: str) -> Callable[..., Model]:
    """The OpenAI adapter's class; without the extra, a `UserError` that names it (said
    before a missing API key: installing comes first)."""
    with needs("openai", f"the model {name!r}"):
        from tether.models.openai import OpenAIModel
    return OpenAIModel


def _anthropic(name: str) -> Callable[..., Model]:
    """The Anthropic adapter's class (as `_openai`)."""
    with needs("anthropic", f"the model {name!r}"):
        from tether.models.anthropic import AnthropicModel
    return AnthropicModel


#: The hosted providers: the adapter, the prefix of the variables that hold the key and
#: the base URL (`<PREFIX>_API_KEY`, `<PREFIX>_BASE_URL`), the base URL without one.
_HOSTED: dict[str, tuple[Callable[[str], Callable[..., Model]], str, str | None]] = {
    "openai": (_openai, "OPENAI", None),
    "anthropic": (_anthropic, "ANTHROPIC", None),
    "deepseek": (_openai, "DEEPSEEK", DEEPSEEK_BASE_URL),
}


def _scripted(ref: str, *, name: str) -> Model:
    from tether.models.scripted import ScriptedModel

    path = Path(ref).expanduser()
    if path.is_file():
        return ScriptedModel(responses=load_script(path), name=name, keep_requests=1)
    if _imports.is_ref(ref):
        policy = _imports.load_ref(ref, what="policy")
        if isinstance(policy, Model):
            return policy
        if not callable(policy):
            raise UserError(
                f"{ref!r} is not a function: a scripted policy is f(request) -> response"
            )
        # Nothing reads the requests of a model named on the command line: keep only
        # the last, so a worker that runs for days holds none of its past.
        return ScriptedModel(policy=policy, name=name, keep_requests=1)
    raise UserError(
        f"scripted model {name!r}: no file {str(path)!r}, and {ref!r} is not a "
        "module:function reference"
    )


def load_script(path: Path) -> list[Any]:
    """The responses of a script file: a JSON or YAML list (or a mapping with a
    `responses` list). Each item is a text or a mapping such as
    `{"text": ..., "tool_calls": [{"name": ..., "arguments": {...}}]}`."""
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot read the script {str(path)!r}: {exc}") from exc
    import yaml  # here: a task started from a module:function never parses YAML

    try:
        data: Any = (
            json.loads(raw) if path.suffix.lower() == ".json" else yaml.safe_load(raw)
        )  # YAML is a superset of JSON, so other suffixes parse either
    except json.JSONDecodeError as exc:
        raise UserError(
            f"the script {str(path)!r} is not valid JSON: line {exc.lineno}, column "
            f"{exc.colno}: {exc.msg}"
        ) from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserError(f"the script {str(path)!r} is not valid YAML: {where}{problem}") from exc
    if isinstance(data, Mapping) and "responses" in data:
        data = data["responses"]
    if not isinstance(data, list):
        raise UserError(f"the script {str(path)!r} must hold a list of responses")
    if not data:
        raise UserError(f"the script {str(path)!r} holds no responses: give at least one")
    for i, item in enumerate(data):
        if not isinstance(item, str | Mapping):
            raise UserError(
                f"the script {str(path)!r}: response {i + 1} must be a text or a mapping, "
                f"not {type(item).__name__}"
            )
        if isinstance(item, Mapping):
            _check_response(item, f"the script {str(path)!r}: response {i + 1}")
    return data


#: The keys of a scripted response, and of each of its tool calls (`scripted._coerce`).
_RESPONSE_KEYS = ("text", "tool_calls")
_CALL_KEYS = ("name", "arguments", "id")


def _unknown(keys: Iterable[Any], known: Sequence[str], where: str, what: str) -> None:
    for key in keys:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise UserError(
                f"{where} has an unknown key {key!r}{hint}: {what} takes " + ", ".join(known)
            )


def _check_response(item: Mapping[Any, Any], where: str) -> None:
    """A script's response mapping holds only the keys a scripted model reads, so a
    misspelt one is refused before a task starts, not dropped (or failing mid-run)."""
    _unknown(item, _RESPONSE_KEYS, where, "a response")
    calls = item.get("tool_calls", [])
    if not isinstance(calls, list):
        raise UserError(f"{where}: tool_calls must be a list of {{name, arguments}}")
    for n, call in enumerate(calls, 1):
        at = f"{where}, tool call {n}"
        if not isinstance(call, Mapping):
            raise UserError(f"{at} must be a mapping of name and arguments")
        _unknown(call, _CALL_KEYS, at, "a tool call")
        if "name" not in call:
            raise UserError(f"{at} needs a name (the tool to call)")

"""Secrets never stored, never printed: one redactor for what comes from outside.

Known secret values — environment variables whose names say they hold one (`*_KEY`,
`*_TOKEN`, `*_SECRET`, `*PASSWORD*`, `*CREDENTIAL*`) — and the userinfo of any URL
(`http://user:KEY@host`; of a database URL only the password, the role name stays),
`Authorization` headers and `Bearer` tokens, and every secret
handed to a tool by `ToolContext.secret`,
are replaced by `***` in what the runtime journals from the
outside world (model errors, tool errors and results, model names that are URLs) and in
what the command line prints.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

MASK = "***"
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.I)
_USERINFO = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://)([^/@\s:]*)(:[^/@\s]*)?@")
#: Database URLs: their user is a role name, shown; only a password that is there is
#: masked (`postgresql://app:***@db`, `postgresql://postgres@db` as it is). Elsewhere a
#: user alone may be a token (`https://TOKEN@host`): the whole userinfo is masked.
_DB_SCHEMES = frozenset(
    {"postgresql", "postgres", "postgresql+psycopg", "mysql", "mariadb", "redis", "rediss"}
)
#: Credentials as HTTP sends them: an `Authorization` header (or one quoted in JSON, or
#: a Python dict's repr), and a bare `Bearer <token>`.
_AUTH_HEADER = re.compile(
    r"""((?:proxy-)?authorization["']?\s*[:=]\s*["']?)"""
    r"""(?:(?:bearer|basic|token|digest)\s+)?[^\s"',}]+""",
    re.I,
)
_BEARER = re.compile(r"(\bbearer\s+)[A-Za-z0-9._~+/=-]{8,}", re.I)
#: Shorter values are too likely to be ordinary words to be masked everywhere.
MIN_SECRET_LENGTH = 8


@lru_cache(maxsize=8)
def _secrets(items: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    found = {v for k, v in items if _SECRET_NAME.search(k) and len(v) >= MIN_SECRET_LENGTH}
    # Longest first, so a secret that contains another is masked whole.
    return tuple(sorted(found, key=len, reverse=True))


#: Secret values this process was told of (`remember`), whatever their variable's name.
_remembered: set[str] = set()


def remember(value: str) -> None:
    """Mask `value` from now on, in this process (a secret handed to a tool)."""
    if len(value) >= MIN_SECRET_LENGTH:
        _remembered.add(value)


def known_secrets(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The secret values of the environment (cached per environment content), and those
    remembered."""
    env = os.environ if environ is None else environ
    found = _secrets(tuple(sorted(env.items())))
    if not _remembered:
        return found
    return tuple(sorted(set(found) | _remembered, key=len, reverse=True))


def redact(text: str, secrets: tuple[str, ...] | None = None) -> str:
    """`text` with URL userinfo and every known secret value masked."""
    if not text:
        return text
    out = _USERINFO.sub(_mask_userinfo, text) if "://" in text else text
    low = out.lower()
    if "authorization" in low:
        out = _AUTH_HEADER.sub(rf"\1{MASK}", out)
    if "bearer" in low:
        out = _BEARER.sub(rf"\1{MASK}", out)
    for secret in known_secrets() if secrets is None else secrets:
        if secret in out:
            out = out.replace(secret, MASK)
    return out


def _mask_userinfo(m: re.Match[str]) -> str:
    scheme, user, password = m.group(1), m.group(2), m.group(3)
    if not user and (not password or password == ":"):
        return m.group()  # no userinfo to speak of
    if scheme[:-3].lower() in _DB_SCHEMES:
        return f"{scheme}{user}:{MASK}@" if password and password != ":" else m.group()
    return f"{scheme}{MASK}@"


def redact_data(value: Any, secrets: tuple[str, ...] | None = None) -> Any:
    """`redact` applied to every string in a JSON-like value (the environment is read
    once per call, not once per string)."""
    if secrets is None:
        secrets = known_secrets()
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, dict):
        return {k: redact_data(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_data(v, secrets) for v in value]
    return value


class Redactor:
    """`redact_data` with the environment's secrets read once, for a run that journals
    many documents: `clean` tells, from a document's JSON text, that it holds nothing
    to mask (no URL, no secret, raw or JSON-escaped), so most need no walk at all."""

    def __init__(self, secrets: tuple[str, ...] | None = None) -> None:
        self._fixed = secrets
        self._seen = -1
        self._refresh()

    def _refresh(self) -> None:
        # A secret handed to a tool during the run (`remember`) is masked from then on.
        if self._seen == len(_remembered):
            return
        self._seen = len(_remembered)
        base = known_secrets() if self._fixed is None else self._fixed
        self.secrets = tuple(sorted(set(base) | _remembered, key=len, reverse=True))
        escaped = {json.dumps(s, ensure_ascii=False)[1:-1] for s in self.secrets}
        self._needles = tuple(dict.fromkeys([*self.secrets, *escaped]))

    def clean(self, text: str) -> bool:
        """True when `text` (a document's JSON) contains nothing `redact` would mask."""
        if self._seen != len(_remembered):
            self._refresh()
        # The header and the scheme are matched in any case, as `redact` does (a
        # lower-cased copy is far cheaper than the walk it saves).
        low = text.lower()
        if "://" in low or "authorization" in low or "bearer" in low:
            return False
        # A loop, not `any` of a generator: most runs know no secret, and every
        # document of a commit is looked at.
        for needle in self._needles:  # noqa: SIM110
            if needle in text:
                return False
        return True

    def clean_data(self, value: Any) -> bool:
        """True when `data(value)` would change nothing: `clean` of its strings and
        keys, gathered without serializing it (a walk costs less than a JSON text).
        False for a value holding anything but JSON's types (a caller that serializes it
        may turn it into text; `data` makes a tuple a list): the caller takes the long
        way."""
        parts: list[str] = []
        return _strings(value, parts) and self.clean("\x00".join(parts))

    def data(self, value: Any) -> Any:
        """`redact_data` with this redactor's secrets."""
        self._refresh()
        return redact_data(value, self.secrets)


#: What `Redactor.clean_data` passes over: values no redaction changes.
_NUMBERS: frozenset[type] = frozenset({int, float, bool, type(None)})


def _strings(value: Any, out: list[str]) -> bool:
    """Add the strings in a JSON-like value (its keys too) to `out`; False when it holds
    something else."""
    kind = type(value)
    if kind is str:
        out.append(value)
    elif kind is dict:
        for k, v in value.items():
            if type(k) is str:
                out.append(k)
            elif type(k) not in _NUMBERS:
                return False
            kind = type(v)
            if kind is str:
                out.append(v)
            elif kind not in _NUMBERS and not _strings(v, out):
                return False
    elif kind is list:  # a tuple: `data` makes it a list, a change
        for v in value:
            kind = type(v)
            if kind is str:
                out.append(v)
            elif kind not in _NUMBERS and not _strings(v, out):
                return False
    else:
        return kind in _NUMBERS
    return True

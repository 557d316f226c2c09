"""Who may change a task through the dashboard.

Reading is open to whoever reaches the server (it binds to 127.0.0.1 by default), but
only under a host name the server knows: a page from another site that points a name
of its own at 127.0.0.1 (DNS rebinding) is refused.

Every mutating request carries the server's token (`TETHER_TOKEN`, or one generated
and printed at start), in one of two ways:

- an API client sends it as `Authorization: Bearer TOKEN` (or `X-Tether-Token`): a
  header another site's page cannot make a browser send;
- a browser gets it as a cookie by opening the link `tether serve` prints
  (`/?token=...`); its forms then also carry a CSRF token derived from the server's
  token (a page of another site knows neither), and a request whose `Origin` is not
  this server is refused.

A refused request changes nothing and gets 403 with the reason.

**Named tokens** (`tether serve --tokens-file FILE` or `TETHER_TOKENS`) give each person
a token of their own instead of the shared one: a line `name:token` each (a `#` at the
start of a line or after a space starts a comment; in `TETHER_TOKENS`, entries are
separated by commas). The name of the token a request carries is the `by` of every
decision it takes, journaled; asking for another `by` with it is refused. Tokens are
compared in constant time and never shown or logged.

**Host names**: besides the local ones and the address it binds, the server answers to
the names it is told (`--allowed-host`, `TETHER_ALLOWED_HOSTS`): a name, `*.example.com`
for every name under a domain, or `*` for any (explicitly: it gives up the DNS
rebinding check).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from starlette.requests import Request

from tether import errors

#: The cookie that holds the token in a browser.
COOKIE = "tether_token"
#: The form field (or header) of the CSRF token.
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"


class Refused(Exception):
    """A request without the right to do what it asks; the message says why."""


def new_token() -> str:
    """A random token for a server started without `TETHER_TOKEN`."""
    return secrets.token_urlsafe(24)


#: The fewest characters a named token may have.
MIN_TOKEN_CHARS = 16
#: What a token's name may be: a handle or an e-mail address, as `--by` would take it.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}")
#: Where a comment starts in a tokens file (a token holds no space, so may hold a `#`).
_COMMENT = re.compile(r"(?:^|\s)#")


def parse_tokens(text: str, source: str, *, lines: bool = True) -> dict[str, str]:
    """`name:token` entries (one per line, a `#` at its start or after a space starting
    a comment; or, with `lines` false, separated by commas) as a name -> token map; a
    bad entry is a `UserError` that names `source` and the entry's place, never a token."""
    named: dict[str, str] = {}
    entries = text.splitlines() if lines else text.split(",")
    for number, raw in enumerate(entries, 1):
        entry = (_COMMENT.split(raw, maxsplit=1)[0] if lines else raw).strip()
        if not entry:
            continue
        where = f"{source}, {'line' if lines else 'entry'} {number}"
        name, colon, token = entry.partition(":")
        name, token = name.strip(), token.strip()
        if not colon or not _NAME.fullmatch(name):
            raise errors.UserError(
                f"{where}: expected name:token, the name letters, digits and . _ @ + - (at most 64)"
            )
        if len(token) < MIN_TOKEN_CHARS or any(c.isspace() or c == "," for c in token):
            raise errors.UserError(
                f"{where}: the token of {name!r} must be at least {MIN_TOKEN_CHARS} "
                'characters without spaces or commas (e.g. from `python -c "import '
                'secrets; print(secrets.token_urlsafe(24))"`)'
            )
        if name in named:
            raise errors.UserError(f"{where}: {name!r} has a token already")
        if token in named.values():
            raise errors.UserError(f"{where}: {name!r} has the token of another name")
        named[name] = token
    if not named:
        raise errors.UserError(f"{source} names no token (lines of name:token)")
    return named


@dataclass(frozen=True)
class Caller:
    """Who sent a request that may change a task: `name` for a named token, None for
    the server's shared token."""

    name: str | None = None

    def by(self, asked: str | None = None) -> str:
        """The `by` of a decision: the token's name (another one asked is refused), or
        what the request asks with the shared token (default `web`)."""
        if self.name is None:
            return asked or "web"
        if asked is not None and asked != self.name:
            raise Refused(
                f"signed in as {self.name!r}: decisions are taken in your own name, "
                f"not as {asked!r}"
            )
        return self.name


@dataclass(frozen=True)
class Access:
    """Who may use one server: its shared token (None when each person has a named
    one), the named tokens, the CSRF tokens derived from them, and its host names.
    (Not a service guard: that is `tether.tools.breaker.Guard`.)"""

    token: str | None
    hosts: frozenset[str] = field(default_factory=frozenset)
    named: Mapping[str, str] = field(default_factory=dict)

    @property
    def csrf(self) -> str:
        """The CSRF token of the shared token's forms."""
        return self.csrf_of(self.token or "")

    @staticmethod
    def csrf_of(token: str) -> str:
        """The CSRF token of the forms of a browser signed in with `token`."""
        return hmac.new(token.encode(), b"tether-csrf", hashlib.sha256).hexdigest()[:32]

    def who(self, candidate: str | None) -> Caller | None:
        """The caller whose token `candidate` is, or None. Every token is compared, in
        constant time, whichever matches."""
        if not candidate:
            return None
        given = str(candidate).encode()
        found: Caller | None = None
        if self.token is not None and hmac.compare_digest(given, self.token.encode()):
            found = Caller()
        for name, token in self.named.items():
            if hmac.compare_digest(given, token.encode()):
                found = Caller(name)
        return found

    def token_ok(self, candidate: str | None) -> bool:
        """True when `candidate` is one of the tokens (compared in constant time)."""
        return self.who(candidate) is not None

    def check_host(self, request: Request) -> None:
        """Refuse a host name this server does not answer to (DNS rebinding)."""
        host = (request.headers.get("host") or "").rsplit(":", 1)[0].strip("[]").lower()
        if not self.hosts or "*" in self.hosts or host in self.hosts:
            return
        if any(h.startswith("*.") and host.endswith(h[1:]) for h in self.hosts):
            return
        raise Refused(
            f"unknown host {host!r}: open the dashboard by the address it printed, or "
            "start it with --allowed-host NAME (TETHER_ALLOWED_HOSTS) for a name a proxy "
            "serves it under"
        )

    def check_api(self, request: Request) -> Caller:
        """An API write: the token in a header; who sent it."""
        auth = request.headers.get("authorization", "")
        given = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        caller = self.who(given or request.headers.get("x-tether-token"))
        if caller is None:
            raise Refused(
                "this request changes a task and needs the server's token: "
                "send 'Authorization: Bearer TOKEN' (the token tether serve printed, "
                "TETHER_TOKEN, or your own named token)"
            )
        return caller

    def check_form(self, request: Request, csrf: str | None) -> Caller:
        """A browser form: the token cookie, a same-origin request, the CSRF token; who
        sent it."""
        cookie = request.cookies.get(COOKIE)
        caller = self.who(cookie)
        if caller is None or cookie is None:
            raise Refused(
                "this action needs the server's token: open the dashboard by the link "
                "tether serve printed (it ends in ?token=...), or with your own token"
            )
        origin = request.headers.get("origin")
        if origin and origin != "null":
            own = request.headers.get("host", "")
            if urlsplit(origin).netloc != own:
                raise Refused(f"request from another site ({origin}) refused")
        given = csrf or request.headers.get(CSRF_HEADER)
        if not given or not hmac.compare_digest(given, self.csrf_of(cookie)):
            raise Refused("the form's CSRF token is missing or wrong: reload the page")
        return caller

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
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from starlette.requests import Request

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


@dataclass(frozen=True)
class Access:
    """Who may use one server: its token (and the CSRF token derived from it) and its
    host names. (Not a service guard: that is `tether.tools.breaker.Guard`.)"""

    token: str
    hosts: frozenset[str] = field(default_factory=frozenset)

    @property
    def csrf(self) -> str:
        """The CSRF token of this server's forms."""
        return hmac.new(self.token.encode(), b"tether-csrf", hashlib.sha256).hexdigest()[:32]

    def token_ok(self, candidate: str | None) -> bool:
        """True when `candidate` is the token (compared in constant time)."""
        return bool(candidate) and hmac.compare_digest(str(candidate), self.token)

    def check_host(self, request: Request) -> None:
        """Refuse a host name this server does not answer to (DNS rebinding)."""
        host = (request.headers.get("host") or "").rsplit(":", 1)[0].strip("[]").lower()
        if self.hosts and host not in self.hosts:
            raise Refused(f"unknown host {host!r}: open the dashboard by the address it printed")

    def check_api(self, request: Request) -> None:
        """An API write: the token in a header."""
        auth = request.headers.get("authorization", "")
        given = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        given = given or request.headers.get("x-tether-token")
        if not self.token_ok(given):
            raise Refused(
                "this request changes a task and needs the server's token: "
                "send 'Authorization: Bearer TOKEN' (the token tether serve printed, or "
                "TETHER_TOKEN)"
            )

    def check_form(self, request: Request, csrf: str | None) -> None:
        """A browser form: the token cookie, a same-origin request, the CSRF token."""
        if not self.token_ok(request.cookies.get(COOKIE)):
            raise Refused(
                "this action needs the server's token: open the dashboard by the link "
                "tether serve printed (it ends in ?token=...)"
            )
        origin = request.headers.get("origin")
        if origin and origin != "null":
            own = request.headers.get("host", "")
            if urlsplit(origin).netloc != own:
                raise Refused(f"request from another site ({origin}) refused")
        given = csrf or request.headers.get(CSRF_HEADER)
        if not given or not hmac.compare_digest(given, self.csrf):
            raise Refused("the form's CSRF token is missing or wrong: reload the page")

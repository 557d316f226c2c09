"""The web dashboard (`tether serve`, extra `web`): server-rendered pages with htmx
(vendored in `static/`, no network, no build step), a live timeline over Server-Sent
Events, a JSON API under `/api` with its OpenAPI schema, and Prometheus `/metrics`.

Modules: `app` (the application, error mapping, host check), `security` (token and
CSRF), `pages` (HTML and forms), `live` (the event stream), `api` (JSON), `metrics`,
`server` (running it with uvicorn on a socket of its own).
"""

from __future__ import annotations

from tether.web.app import create_app

__all__ = ["create_app"]

"""Running the dashboard: uvicorn on a socket bound before it starts, so the address
(and a port the system chose, for `--port 0`) is known and printed first."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Mapping, Sequence

from tether import errors


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on `host:port`; `UserError` when it cannot be had."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise errors.UserError(f"cannot resolve --host {host!r}: {exc.strerror}") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as exc:
        sock.close()
        raise errors.UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def names_of(host: str) -> list[str]:
    """The host names a server bound to `host` answers to (besides the local ones):
    that address, or for every interface (`0.0.0.0`, `::`) this machine's names and
    addresses."""
    if host not in ("0.0.0.0", "::", ""):
        return [host]
    names = {host, socket.gethostname(), socket.getfqdn()}
    # A machine whose own name does not resolve answers to its names only.
    with contextlib.suppress(OSError):
        names |= {str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None)}
    return sorted(names)


def url_of(sock: socket.socket) -> str:
    """`http://host:port` of a bound socket (IPv6 addresses in brackets)."""
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def serve(
    *,
    db: str | None,
    host: str,
    port: int,
    token: str | None,
    announce: Callable[[str], None],
    named: Mapping[str, str] | None = None,
    allowed_hosts: Sequence[str] = (),
    forwarded_allow_ips: str | None = None,
    migrate: bool = True,
) -> None:
    """Serve until interrupted; `announce(url)` once the socket listens. The other
    arguments are `create_app`'s (`allowed_hosts`: names besides the bound address's)."""
    import uvicorn

    from tether.web.app import create_app

    sock = bind(host, port)
    app = create_app(
        db,
        token=token,
        hosts=[*names_of(host), *allowed_hosts],
        named=named,
        forwarded_allow_ips=forwarded_allow_ips,
        migrate=migrate,
    )
    # Proxy headers are the app's (trusted only from --forwarded-allow-ips), not
    # uvicorn's default (which trusts 127.0.0.1). uvicorn's lines go through the logging
    # the CLI set up (level, text or JSON).
    config = uvicorn.Config(
        app, log_config=None, lifespan="on", access_log=False, proxy_headers=False
    )
    server = uvicorn.Server(config)
    announce(url_of(sock))
    server.run(sockets=[sock])

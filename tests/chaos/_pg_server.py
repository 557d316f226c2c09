"""A PostgreSQL server of the test's own, to restart and kill, and a ticket service.

- `find_bindir()`: the folder with `initdb`, `pg_ctl` and `postgres` (on `PATH`, from
  `pg_config --bindir`, else the newest `/usr/lib/postgresql/*/bin`).
- `PgServer`: `initdb` into a temporary folder, then a server on a free port of
  127.0.0.1 (its unix socket in that folder too, fsync off: the data are thrown away).
  `restart()` (`pg_ctl restart -m fast`: the clients are told, as in a planned restart),
  `kill()` (SIGKILL to the postmaster and every backend: a crash or an OOM kill, the
  clients are told nothing, a commit on its way gets no answer), `start()` (the crash
  recovery of a killed server runs then). `hold_commits()` makes every commit wait, after
  it is flushed, for a synchronous standby that does not exist, so that a kill cuts off
  a commit that has landed; `unhold_commits()` (server down) undoes it.
- `paced_actor`: `tests.services.policies.actor` taking `PACE` seconds per call, so that
  a run lasts long enough to be restarted and killed under.

initdb refuses to run as root. Tests may run as root (CI's container does), so then
every server command runs as the `postgres` account (the one the distribution's
packages create; `nobody` if there is none) through `runuser`, and the folder is given
to it; otherwise the commands run as the current user.

Without the server binaries the tests skip with the reason, unless
`TETHER_TEST_PG_BINARIES=required` (CI sets it): then they fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.support.procs import proc_state, wait_for
from tether.models.base import ModelRequest, ModelResponse

REQUIRED_ENV = "TETHER_TEST_PG_BINARIES"
#: Seconds each call of `paced_actor` takes.
PACE = 0.3
_TOOLS = ("initdb", "pg_ctl", "postgres")


def _has_tools(folder: str | Path) -> bool:
    return all(os.access(Path(folder, t), os.X_OK) for t in _TOOLS)


def find_bindir() -> Path | None:
    """Where `initdb`, `pg_ctl` and `postgres` are, or None."""
    on_path = shutil.which("initdb")
    if on_path and _has_tools(Path(on_path).resolve().parent):
        return Path(on_path).resolve().parent
    if shutil.which("pg_config"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                ["pg_config", "--bindir"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
            if out and _has_tools(out):
                return Path(out)

    def version(path: str) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", path))

    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True):
        if _has_tools(folder):
            return Path(folder)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (the postmaster's backends)."""
    found = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat, encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.split("/")[2]))
    return found


class PgServer:
    """A throw-away PostgreSQL cluster (see the module docstring)."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        # /tmp rather than $TMPDIR: the socket's path must stay short (about 100 bytes),
        # and the server's account (as root: `postgres`) must be able to reach it.
        tmp = "/tmp" if os.access("/tmp", os.W_OK | os.X_OK) else None
        self.root = Path(tempfile.mkdtemp(prefix="tether-pg-", dir=tmp))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = _free_port()
        self.run_as: str | None = None
        if os.geteuid() == 0:
            names = [p.pw_name for p in pwd.getpwall()]
            self.run_as = "postgres" if "postgres" in names else "nobody"
            account = pwd.getpwnam(self.run_as)
            os.chown(self.root, account.pw_uid, account.pw_gid)
        self._cmd(
            "initdb", "-D", self.data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"
        )
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.root}'",
            # fsync off survives a killed server (what was written sits in the kernel's
            # cache), only not a machine crash; `synchronous_commit` stays on: off, a
            # killed server would lose commits it had already confirmed.
            "fsync": "off",
            "full_page_writes": "off",
            "max_connections": "60",
            "shared_buffers": "16MB",
            "log_min_messages": "warning",
        }
        with open(self.data / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.writelines(f"{k} = {v}\n" for k, v in settings.items())

    def _cmd(self, tool: str, *args: str | Path, timeout: float = 120) -> str:
        argv = [str(self.bindir / tool), *map(str, args)]
        if self.run_as:
            argv = ["runuser", "-u", self.run_as, "--", *argv]
        proc = subprocess.run(argv, cwd=self.root, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(
                f"{tool} failed ({proc.returncode}): {proc.stderr.strip()}\n{self.server_log()}"
            )
        return proc.stdout

    def server_log(self) -> str:
        """The end of the server's log (for failure messages)."""
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def url(self, schema: str | None = None, app: str = "tether-chaos") -> str:
        """A libpq URL of the server's `postgres` database (tether's `schema=` added)."""
        query = f"application_name={quote(app)}"
        if schema:
            query += f"&schema={schema}"
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres?{query}"

    def start(self) -> None:
        """Start the server (unless it runs) and wait until it accepts connections."""
        if self.postmaster_pid() is not None:
            return
        self._cmd("pg_ctl", "-D", self.data, "-l", self.log, "-w", "-t", "120", "start")

    def restart(self) -> None:
        """A fast restart: sessions ended with a word to their clients, then back up."""
        self._cmd(
            "pg_ctl", "-D", self.data, "-l", self.log, "-w", "-t", "120", "-m", "fast", "restart"
        )

    def postmaster_pid(self) -> int | None:
        """The running postmaster's pid (from `postmaster.pid`), None if none runs."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if proc_state(pid) not in (None, "Z") else None

    def kill(self) -> None:
        """SIGKILL the postmaster and all its processes at once: no client hears a word."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        # Stopped first, so that it forks no new backend (nor restarts one) in between.
        os.kill(pid, signal.SIGSTOP)
        # The backends before the postmaster: one that outlived it would notice its
        # death and tell its client ("unexpected postmaster exit") before dying.
        victims = [*_children(pid), pid]
        for p in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        wait_for(
            lambda: all(proc_state(p) in (None, "Z") for p in victims),
            "the killed server's processes to be gone",
        )
        # As after a power cut: a killed postmaster that nobody reaps stays a zombie
        # whose pid would pass for a live server; its shared memory is gone already.
        # (and so would the pid in the socket's lock file).
        (self.data / "postmaster.pid").unlink(missing_ok=True)
        for lock in self.root.glob(".s.PGSQL.*"):
            lock.unlink(missing_ok=True)

    def hold_commits(self) -> None:
        """From now on a commit is written and flushed here, then waits for a standby
        that does not exist (`synchronous_standby_names`): killing the server then cuts
        off a commit that has landed (the crash recovery replays it) without an answer.
        Returns once a commit of the test's own waits so (`SyncRep`)."""
        import psycopg

        base = self.url().split("?")[0]
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS hold_probe (x int)")
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody_listens'")
            conn.execute("SELECT pg_reload_conf()")

        def held() -> bool:
            # The setting reaches the commits once the checkpointer has read it again.
            probe = psycopg.connect(base, autocommit=True)
            pid = probe.info.backend_pid
            done = threading.Event()

            def insert() -> None:
                with contextlib.suppress(psycopg.Error):
                    probe.execute("INSERT INTO hold_probe VALUES (1)")
                done.set()

            threading.Thread(target=insert, daemon=True).start()
            try:
                with psycopg.connect(base, autocommit=True) as conn:
                    for _ in range(50):
                        if done.wait(0.02):
                            return False
                        row = conn.execute(
                            "SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (pid,)
                        ).fetchone()
                        if row and row[0] == "SyncRep":
                            conn.execute("SELECT pg_cancel_backend(%s)", (pid,))
                            return True
                    conn.execute("SELECT pg_cancel_backend(%s)", (pid,))
                    return False
            finally:
                done.wait(30)
                probe.close()

        wait_for(held, "commits to wait for the missing standby")

    def waiting_commits(self, app: str) -> int:
        """How many sessions of `app` wait in a held commit (see `hold_commits`)."""
        import psycopg

        with psycopg.connect(self.url().split("?")[0], autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE application_name = %s AND wait_event = 'SyncRep'",
                (app,),
            ).fetchone()
        return int(row[0]) if row else 0

    def unhold_commits(self) -> None:
        """Undo `hold_commits` while the server is down (the next start reads it)."""
        auto = self.data / "postgresql.auto.conf"
        lines = auto.read_text().splitlines(keepends=True)
        auto.write_text("".join(ln for ln in lines if "synchronous_standby_names" not in ln))

    def stop(self) -> None:
        """Stop the server (immediately; the data are thrown away)."""
        if self.postmaster_pid() is not None:
            with contextlib.suppress(RuntimeError, subprocess.SubprocessError):
                self._cmd("pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")

    def close(self) -> None:
        """Stop the server and remove its folder."""
        self.stop()
        if self.postmaster_pid() is not None:
            self.kill()
        shutil.rmtree(self.root, ignore_errors=True)


def pg_server() -> PgServer:
    """A started `PgServer`, or a skip (a failure when `TETHER_TEST_PG_BINARIES` says
    the binaries are required) naming what is missing."""
    bindir = find_bindir()
    why = None
    if bindir is None:
        why = (
            "no PostgreSQL server binaries (initdb, pg_ctl, postgres) on PATH, in "
            "`pg_config --bindir` or in /usr/lib/postgresql/*/bin: install the server "
            "(Debian: apt-get install postgresql)"
        )
    elif os.geteuid() == 0 and not shutil.which("runuser"):
        why = "running as root, and initdb refuses root: runuser (util-linux) is needed"
    if why is not None:
        if os.environ.get(REQUIRED_ENV) == "required":
            pytest.fail(f"{REQUIRED_ENV}=required, but {why}")
        pytest.skip(why)
    assert bindir is not None
    server = PgServer(bindir)
    try:
        server.start()
    except BaseException:
        server.close()
        raise
    return server


async def paced_actor(request: ModelRequest) -> ModelResponse:
    """`tests.services.policies.actor`, `PACE` seconds per call."""
    from tests.services.policies import actor

    await asyncio.sleep(PACE)
    return actor(request)

"""Random kills: real tether processes SIGKILLed at random moments, against real services.

One task does a bit of everything that must survive a crash: a batch of three tickets
in one round whose third the ticket service refuses for good (`on_exhausted:
compensate`: the two created are cancelled), reads of two declared sources (snapshots),
evidence, claims, report sections, `write_report`, and one ticket a person approves;
its contract sends notices to a webhook receiver. The drivers are real processes:
`tether run` / `tether resume` drive the task, `tether worker --once` sweeps the
notices. Each is SIGKILLed after a random delay (seeded, printed: `seed=N` reproduces a
failure with `TETHER_TEST_SEED=N`), and once at each of a few registered fail points;
the test restarts it, answers the person's questions as they come (approve the ticket,
waive the compensated batch), and at the end asserts, from the services' own counts and
tether's journal:

- the task ended `satisfied` (`delivered_with_waivers`: the batch is waived);
- each effect happened once: one ticket per title (`a`, `b`, the open questions; `c`
  never), one effective cancel each for `a` and `b` and none for anything else;
- events are numbered 1..N without a gap; every op intended has a final result (no op
  left non-terminal), each op intended once;
- every done item's evidence is a valid artifact; the report file is there (the
  delivery checked its recorded hash); each declared source was read once (one snapshot);
- `tether rebuild TASK` finds no difference between the log and the projections;
- every notice the journal calls for reached the receiver, with one id per event
  (a repeat of an id after a kill is allowed: receivers drop repeats), and each is
  journaled (`notice.sent`) once.

Sizes: by default 3 random kills and 2 fail points per backend (SQLite, and PostgreSQL
at `TETHER_TEST_PG_URL`). `TETHER_TEST_STRESS=1` kills at every registered fail point
and 12 random moments; `TETHER_TEST_KILLS=N` asks for N random kills (a soak). Each
`tether worker` runs with `--concurrency` 1 or 3 (seeded too).
Timing never decides a verdict: a kill that lands after the process ended is no kill,
and every wait is on a process or a condition.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.e2e.test_ab_comparison import DATA
from tests.e2e.test_ab_comparison import spec as ab_spec
from tests.reliability.random_kill_support import MODEL, TOOLS_REF
from tests.reliability.test_crash_windows import ROOT, of_type
from tests.support.services import NoticeReceiver, TicketAPI

from tether import failpoints

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STRESS = os.environ.get("TETHER_TEST_STRESS") == "1"
KILLS = int(os.environ.get("TETHER_TEST_KILLS") or (12 if STRESS else 3))
#: Fail points a `tether resume` of this task (or, for notices, a sweeping worker)
#: reaches; the others (claims by workers, compaction) are left to their own tests.
POINTS = sorted(failpoints.KNOWN - {"during_claim", "during_compaction"})
FAIL_POINTS = len(POINTS) if STRESS else 2
#: Random delays before a kill: from about the interpreter's start-up to about as long
#: as a driver runs before the task waits for a person.
MIN_DELAY = 0.5
MAX_DELAY = 2.5


class Harness:
    """One database, one workspace, the ticket service and the notice receiver."""

    def __init__(
        self, db: str, root: Path, api: TicketAPI, hook: NoticeReceiver, seed: int
    ) -> None:
        self.db, self.root, self.api, self.hook = db, root, api, hook
        self.rng = random.Random(seed)
        # A worker runs with --concurrency 1 or 3, drawn from its own generator (the
        # plan of kills a seed gives stays the same).
        self.concurrency_rng = random.Random(seed + 1)
        self.ws = root / "ws"
        self.ws.mkdir()
        shutil.copytree(DATA / "corpus_ab", self.ws / "corpus")
        (self.ws / "dimensions.txt").write_text("price sso uptime\n")
        data = ab_spec("corpus_ab")
        data["items"].insert(
            0,
            {"id": "batch", "title": "file tickets a, b and c as one batch",
             "done_when": {"kind": "op", "tool": "file_ticket", "args": {"title": "c"}}},
        )  # fmt: skip
        data["tools"].append({"name": "file_ticket", "on_exhausted": "compensate"})
        data["notify"] = {"targets": [{"webhook": hook.url}]}
        self.spec = root / "spec.yaml"
        self.spec.write_text(yaml.safe_dump(data, sort_keys=False))
        self.task = ""
        self.finished = False
        self.log: list[str] = []

    def env(self, points: str | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
        env.update(PYTHONPATH=str(ROOT), TETHER_TOOLS=TOOLS_REF, TICKETS_URL=self.api.url)
        if points:
            env["TETHER_FAILPOINTS"] = points
        return env

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "tether.cli", *args, "--db", self.db]
        res = subprocess.run(cmd, cwd=self.ws, env=self.env(), capture_output=True, text=True,
                             timeout=120)  # fmt: skip
        assert res.returncode == 0 or not check, (args, res.returncode, res.stderr[-3000:])
        return res

    def json(self, *args: str) -> Any:
        return json.loads(self.cli(*args, "--json").stdout)

    def start(self, what: str, points: str | None = None) -> subprocess.Popen[str]:
        if what == "worker":
            concurrency = self.concurrency_rng.choice(["1", "3"])
            self.log.append(f"worker --concurrency {concurrency}:")
            args = ["worker", "--once", "--poll", "0.05", "--model", MODEL, "--quiet",
                    "--concurrency", concurrency]  # fmt: skip
        elif not self.task:
            args = ["run", str(self.spec), "--model", MODEL, "--workspace", str(self.ws)]
        else:
            args = ["resume", self.task, "--model", MODEL]
        cmd = [sys.executable, "-m", "tether.cli", *args, "--db", self.db]
        return subprocess.Popen(cmd, cwd=self.ws, env=self.env(points), text=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip

    def task_id(self) -> str:
        if not self.task:
            # Before the first commit there is no database yet (a driver killed early,
            # or a worker started first).
            res = self.cli("list", "--json", check=False)
            listed = json.loads(res.stdout) if res.returncode == 0 else []
            if listed:
                self.task = str(listed[0]["task_id"])
        return self.task

    def drive(self, what: str, *, delay: float | None = None, points: str | None = None) -> int:
        """One process; SIGKILLed after `delay` if it still runs then. Its exit code."""
        if what == "drive" and self.finished:
            what = "worker"  # nothing to resume: sweep instead
        proc = self.start(what, points)
        try:
            _, err = proc.communicate(timeout=delay if delay is not None else 300)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            _, err = proc.communicate(timeout=30)
        code = proc.returncode
        self.log.append(f"{what} delay={delay} points={points} -> {code}")
        # A kill (ours: -9; a fail point: 137) or a clean end; nothing else.
        assert code in (0, -9, 137), (what, code, err[-3000:])
        self.task_id()
        return code

    def answer_people(self) -> str:
        """Approve pending approvals, waive the compensated batch; the task's status."""
        if not self.task_id():
            return "none"
        doc = self.json("status", self.task)
        self.finished = doc["status"] == "satisfied"
        if doc["status"] != "waiting":
            return str(doc["status"])
        for req in self.json("approvals", self.task):
            if req.get("status") == "pending":
                self.cli("approve", self.task, req["request_id"])
                self.log.append(f"approved {req['request_id']}")
        if doc["waiting"].get("kind") == "decision":
            items = {i["id"]: i for i in doc["ledger"]["items"]}
            if items["batch"]["status"] == "blocked":
                self.cli("waive", self.task, "batch", "--reason", "compensated; not needed")
                self.log.append("waived batch")
        return str(doc["status"])


def _pick_points(rng: random.Random) -> list[str]:
    points = list(POINTS)
    rng.shuffle(points)
    # Which hit of the point: the first, or a later one (another call, round or commit).
    return [f"{p}={rng.choice([1, 2, 3])}" for p in points[:FAIL_POINTS]]


def run_harness(h: Harness) -> None:
    """Kills, restarts and the people's answers until the task ends; then the checks."""
    plan: list[tuple[str, float | None, str | None]] = []
    for p in _pick_points(h.rng):
        plan.append(("worker" if "notice" in p else "drive", None, p))
    for _ in range(KILLS):
        what = h.rng.choice(["drive", "drive", "worker"])
        plan.append((what, h.rng.uniform(MIN_DELAY, MAX_DELAY), None))
    h.rng.shuffle(plan)
    for what, delay, points in plan:
        h.drive(what, delay=delay, points=points)
        h.answer_people()
    # To the end, undisturbed: a driver (or a few: each stops at a person's wait).
    for _ in range(8):
        if h.answer_people() == "satisfied":
            break
        h.drive("drive")
    # The notices of the last events: one worker sweeps them at its start (a notice a
    # killed worker had taken is not waited for: its sender is gone).
    h.drive("worker")
    check_end(h)


def expected_notices(h: Harness) -> dict[str, str]:
    """The notices the journal calls for: event seq -> kind (as `notices.notice_of`)."""
    want: dict[str, str] = {}
    evs = h.json("events", h.task)
    for n, e in enumerate(evs):
        d, kind = e["data"], None
        if e["type"] == "approval.requested":
            kind = "op_in_doubt" if ".in_doubt" in d["request_id"] else "approval_requested"
        elif e["type"] == "decision.requested":
            kind = "decision_needed"
        elif e["type"] == "task.status" and d["dst"] in ("satisfied", "failed", "stalled"):
            kind = "finished" if d["dst"] == "satisfied" else d["dst"]
        elif e["type"] == "task.status" and d["dst"] == "waiting":
            if d.get("reason") in ("needs_user_input", "status_probe", "max_rounds"):
                kind = "need_help"
        elif e["type"] == "budget.threshold":
            kind = "budget"
        prev = evs[n - 1] if n else None
        if kind and e["type"] == "task.status" and prev and prev["type"] == "decision.requested":
            kind = None
        if kind:
            want[f"{h.task}:{e['seq']}"] = kind
    return want


#: Notices that ask people to act: one the journal answers later may not be sent (it is
#: not, when no sweep came before the answer: `notices.ASKS`).
ASKS = {"approval_requested", "op_in_doubt", "decision_needed", "need_help"}


def answered_later(h: Harness) -> set[str]:
    """The notice ids of requests for a person the journal answers later (as
    `notices._answered`): an approval decided or closed, the task out of the wait."""
    evs = h.json("events", h.task)
    out: set[str] = set()
    for n, e in enumerate(evs):
        later = evs[n + 1 :]
        if e["type"] == "approval.requested":
            rid = e["data"]["request_id"]
            done = any(
                x["type"] in ("approval.decided", "approval.closed")
                and x["data"].get("request_id") == rid
                for x in later
            )
        else:
            done = any(
                x["type"] == "task.status" and x["data"].get("src") == "waiting" for x in later
            )
        if done:
            out.add(f"{h.task}:{e['seq']}")
    return out


def check_end(h: Harness) -> None:
    tid = h.task
    doc = h.json("status", tid)
    assert (doc["status"], doc["stop_reason"]) == ("satisfied", "delivered_with_waivers"), (
        doc,
        h.log,
    )
    items = {i["id"]: i for i in doc["ledger"]["items"]}
    assert items.pop("batch")["status"] == "waived"
    assert all(i["status"] == "done" for i in items.values()), items
    evs = h.json("events", tid)
    # The journal: numbered without a gap.
    assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1))
    # Each effect once, as the service counts it.
    stats = h.api.stats()
    tickets = h.api.tickets()
    titles = Counter(t["title"] for t in tickets)
    assert titles["a"] == titles["b"] == 1 and "c" not in titles, (titles, h.log)
    questions = [t for t in tickets if t["title"].startswith("Open questions")]
    assert len(questions) == 1, (questions, h.log)
    assert stats["created"] == 3 == len(tickets)
    cancels = stats["cancels"]
    effective = Counter(c["ticket"] for c in cancels if c["outcome"].startswith("cancelled"))
    by_title = {t["title"]: str(t["id"]) for t in tickets}
    assert effective == {by_title["a"]: 1, by_title["b"]: 1}, (stats["cancels"], h.log)
    assert {c["ticket"] for c in stats["cancels"]} == {by_title["a"], by_title["b"]}
    # Each op intended once, each with a final result; none left in flight.
    intents = Counter(d["op_id"] for d in of_type(evs, "op.intended"))
    assert all(n == 1 for n in intents.values()), intents
    results = {d["op_id"]: d["status"] for d in of_type(evs, "op.result")}
    unfinished = {o for o in intents if results.get(o) not in ("succeeded", "failed")}
    assert not unfinished, (unfinished, results, h.log)
    # Every done item's evidence holds.
    arts = {a["artifact_id"]: a for a in h.json("artifacts", tid)}
    for item in items.values():
        for ref in item.get("evidence") or []:
            kind, _, ident = str(ref).partition(":")
            if kind == "artifact":
                assert arts[ident]["valid"], (item, arts[ident])
    reports = [a for a in arts.values() if a["kind"] == "report" and a["valid"]]
    assert len(reports) == 1 and (h.ws / "report.md").is_file()
    # Each declared source read once: a snapshot made before a kill is not made again.
    snapshots = [d for d in of_type(evs, "artifact.stored") if d["kind"] == "source_snapshot"]
    assert Counter(d["name"] for d in snapshots) == {"A": 1, "B": 1}, (snapshots, h.log)
    # The projections are what the log says.
    rebuilt = h.json("rebuild", tid)
    assert not rebuilt.get("differences"), rebuilt
    # Each notice the journal calls for reached the receiver, under its event's id.
    seen = h.hook.stats()
    got = Counter(n["id"] for n in seen["notices"])
    want = expected_notices(h)
    # A request answered before any sweep came is not sent; every other one is.
    answered = answered_later(h)
    want = {i: k for i, k in want.items() if i in got or not (k in ASKS and i in answered)}
    assert set(want) <= set(got), (want, got, h.log)
    kinds = {n["id"]: n["body"]["kind"] for n in seen["notices"]}
    assert {i: kinds[i] for i in want} == want
    # And each is journaled once (a sender killed after journaling it sends it no more).
    journaled = Counter(d["notice_id"] for d in of_type(h.json("events", tid), "notice.sent"))
    assert {i: journaled[i] for i in want} == dict.fromkeys(want, 1), (journaled, h.log)


@pytest.fixture
def services() -> Iterator[tuple[TicketAPI, NoticeReceiver]]:
    api = TicketAPI()
    api.faults(unavailable_titles=["c"])
    hook = NoticeReceiver()
    try:
        yield api, hook
    finally:
        api.close()
        hook.close()


def _seed() -> int:
    return int(os.environ.get("TETHER_TEST_SEED") or random.SystemRandom().randrange(10**6))


def test_sqlite_random_kills(tmp_path: Path, services: tuple[TicketAPI, NoticeReceiver]) -> None:
    seed = _seed()
    print(f"seed={seed} (TETHER_TEST_SEED={seed} reproduces the plan)")
    h = Harness(f"sqlite:///{tmp_path / 'tether.db'}", tmp_path, *services, seed)
    run_harness(h)
    print("\n".join(h.log))


@pytest.mark.postgres
def test_postgres_random_kills(
    tmp_path: Path, services: tuple[TicketAPI, NoticeReceiver], pg_schema_url: Callable[[], str]
) -> None:
    seed = _seed()
    print(f"seed={seed} (TETHER_TEST_SEED={seed} reproduces the plan)")
    h = Harness(pg_schema_url(), tmp_path, *services, seed)
    run_harness(h)
    print("\n".join(h.log))

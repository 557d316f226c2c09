"""Hostile input through the real CLI (issue #12): exit 2, one short paragraph on stderr
without a traceback, nothing written; never a hang, and nothing on the terminal that
acts on it.

Each case runs `tether` as a subprocess in a folder of its own (see `tests.support.cli`)
and compares the folder's files before and after. Independent commands run
concurrently.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cli import (
    DONE,
    assert_clean_error,
    assert_ok,
    cli_env,
    describe,
    json_out,
    snapshot,
    spec_dict,
    tether,
    tether_many,
    write_spec,
)

RUN = ("run", "spec.yaml", "--model", DONE)
BIG = "1" + "0" * 23  # 10**23: more than any database integer
#: What would act on a terminal: C0 controls but newline and tab, DEL and C1 controls,
#: bidirectional overrides, line separators.
UNSAFE = (
    {chr(c) for c in range(0x20)} - {"\n", "\t"}
    | {chr(c) for c in range(0x7F, 0xA0)}
    | set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029")
)


def _case(root: Path, name: str) -> Path:
    d = root / name
    d.mkdir()
    return d


def _spec_text(**extra: Any) -> str:
    return yaml.safe_dump(spec_dict(1, **extra), sort_keys=False)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(database file, task id): a delivered one-item task."""
    folder = tmp_path_factory.mktemp("hostile-seed")
    write_spec(folder / "spec.yaml", 1)
    db = folder / "seed.db"
    doc = json_out(tether(*RUN, "--db", f"sqlite:///{db}", "--json", cwd=folder))
    assert doc["status"] == "satisfied"
    return db, doc["task_id"]


@pytest.fixture(scope="module")
def waiting(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """(database file, task id, request id): a task waiting for the approval of an
    overwrite (out/i1.txt exists before it starts)."""
    folder = tmp_path_factory.mktemp("hostile-approval")
    write_spec(folder / "spec.yaml", 1)
    (folder / "out").mkdir()
    (folder / "out" / "i1.txt").write_text("old\n", encoding="utf-8")
    db = folder / "wait.db"
    doc = json_out(tether(*RUN, "--db", f"sqlite:///{db}", "--json", cwd=folder))
    assert doc["status"] == "waiting", doc
    requests = json_out(
        tether("approvals", doc["task_id"], "--db", f"sqlite:///{db}", "--json", cwd=folder)
    )
    pending = [r["request_id"] for r in requests if r["status"] == "pending"]
    assert len(pending) == 1, requests
    return db, doc["task_id"], pending[0]


def _copy(db: Path, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / db.name
    shutil.copyfile(db, copy)
    return copy


# --- specs ------------------------------------------------------------------------------

_ITEM = "items:\n  - id: a\n    title: A\n"
_RULE = "objective: x\nitems:\n  - {{id: a, title: A, done_when: {rule}}}\n"


def _laughs() -> str:
    lines = [
        "objective: x",
        _ITEM.rstrip("\n"),
        'l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
    ]
    for n in range(1, 10):
        lines.append(f"l{n}: &l{n} [" + ",".join([f"*l{n - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


HOSTILE_SPECS: dict[str, tuple[str, list[str]]] = {
    "deep-json": (
        '{"objective": "x", "items": [{"id": "a", "title": "A"}], "budget": '
        + "[" * 20_000
        + "]" * 20_000
        + "}",
        ["nested deeper", "line 1"],
    ),
    "deep-yaml": (
        "objective: x\n"
        + _ITEM
        + "budget:\n"
        + "".join("  " * (n + 1) + "-\n" for n in range(400)),
        ["nested deeper"],
    ),
    "billion-laughs": (_laughs(), ["line"]),
    "recursive-alias": (
        _RULE.format(rule="{kind: op, tool: t, args: &r {x: *r}}"),
        ["recursive"],
    ),
    "inf-budget": (
        "objective: x\n" + _ITEM + "budget: {money_usd: .inf}\n",
        ["budget.money_usd", "finite"],
    ),
    "nan-args": (
        _RULE.format(rule="{kind: op, tool: write_file, args: {n: .nan}}"),
        ["items.0.done_when.args", "NaN"],
    ),
    "bad-date": ("objective: x\n" + _ITEM + "name: 2020-13-45\n", ["line 5", "2020-13-45"]),
    "huge-int": (
        "objective: x\n" + _ITEM + "budget: {tokens: " + "9" * 5000 + "}\n",
        ["line 5", "digits"],
    ),
    "list-key": ("objective: x\n" + _ITEM + "? [a]\n: b\n", ["line 5", "key"]),
    "nul-text": ('objective: "x\\0y"\n' + _ITEM, ["objective", "NUL"]),
    "long-path": (
        "objective: x\nitems:\n  - {id: a, title: A, done_when: {kind: file, path: "
        + "a" * 5000
        + "}}\n",
        ["items.0.done_when.path", "at most"],
    ),
    "nul-path": (
        'objective: x\nitems:\n  - {id: a, title: A, done_when: {kind: file, path: "a\\0b"}}\n',
        ["items.0.done_when.path", "NUL"],
    ),
    "absolute-path": (
        "objective: x\nitems:\n  - {id: a, title: A, done_when: {kind: file, path: /etc/passwd}}\n",
        ["items.0.done_when.path", "absolute"],
    ),
    "climbing-path": (
        _RULE.format(rule="{kind: file, path: ../../etc/passwd}"),
        ["items.0.done_when.path", "outside"],
    ),
    "empty-path": (
        "objective: x\nitems:\n  - {id: a, title: A, done_when: {kind: file, path: ''}}\n",
        ["items.0.done_when.path", "empty"],
    ),
    "root-workspace": (_spec_text(workspace="/"), ["filesystem root"]),
    "too-large": ("objective: x\n" + _ITEM + "#" * (2 << 20) + "\n", ["larger than"]),
}


def test_hostile_specs_exit_2_quickly_and_write_nothing(tmp_path: Path) -> None:
    dirs = {}
    for case, (content, _) in HOSTILE_SPECS.items():
        d = _case(tmp_path, case)
        (d / "spec.yaml").write_text(content, encoding="utf-8")
        dirs[case] = d
    before = {case: snapshot(d) for case, d in dirs.items()}
    t0 = time.monotonic()
    procs = tether_many([(RUN, d) for d in dirs.values()], timeout=60)
    assert time.monotonic() - t0 < 60
    for (case, d), proc in zip(dirs.items(), procs, strict=True):
        assert_clean_error(proc, 2, *HOSTILE_SPECS[case][1])
        assert snapshot(d) == before[case], case
        assert not (d / ".tether").exists(), case


def test_submit_refuses_the_same_specs(tmp_path: Path) -> None:
    cases = ["billion-laughs", "climbing-path", "root-workspace", "inf-budget"]
    dirs = []
    for case in cases:
        d = _case(tmp_path, case)
        (d / "spec.yaml").write_text(HOSTILE_SPECS[case][0], encoding="utf-8")
        dirs.append(d)
    procs = tether_many([(("submit", "spec.yaml"), d) for d in dirs])
    for case, d, proc in zip(cases, dirs, procs, strict=True):
        assert_clean_error(proc, 2, *HOSTILE_SPECS[case][1])
        assert not (d / ".tether").exists(), case


# --- workspaces -------------------------------------------------------------------------


def test_root_and_home_workspaces_are_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    write_spec(tmp_path / "spec.yaml", 1)
    (tmp_path / "to-root").symlink_to("/")
    (tmp_path / "to-home").symlink_to(home)
    env = cli_env(HOME=str(home))
    before = snapshot(tmp_path)
    cases = [
        ("/", "filesystem root"),
        ("to-root", "filesystem root"),
        (str(home), "home folder"),
        ("to-home", "home folder"),
    ]
    procs = tether_many([((*RUN, "--workspace", ws), tmp_path) for ws, _ in cases], env=env)
    for (ws, needle), proc in zip(cases, procs, strict=True):
        assert_clean_error(proc, 2, needle, ws)
    assert snapshot(tmp_path) == before
    assert not (tmp_path / ".tether").exists()


# --- numbers on the command line --------------------------------------------------------


def test_huge_after_and_limit_are_clamped(tmp_path: Path, seeded: tuple[Path, str]) -> None:
    db = _copy(seeded[0], tmp_path)
    url = f"sqlite:///{db}"
    task = seeded[1]
    before = snapshot(tmp_path)
    after, limit, timeline, negative, after_json = tether_many(
        [
            (("events", task, "--db", url, "--after", BIG), tmp_path),
            (("events", task, "--db", url, "--limit", BIG, "--json"), tmp_path),
            (("timeline", task, "--db", url, "--after", BIG), tmp_path),
            (("events", task, "--db", url, "--after", "-" + BIG, "--json"), tmp_path),
            (("events", task, "--db", url, "--after", BIG, "--json"), tmp_path),
        ]
    )
    for proc in (after, timeline):
        assert_ok(proc)
        assert "Traceback" not in proc.stderr
        assert proc.stdout.strip() == ""
    assert json_out(after_json) == []
    everything = json_out(limit)
    assert everything and everything == json_out(negative)
    assert snapshot(tmp_path) == before


def test_poll_must_be_a_sane_number(tmp_path: Path) -> None:
    procs = tether_many(
        [(("worker", "--once", "--poll", p), tmp_path) for p in ("nan", "inf", "-1", "1e300")]
    )
    for proc in procs:
        assert proc.returncode == 2, describe(proc)
        assert "Traceback" not in proc.stderr and "--poll" in proc.stderr
    assert list(tmp_path.iterdir()) == []


# --- JSON arguments ---------------------------------------------------------------------


def test_bad_json_arguments_of_approve(tmp_path: Path, waiting: tuple[Path, str, str]) -> None:
    db, task, request = waiting
    cases: list[tuple[tuple[str, ...], list[str]]] = [
        (("--modify", '{"a":' * 20_000 + "1" + "}" * 20_000), ["--modify", "nested deeper"]),
        (("--modify", '{"path": ' + "[" * 100 + "]" * 100 + "}"), ["--modify", "nested deeper"]),
        (("--modify", '{"path": NaN}'), ["--modify", "NaN"]),
        (("--modify", '{"path": Infinity}'), ["--modify", "Infinity"]),
        (("--modify", '{"path": "a\\u0000b"}'), ["--modify", "NUL"]),
        (("--modify", '{"path": ' + "9" * 5000 + "}"), ["--modify", "digits"]),
        (("--modify", "[1, 2]"), ["--modify", "JSON object"]),
        (("--done", "--result", "[" * 20_000 + "]" * 20_000), ["--result", "nested deeper"]),
        (("--done", "--result", '{"paid": -Infinity}'), ["--result", "Infinity"]),
    ]
    dirs = []
    for n, _ in enumerate(cases):
        dirs.append(_copy(db, tmp_path / f"c{n}").parent)
    before = [snapshot(d) for d in dirs]
    procs = tether_many(
        [
            (("approve", task, request, "--db", f"sqlite:///{d / db.name}", *args), d)
            for (args, _), d in zip(cases, dirs, strict=True)
        ]
    )
    for (args, needles), d, snap, proc in zip(cases, dirs, before, procs, strict=True):
        assert_clean_error(proc, 2, *needles)
        assert snapshot(d) == snap, args[:1]


def test_arguments_that_are_not_utf8(tmp_path: Path, seeded: tuple[Path, str]) -> None:
    db = _copy(seeded[0], tmp_path)
    before = snapshot(tmp_path)
    bad = os.fsdecode(b"t\xff")
    procs = tether_many(
        [
            (("status", bad, "--db", f"sqlite:///{db}"), tmp_path),
            (("reject", seeded[1], "r1", "--reason", bad, "--db", f"sqlite:///{db}"), tmp_path),
        ]
    )
    for proc in procs:
        assert_clean_error(proc, 2, "UTF-8", "\\xff")
    assert snapshot(tmp_path) == before


# --- the terminal -----------------------------------------------------------------------

ESC_NAME = "evil\x1b[2J\x1b]0;pwned\x07\x9b31m\u202eabc :smile: [bold]x[/bold]"
ESC_OBJECTIVE = "line one\nline two\x1b[1A\rOVERWRITTEN\u2028"


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def test_control_characters_are_never_printed_raw(tmp_path: Path) -> None:
    spec = spec_dict(1, name=ESC_NAME)
    spec["objective"] = ESC_OBJECTIVE
    spec["items"][0]["title"] = "Write \x1b[31mred\x1b[0m"
    (tmp_path / "spec.yaml").write_text(json.dumps(spec), encoding="utf-8")
    db = f"sqlite:///{tmp_path / 'esc.db'}"
    doc = json_out(tether(*RUN, "--db", db, "--json", cwd=tmp_path))
    assert doc["name"] == ESC_NAME and doc["ledger"]["objective"] == ESC_OBJECTIVE
    task = doc["task_id"]
    commands = [
        ("list",),
        ("list", "--json"),
        ("status", task),
        ("status", task, "--json"),
        ("timeline", task),
        ("events", task),
        ("events", task, "--json"),
    ]
    procs = tether_many([((*c, "--db", db), tmp_path) for c in commands])
    for command, proc in zip(commands, procs, strict=True):
        assert_ok(proc)
        raw = set(proc.stdout) & UNSAFE
        assert not raw, f"{command}: {sorted(map(hex, map(ord, raw)))}\n{describe(proc)}"
        if "--json" in command:
            assert ESC_NAME in _strings(json.loads(proc.stdout)), command  # the same data
        else:  # escaped by the view, or by JSON inside an event line
            assert "\\x1b[2J" in proc.stdout or "\\u001b[2J" in proc.stdout, command
    listing = procs[0].stdout
    assert ":smile:" in listing and "[bold]x[/bold]" in listing  # no emoji codes, no markup
    status = procs[2].stdout
    assert "goal: line one\nline two\\x1b[1A\\rOVERWRITTEN\\u2028" in status


# --- damaged databases ------------------------------------------------------------------


def test_random_bytes_and_a_random_body_behind_a_valid_header(tmp_path: Path) -> None:
    noise = os.urandom(16 * 4096)
    cases = []
    for name, data in [
        ("noise", noise),
        ("header", b"SQLite format 3\x00" + noise[16:]),
    ]:
        d = _case(tmp_path, name)
        write_spec(d / "spec.yaml", 1)
        (d / "damaged.db").write_bytes(data)
        cases.append(d)
    before = [snapshot(d) for d in cases]
    procs = tether_many([((*RUN, "--db", f"sqlite:///{d / 'damaged.db'}"), d) for d in cases])
    for d, snap, proc in zip(cases, before, procs, strict=True):
        assert_clean_error(proc, 2, "damaged.db")
        assert snapshot(d) == snap


def test_a_corrupted_page_is_refused_before_anything_is_written(
    tmp_path: Path, seeded: tuple[Path, str]
) -> None:
    good = seeded[0].read_bytes()
    page = int.from_bytes(good[16:18], "big")
    page = 65536 if page == 1 else page
    # Not the free leaf pages: one holds nothing (a migration's dropped table leaves
    # some), SQLite overwrites it when it takes it again. The freelist's trunk pages,
    # which say where the leaves are, are damaged like any other.
    free_leaves: set[int] = set()
    trunk = int.from_bytes(good[32:36], "big")
    while trunk:
        at = (trunk - 1) * page
        count = int.from_bytes(good[at + 4 : at + 8], "big")
        free_leaves.update(
            int.from_bytes(good[at + 8 + 4 * i : at + 12 + 4 * i], "big") for i in range(count)
        )
        trunk = int.from_bytes(good[at : at + 4], "big")
    cases = []
    for n in range(1, len(good) // page):
        if n + 1 in free_leaves:
            continue
        d = _case(tmp_path, f"page{n}")
        write_spec(d / "spec.yaml", 1)
        damaged = bytearray(good)
        damaged[n * page : (n + 1) * page] = os.urandom(page)
        (d / "damaged.db").write_bytes(bytes(damaged))
        cases.append(d)
    before = [snapshot(d) for d in cases]
    procs = tether_many([((*RUN, "--db", f"sqlite:///{d / 'damaged.db'}"), d) for d in cases])
    failures = []
    for d, snap, proc in zip(cases, before, procs, strict=True):
        if proc.returncode != 2 or snapshot(d) != snap:
            failures.append(f"{d.name}: exit {proc.returncode}, changed={snapshot(d) != snap}")
        elif "Traceback" in proc.stderr:
            failures.append(f"{d.name}: traceback")
    assert not failures, "\n".join(failures)

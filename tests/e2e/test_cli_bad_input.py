"""Bad input through the real CLI: exit 2 (3 for an unknown task), one short paragraph
on stderr without a traceback, and nothing written.

Every case runs `tether` as a subprocess in a folder of its own with `TETHER_DB` unset,
and compares the folder's files (including any `-wal`, `-shm` or `-journal` file)
before and after. Independent commands run concurrently to keep the suite fast.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from pathlib import Path

import pytest

from tests.support.cli import (
    DONE,
    assert_clean_error,
    cli_env,
    json_out,
    snapshot,
    tether,
    tether_many,
    write_spec,
)

RUN = ("run", "spec.yaml", "--model", DONE)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(database file, task id): a delivered three-item task, made through the CLI."""
    folder = tmp_path_factory.mktemp("seed")
    write_spec(folder / "spec.yaml")
    db = folder / "seed.db"
    proc = tether(*RUN, "--db", f"sqlite:///{db}", "--json", cwd=folder)
    doc = json_out(proc)
    assert doc["status"] == "satisfied"
    for suffix in ("-wal", "-shm", "-journal"):
        assert not Path(f"{db}{suffix}").exists(), "the CLI left a side file behind"
    return db, doc["task_id"]


def _copy_db(seeded: tuple[Path, str], folder: Path, name: str = "tether.db") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / name
    shutil.copyfile(seeded[0], db)
    return db


def _case_dir(root: Path, name: str) -> Path:
    d = root / name
    d.mkdir()
    return d


# --- bad specs ----------------------------------------------------------------------------

_ITEMS = "items:\n  - id: a\n    title: Write a\n"
BAD_SPECS: dict[str, tuple[str | bytes, list[str]]] = {
    "malformed-yaml": ("name: x\nobjective: [unclosed\n" + _ITEMS, ["malformed YAML", "line"]),
    "duplicate-key": ("objective: x\nobjective: y\n" + _ITEMS, ["objective", "twice"]),
    "unknown-fields": (
        "objective: x\nbogus_field: 1\nitems:\n  - id: a\n    title: t\n    colour: red\n",
        ["bogus_field", "items.0.colour", "unknown field"],
    ),
    "wrong-types": (
        "objective: x\n" + _ITEMS + "limits:\n  max_rounds: lots\nreview: maybe\n",
        ["limits.max_rounds", "integer", "review", "expected true, false"],
    ),
    "missing-objective": (_ITEMS, ["objective", "missing"]),
    "unknown-milestone": (
        "objective: x\nitems:\n  - id: a\n    title: t\n    milestone: nowhere\n",
        ["items.0.milestone", "nowhere"],
    ),
    "top-level-list": ("- objective: x\n- items: []\n", ["mapping"]),
    "not-utf8": (b"objective: caf\xe9\n" + _ITEMS.encode(), []),
}


def test_bad_specs_exit_2_and_create_no_database(tmp_path: Path) -> None:
    dirs = {}
    for case, (content, _) in BAD_SPECS.items():
        d = _case_dir(tmp_path, case)
        data = content if isinstance(content, bytes) else content.encode()
        (d / "task.yaml").write_bytes(data)
        dirs[case] = d
    before = {case: snapshot(d) for case, d in dirs.items()}
    procs = tether_many([(("run", "task.yaml", "--model", DONE), d) for d in dirs.values()])
    for (case, d), proc in zip(dirs.items(), procs, strict=True):
        assert_clean_error(proc, 2, "task.yaml", *BAD_SPECS[case][1])
        assert snapshot(d) == before[case], case
        assert not (d / ".tether").exists(), case


def test_missing_spec_file_or_a_folder(tmp_path: Path) -> None:
    (tmp_path / "folder.yaml").mkdir()
    missing, folder = tether_many(
        [
            (("run", "nowhere.yaml", "--model", DONE), tmp_path),
            (("run", "folder.yaml", "--model", DONE), tmp_path),
        ]
    )
    assert_clean_error(missing, 2, "nowhere.yaml", "not found")
    assert_clean_error(folder, 2, "folder.yaml")
    assert [p.name for p in tmp_path.iterdir()] == ["folder.yaml"]


def test_bad_spec_adds_no_task_to_an_existing_database(
    tmp_path: Path, seeded: tuple[Path, str]
) -> None:
    """The default database (`.tether/tether.db`) exists: a bad spec leaves it
    byte-identical and the task list unchanged."""
    _copy_db(seeded, tmp_path / ".tether")
    (tmp_path / "bad.yaml").write_text(str(BAD_SPECS["unknown-fields"][0]), encoding="utf-8")
    before = snapshot(tmp_path)
    assert_clean_error(tether("run", "bad.yaml", "--model", DONE, cwd=tmp_path), 2, "bad.yaml")
    assert snapshot(tmp_path) == before
    tasks = json_out(tether("list", "--json", cwd=tmp_path))
    assert [t["task_id"] for t in tasks] == [seeded[1]]


def test_tether_db_variable_names_the_database(tmp_path: Path, seeded: tuple[Path, str]) -> None:
    db = _copy_db(seeded, tmp_path / "elsewhere")
    env = cli_env(TETHER_DB=f"sqlite:///{db}")
    doc = json_out(tether("status", seeded[1], "--json", cwd=tmp_path, env=env))
    assert doc["task_id"] == seeded[1]
    assert not (tmp_path / ".tether").exists()


# --- databases that are not tether's ------------------------------------------------------


def test_corrupt_database_file_is_left_byte_identical(tmp_path: Path) -> None:
    noise = os.urandom(8192)
    cases = []
    for command in [RUN, ("status", "t1"), ("list",), ("cancel", "t1")]:
        d = _case_dir(tmp_path, command[0])
        write_spec(d / "spec.yaml")
        (d / "corrupt.db").write_bytes(noise)
        cases.append((d, (*command, "--db", f"sqlite:///{d / 'corrupt.db'}")))
    before = [snapshot(d) for d, _ in cases]
    procs = tether_many([(args, d) for d, args in cases])
    for (d, _), snap, proc in zip(cases, before, procs, strict=True):
        assert_clean_error(proc, 2, "corrupt.db")
        assert snapshot(d) == snap  # the same bytes, and no -wal/-shm/-journal appeared


def test_text_file_given_as_database(tmp_path: Path) -> None:
    cases = []
    for command in [RUN, ("status", "t1")]:
        d = _case_dir(tmp_path, command[0])
        write_spec(d / "spec.yaml")
        (d / "notes.txt").write_text("shopping list\n- milk\n- bread\n", encoding="utf-8")
        cases.append((d, (*command, "--db", f"sqlite:///{d / 'notes.txt'}")))
    before = [snapshot(d) for d, _ in cases]
    procs = tether_many([(args, d) for d, args in cases])
    for (d, _), snap, proc in zip(cases, before, procs, strict=True):
        assert_clean_error(proc, 2, "notes.txt")
        assert snapshot(d) == snap


def _app_db(path: Path) -> None:
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT NOT NULL)")
        conn.execute("INSERT INTO users (name) VALUES ('ann'), ('bob')")
    conn.close()


def test_sqlite_database_of_another_application(tmp_path: Path) -> None:
    cases = []
    for command in [RUN, ("status", "t1"), ("cancel", "t1")]:
        d = _case_dir(tmp_path, command[0])
        write_spec(d / "spec.yaml")
        _app_db(d / "app.db")
        cases.append((d, (*command, "--db", f"sqlite:///{d / 'app.db'}")))
    before = [snapshot(d) for d, _ in cases]
    procs = tether_many([(args, d) for d, args in cases])
    for (d, _), snap, proc in zip(cases, before, procs, strict=True):
        assert_clean_error(proc, 2, "app.db", "not a tether database")
        assert snapshot(d) == snap
        conn = sqlite3.connect(d / "app.db")
        try:
            names = conn.execute("SELECT name FROM users ORDER BY id").fetchall()
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        finally:
            conn.close()
        assert names == [("ann",), ("bob",)]
        assert tables == {"users"}


def test_truncated_or_newer_tether_database(tmp_path: Path, seeded: tuple[Path, str]) -> None:
    truncated = _copy_db(seeded, tmp_path / "truncated")
    with truncated.open("r+b") as f:
        f.truncate(truncated.stat().st_size // 3)
    newer = _copy_db(seeded, tmp_path / "newer")
    conn = sqlite3.connect(newer)
    with conn:
        conn.execute(
            "INSERT INTO tether_schema (version, name, applied_at)"
            " VALUES (999, 'from the future', 0)"
        )
    conn.close()
    cases = []
    for db in (truncated, newer):
        write_spec(db.parent / "spec.yaml")
        for command in (("status", seeded[1]), RUN):
            cases.append((db.parent, (*command, "--db", f"sqlite:///{db}")))
    before = {d: snapshot(d) for d in (truncated.parent, newer.parent)}
    procs = tether_many([(args, d) for d, args in cases])
    for (d, _), proc in zip(cases, procs, strict=True):
        if d == newer.parent:
            assert_clean_error(proc, 2, "999", "upgrade")
        else:
            assert_clean_error(proc, 2, "tether.db")
    for d, snap in before.items():
        assert snapshot(d) == snap


def test_bad_database_urls(tmp_path: Path) -> None:
    write_spec(tmp_path / "spec.yaml")
    (tmp_path / "afolder").mkdir()
    before = snapshot(tmp_path)
    scheme, folder = tether_many(
        [
            ((*RUN, "--db", "mysql://localhost/x"), tmp_path),
            ((*RUN, "--db", f"sqlite:///{tmp_path / 'afolder'}"), tmp_path),
        ]
    )
    assert_clean_error(scheme, 2, "mysql://")
    assert_clean_error(folder, 2, "afolder")
    assert snapshot(tmp_path) == before
    assert not (tmp_path / ".tether").exists()


def test_memory_store_is_refused_where_a_database_must_outlive_the_command(
    tmp_path: Path,
) -> None:
    """docs/operations.md: `memory://` is "gone when the command ends". `status`, `list`,
    `resume`, `approve`, ... on it said "no task with id" (exit 3), `submit` queued a task
    that vanished at once, and `tether run` on it ended with commands (`tether retry
    --db memory:// ...`) that could never reach the task."""
    write_spec(tmp_path / "spec.yaml")
    before = snapshot(tmp_path)
    mem = ("--db", "memory://")
    procs = tether_many(
        [
            (("status", "t1", *mem), tmp_path),
            (("resume", "t1", *mem), tmp_path),
            (("approve", "t1", "r1", *mem), tmp_path),
            (("submit", "spec.yaml", *mem), tmp_path),
            (("worker", "--once", *mem), tmp_path),
        ]
    )
    for proc in procs:
        assert_clean_error(proc, 2, "memory:// keeps nothing between commands")
    listed = tether("list", cwd=tmp_path, env=cli_env(TETHER_DB="memory://"))
    assert_clean_error(listed, 2, "memory:// keeps nothing between commands")
    assert snapshot(tmp_path) == before

    # `run` takes it, and says its task cannot be continued.
    spec = "objective: x\nitems:\n  - {id: a, title: a, done_when: {kind: file, path: a}}\n"
    (tmp_path / "stuck.yaml").write_text(spec + "models: {judge: rules}\n")
    stuck = tether("run", "stuck.yaml", "--model", DONE, *mem, cwd=tmp_path)
    assert stuck.returncode == 0, stuck.stderr
    assert "memory:// keeps nothing: the task is gone" in " ".join(stuck.stdout.split())


def test_status_without_any_database_creates_none(tmp_path: Path) -> None:
    """No database in the working folder: a clear message (exit 2: the database, not
    the task, is what is missing) and no database file made as a side effect."""
    proc = tether("status", "t1", cwd=tmp_path)
    assert_clean_error(proc, 2, ".tether")
    assert list(tmp_path.iterdir()) == []


# --- unknown task -------------------------------------------------------------------------

COMMANDS_ON_A_TASK = ["status", "events", "timeline", "resume", "cancel"]


def test_unknown_task_exits_3(tmp_path: Path, seeded: tuple[Path, str]) -> None:
    cases = []
    for command in COMMANDS_ON_A_TASK:
        db = _copy_db(seeded, tmp_path / command)
        extra = ("--model", DONE) if command == "resume" else ()
        cases.append((db.parent, (command, "t-no-such-task", *extra, "--db", f"sqlite:///{db}")))
    before = [snapshot(d) for d, _ in cases]
    procs = tether_many([(args, d) for d, args in cases])
    for (d, args), snap, proc in zip(cases, before, procs, strict=True):
        assert_clean_error(proc, 3, "t-no-such-task")
        assert snapshot(d) == snap, args[0]


# --- PostgreSQL that does not answer -------------------------------------------------------


def test_postgres_that_does_not_answer(tmp_path: Path) -> None:
    """Port 1 refuses at once: a clear message, quickly, nothing written, and a password
    in the URL is not echoed."""
    write_spec(tmp_path / "spec.yaml")
    before = snapshot(tmp_path)
    t0 = time.monotonic()
    run, status = tether_many(
        [
            ((*RUN, "--db", "postgresql://postgres@127.0.0.1:1/x"), tmp_path),
            (("status", "t1", "--db", "postgresql://postgres:hunter2pw@127.0.0.1:1/x"), tmp_path),
        ]
    )
    assert time.monotonic() - t0 < 30
    # Infrastructure, not bad input: exit 4.
    assert_clean_error(run, 4, "postgresql", "127.0.0.1")
    msg = assert_clean_error(status, 4, "postgresql", "127.0.0.1")
    assert "hunter2pw" not in msg
    assert snapshot(tmp_path) == before
    assert not (tmp_path / ".tether").exists()


# --- models ---------------------------------------------------------------------------------


def test_bad_model_choices_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    judge_dir = _case_dir(tmp_path, "judge")
    write_spec(judge_dir / "spec.yaml", models={"judge": "nosuch:judge"})
    cases: list[tuple[str, tuple[str, ...], list[str]]] = [
        ("prefix", ("run", "spec.yaml", "--model", "telepathy:gpt-9"), ["telepathy", "openai:"]),
        ("openai-key", ("run", "spec.yaml", "--model", "openai:gpt-4.1-mini"), ["OPENAI_API_KEY"]),
        ("no-model", ("run", "spec.yaml"), ["--model"]),
        ("judge", RUN, ["nosuch"]),
        (
            "module",
            ("run", "spec.yaml", "--model", "scripted:no_such_mod_xyz:act"),
            ["no_such_mod_xyz"],
        ),
        (
            "policy",
            ("run", "spec.yaml", "--model", "scripted:tests.e2e.policies:no_such_policy"),
            ["no_such_policy"],
        ),
    ]
    dirs = []
    for name, _, _ in cases:
        d = judge_dir if name == "judge" else _case_dir(tmp_path, name)
        if name != "judge":
            write_spec(d / "spec.yaml")
        dirs.append(d)
    before = [snapshot(d) for d in dirs]
    # OPENAI_API_KEY (and TETHER_MODEL) are not in the environment `cli_env` builds.
    procs = tether_many([(args, d) for (_, args, _), d in zip(cases, dirs, strict=True)])
    for (name, _, needles), d, snap, proc in zip(cases, dirs, before, procs, strict=True):
        assert_clean_error(proc, 2, *needles)
        assert snapshot(d) == snap, name
        assert not (d / ".tether").exists(), name


def test_policy_module_with_a_syntax_error(tmp_path: Path) -> None:
    """`--model scripted:mypolicy:act` where ./mypolicy.py does not compile is bad input,
    like a missing module: exit 2 and one paragraph naming the module and the error, not
    a traceback and exit 1 (at one time `_import_policy` caught only ImportError)."""
    write_spec(tmp_path / "spec.yaml")
    (tmp_path / "mypolicy.py").write_text("def act(request)\n    return 'hi'\n", encoding="utf-8")
    before = snapshot(tmp_path)
    proc = tether("run", "spec.yaml", "--model", "scripted:mypolicy:act", cwd=tmp_path)
    assert_clean_error(proc, 2, "mypolicy")
    assert snapshot(tmp_path) == before


# --- other usage mistakes -------------------------------------------------------------------


def test_a_workspace_that_does_not_exist_is_called_so(tmp_path: Path) -> None:
    """README: `tether run notes.yaml ... --workspace ./repo` in a folder without repo/
    said "workspace repo is not a folder", as for a file; it does not exist, and the
    message says so, where it was given and how to make it."""
    write_spec(tmp_path / "spec.yaml")
    write_spec(tmp_path / "inspec.yaml", workspace="./gone")
    before = snapshot(tmp_path)
    flag, spec, submitted = tether_many(
        [
            ((*RUN, "--workspace", "./repo"), tmp_path),
            (("run", "inspec.yaml", "--model", DONE), tmp_path),
            (("submit", "spec.yaml", "--workspace", "./repo"), tmp_path),
        ]
    )
    for proc, given in ((flag, "--workspace repo"), (spec, "the spec's workspace: gone")):
        assert_clean_error(proc, 2, f"{given} does not exist", "mkdir -p")
    assert_clean_error(submitted, 2, "--workspace repo does not exist")
    assert snapshot(tmp_path) == before


def test_workspace_that_is_not_a_folder(tmp_path: Path) -> None:
    write_spec(tmp_path / "spec.yaml")
    before = snapshot(tmp_path)
    proc = tether(*RUN, "--workspace", "no-such-folder", cwd=tmp_path)
    assert_clean_error(proc, 2, "no-such-folder")
    assert snapshot(tmp_path) == before
    assert not (tmp_path / ".tether").exists()


def test_resume_of_a_finished_task_is_refused(tmp_path: Path, seeded: tuple[Path, str]) -> None:
    db = _copy_db(seeded, tmp_path)
    before = snapshot(tmp_path)
    proc = tether("resume", seeded[1], "--model", DONE, "--db", f"sqlite:///{db}", cwd=tmp_path)
    assert_clean_error(proc, 2, seeded[1], "satisfied")
    assert snapshot(tmp_path) == before


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    procs = tether_many(
        [(("nosuchcommand",), tmp_path), (("events", "t1", "--after", "abc"), tmp_path)]
    )
    for proc in procs:
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_submit_refuses_an_unknown_tool_unless_told_the_workers_have_it(tmp_path: Path) -> None:
    (tmp_path / "spec.yaml").write_text(
        "name: t\nobjective: do it\nitems: [{id: a, title: x}]\ntools: [no_such_tool]\n"
    )
    refused = tether("submit", "spec.yaml", cwd=tmp_path)
    assert_clean_error(refused, 2, "no_such_tool", "not registered")
    assert not (tmp_path / ".tether").exists()
    queued = tether("submit", "spec.yaml", "--skip-tool-check", "--json", cwd=tmp_path)
    assert json_out(queued)["status"] == "queued"


def test_submit_with_a_model_says_where_the_model_comes_from(tmp_path: Path) -> None:
    """`tether submit spec.yaml --model M` (as `run` takes it) answered "No such option:
    --model (Possible options: --help)": the closest option it has, not what to do."""
    write_spec(tmp_path / "spec.yaml")
    before = snapshot(tmp_path)
    for flag in (("--model", DONE), (f"--model={DONE}",)):
        proc = tether("submit", "spec.yaml", *flag, cwd=tmp_path)
        err = assert_clean_error(proc, 2, "submit takes no --model", "tether worker --model")
        assert "Possible options" not in err, err
    assert snapshot(tmp_path) == before

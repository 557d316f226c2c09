"""The CLI at 80 columns and in a pipe (`COLUMNS=80`, no TTY, `NO_COLOR=1`).

What a person copies (option names, task and request ids, artifact ids) is never cut
with `…`; status words and reasons are wrapped whole, never cut mid-word; flags look
like flags; the ledger bar reads the same without colour; times are dates, not unix
floats; `status` shows limits and budget next to usage; an unknown `--type` is exit 2.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.main
import yaml
from rich.console import Console

from tests.support.cli import (
    DONE,
    assert_clean_error,
    assert_ok,
    cli_env,
    describe,
    json_out,
    spec_dict,
    tether,
    tether_many,
)
from tether.cli import app, views
from tether.store import open_store
from tether.store.base import ArtifactRecord, blob_hash

NARROW = cli_env(COLUMNS="80")
WIDTH = 80
#: A unix time as a raw float (2020 to 2033), the way a timestamp must not be shown.
RAW_TIME = re.compile(r"\b1[6-9]\d{8}\.\d+")
LONG_NAME = "quarterly-vendor-contract-renewal-review-for-the-legal-team"


def narrow(*args: str | Path, cwd: Path) -> Any:
    """`tether ARGS` at 80 columns in a pipe."""
    return tether(*args, cwd=cwd, env=NARROW)


def words(text: str) -> set[str]:
    return set(text.split())


def assert_not_cut(proc: Any) -> None:
    assert_ok(proc)
    assert "…" not in proc.stdout, f"something was cut\n{describe(proc)}"


# --- help pages ---------------------------------------------------------------------------


def _commands() -> dict[str, Any]:
    group = typer.main.get_command(app)
    ctx = typer.Context(group, info_name="tether")
    names = group.list_commands(ctx)  # type: ignore[attr-defined]
    return {n: group.get_command(ctx, n) for n in names}  # type: ignore[attr-defined]


def _first_paragraph(help_text: str) -> str:
    import inspect

    return " ".join(inspect.cleandoc(help_text).split("\n\n")[0].split())


def test_top_level_help_lists_every_command_with_its_whole_summary(tmp_path: Path) -> None:
    proc = narrow("--help", cwd=tmp_path)
    assert_not_cut(proc)
    flat = " ".join(proc.stdout.split())
    for name, cmd in _commands().items():
        assert re.search(rf"^  {re.escape(name)}\s", proc.stdout, re.M), name
        summary = _first_paragraph(cmd.short_help or cmd.help or "")
        assert summary in flat, f"summary of {name} cut or missing\n{proc.stdout}"
    assert all(len(line) <= WIDTH for line in proc.stdout.splitlines()), proc.stdout


def test_every_option_of_every_command_is_in_its_help_whole(tmp_path: Path) -> None:
    commands = _commands()
    procs = tether_many(
        [(((name, "--help")), tmp_path) for name in commands], env=NARROW, timeout=120
    )
    for (name, cmd), proc in zip(commands.items(), procs, strict=True):
        assert_not_cut(proc)
        out = proc.stdout
        assert "<bool>" not in out and "<str>" not in out and "<path>" not in out, out
        assert "{" not in out.split("\n", 1)[0], f"usage line of {name}: {out}"
        assert "╭" not in out and "│" not in out, f"{name}: a boxed table\n{out}"
        for param in cmd.params:
            if isinstance(param, typer.core.TyperArgument):
                assert (param.metavar or param.name.upper()) in out.split("\n", 1)[0], name
                continue
            for opt in param.opts:
                assert re.search(rf"(?:^  |, ){re.escape(opt)}(?:,|  | \S|$)", out, re.M), (
                    f"{name}: {opt} missing or cut\n{out}"
                )
            # On the option's row, a flag has no value after it; any other option has one.
            long = max(param.opts, key=len)
            row = next(ln for ln in out.splitlines() if re.match(rf"^  (?:-\w, )?{long}\b", ln))
            rest = row.split(long, 1)[1]
            if param.is_flag:
                assert rest == "" or rest.startswith("  "), f"{name}: flag {long}: {row!r}"
            else:
                assert re.match(r" [^\s<>{}]+(  |$)", rest), f"{name}: {long} value: {row!r}"
            if param.help:
                assert " ".join(param.help.split()) in " ".join(out.split()), (name, param.name)
        for line in out.splitlines():
            assert len(line) <= WIDTH or " " not in line.strip(), f"{name}: {line!r}"


def test_help_names_each_value_by_what_it_is(tmp_path: Path) -> None:
    """A number's value says what it counts (`--grace SECONDS`, `--concurrency N`,
    `--port PORT`, `--until SEQ`), never the bare type (`NUMBER`, `INTEGER`); a bound
    no one can reach (2**63-1, the largest sequence number) is not printed."""
    commands = _commands()
    procs = tether_many(
        [(((name, "--help")), tmp_path) for name in commands], env=NARROW, timeout=120
    )
    for name, proc in zip(commands, procs, strict=True):
        assert_ok(proc)
        for bare in ("INTEGER", "NUMBER", str(2**63 - 1)):
            assert bare not in proc.stdout, f"{name}: {bare}\n{proc.stdout}"
    by_command = {name: proc.stdout for name, proc in zip(commands, procs, strict=True)}
    for name, shown in (
        ("worker", "--grace SECONDS"),
        ("worker", "--concurrency N"),
        ("worker", "--metrics-port PORT"),
        ("serve", "--port PORT"),
        ("replay", "--until SEQ"),
        ("approve", "--modify JSON"),
        ("run", "--reconnect-for SECONDS"),
    ):
        assert shown in by_command[name], f"{name}: {shown}\n{by_command[name]}"
    assert "[default: 0; x>=0]" in by_command["events"], by_command["events"]
    # A choice says what each choice is (it read "md, html or json.").
    assert "md (Markdown), html (one file that opens offline;" in " ".join(
        by_command["report"].split()
    ), by_command["report"]


def test_run_help_keeps_the_model_examples_whole(tmp_path: Path) -> None:
    proc = narrow("run", "--help", cwd=tmp_path)
    assert_not_cut(proc)
    for example in (
        "openai:gpt-4.1-mini,",
        "anthropic:claude-sonnet-4-5,",
        "openai-compatible:http://127.0.0.1:8000/v1#model",
        "TETHER_OPENAI_COMPATIBLE_API_KEY),",
        "scripted:module:function.",
        "--allow-broad-workspace",
    ):
        assert example in words(proc.stdout), example
    assert "Usage: tether run [OPTIONS] SPEC" in proc.stdout


# --- tables and trees ------------------------------------------------------------------------


async def _add_artifacts(db: Path, tid: str) -> list[str]:
    store = await open_store(f"sqlite:///{db}")
    ids = [f"{tid}.snapshot-of-source-B", f"{tid}.evidence-from-B", f"{tid}.claim-about-B"]
    deps = [("source:B@2.0",), (f"artifact:{ids[0]}", "source:B@2.0"), (f"artifact:{ids[1]}",)]
    kinds = ["source_snapshot", "evidence", "claim"]
    try:
        arts = [
            ArtifactRecord(
                i, tid, k, f"{k} named at length for {i}", blob_hash(i.encode()), len(i), deps=d
            )
            for i, k, d in zip(ids, kinds, deps, strict=True)
        ]
        await store.commit(tid, None, [], artifacts=arts, blobs=[i.encode() for i in ids])
    finally:
        await store.close()
    return ids


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """In one database: a task with a long name waiting for an approval (its file
    existed before), an abandoned one, one with invalidated artifacts, a finished one."""
    root = tmp_path_factory.mktemp("narrow")
    (root / "out").mkdir()
    (root / "out" / "i1.txt").write_text("there before the task\n", encoding="utf-8")
    spec = spec_dict(1, name=LONG_NAME, budget={"rounds": 50, "money_usd": 2})
    spec["limits"] = {"max_rounds": 40, "no_progress_rounds": 4}
    (root / "wait.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    waiting = json_out(tether("run", "wait.yaml", "--model", DONE, "--json", cwd=root))
    assert waiting["status"] == "waiting", waiting
    sources = {
        "name": "compare-sources",
        "objective": "compare A and B",
        "items": [{"id": "i", "title": "t"}],
        "sources": [
            {"id": "A", "version": "1.0", "location": "a.md"},
            {"id": "B", "version": "2.0", "location": "b.md"},
        ],
    }
    (root / "sources.yaml").write_text(yaml.safe_dump(sources), encoding="utf-8")
    done_ws = root / "done"
    done_ws.mkdir()
    (root / "done.yaml").write_text(yaml.safe_dump(spec_dict(1, name="done")), "utf-8")
    db = f"sqlite:///{root / '.tether' / 'tether.db'}"
    art_task, abandoned, done = (
        json_out(tether(*args, cwd=cwd))["task_id"]
        for args, cwd in (
            (("submit", "sources.yaml", "--json"), root),
            (("submit", "wait.yaml", "--json"), root),
            (("run", root / "done.yaml", "--model", DONE, "--json", "--db", db), done_ws),
        )
    )
    artifact_ids = asyncio.run(_add_artifacts(root / ".tether" / "tether.db", art_task))
    assert_ok(tether("edit", art_task, "--source", "B=3.0", cwd=root))
    reason = "nobody needs this review any more this quarter"
    assert_ok(tether("abandon", abandoned, "--reason", reason, cwd=root))
    request = json_out(tether("approvals", waiting["task_id"], "--json", cwd=root))
    return {
        "root": root,
        "waiting": waiting["task_id"],
        "request": request[0]["request_id"],
        "artifacts_task": art_task,
        "artifact_ids": artifact_ids,
        "abandoned": abandoned,
        "done": done,
    }


def test_list_keeps_ids_and_status_words_whole(tasks: dict[str, Any]) -> None:
    proc, as_json = tether_many(
        [(("list",), tasks["root"]), (("list", "--json"), tasks["root"])], env=NARROW
    )
    assert_not_cut(proc)
    shown = words(proc.stdout)
    for key in ("waiting", "artifacts_task", "abandoned", "done"):
        assert tasks[key] in shown, key
    for row in json_out(as_json):
        assert row["status"] in shown
        if row["stop_reason"]:
            assert f"({row['stop_reason']})" in shown, (row, proc.stdout)
    assert "(abandoned_by_user)" in shown
    assert not RAW_TIME.search(proc.stdout)
    assert all(len(line.rstrip()) <= WIDTH for line in proc.stdout.splitlines()), proc.stdout


def test_approvals_keeps_the_request_id_whole(tasks: dict[str, Any]) -> None:
    proc = narrow("approvals", tasks["waiting"], cwd=tasks["root"])
    assert_ok(proc)
    assert tasks["request"] in words(proc.stdout), proc.stdout
    assert "pending" in words(proc.stdout)


def test_status_waiting_for_an_approval_shows_the_command_whole(tasks: dict[str, Any]) -> None:
    proc = narrow("status", tasks["waiting"], cwd=tasks["root"])
    assert_ok(proc)
    assert f"tether approve {tasks['waiting']} {tasks['request']}" in proc.stdout
    assert LONG_NAME in words(proc.stdout)


@pytest.mark.parametrize("tree", [False, True], ids=["table", "tree"])
def test_invalid_artifacts_keep_ids_and_reasons_whole(tasks: dict[str, Any], tree: bool) -> None:
    args = ["artifacts", tasks["artifacts_task"], "--invalid", *(["--tree"] if tree else [])]
    proc = narrow(*args, cwd=tasks["root"])
    assert_not_cut(proc)
    shown = words(proc.stdout.replace("│", " "))
    for ident in tasks["artifact_ids"]:
        assert ident in shown, f"{ident} cut\n{proc.stdout}"
    reason = "source B changed from version 2.0 to 3.0"
    assert words(reason) <= shown, f"the reason is cut mid-word\n{proc.stdout}"
    assert proc.stdout.count("3.0") >= 3, proc.stdout
    if not tree:
        assert f"artifact:{tasks['artifact_ids'][0]}" in " ".join(proc.stdout.split())


# --- the ledger bar without colour ------------------------------------------------------------

STATUSES = ("done", "in_progress", "blocked", "skipped", "waived", "pending")


def _progress(**counts: int) -> dict[str, int]:
    base = dict.fromkeys(STATUSES, 0)
    base.update(counts)
    base["total"] = sum(base[s] for s in STATUSES)
    return base


def test_each_item_status_has_its_own_bar_glyph() -> None:
    bars = {s: views.ledger_bar(_progress(**{s: 1})).plain.split("  ")[0] for s in STATUSES}
    assert len(set(bars.values())) == len(STATUSES), bars
    for status, bar in bars.items():
        assert len(set(bar)) == 1, (status, bar)
    # "0/1 done" never shows a full bar of the done glyph.
    assert "█" not in bars["in_progress"]


def test_status_bar_in_a_pipe_tells_in_progress_from_done(tasks: dict[str, Any]) -> None:
    waiting, done = tether_many(
        [
            (("status", tasks["waiting"]), tasks["root"]),
            (("status", tasks["done"]), tasks["root"]),
        ],
        env=NARROW,
    )
    bar = {p: next(ln for ln in p.stdout.splitlines() if " done, " in ln) for p in (waiting, done)}
    assert "0/1 done" in bar[waiting] and "1/1 done" in bar[done]
    assert bar[waiting].split()[0] != bar[done].split()[0], (bar[waiting], bar[done])
    assert "█" not in bar[waiting], bar[waiting]


# --- status: limits and budget next to usage ---------------------------------------------------


def test_status_shows_limits_and_budget_next_to_usage(tasks: dict[str, Any]) -> None:
    text, as_json = tether_many(
        [
            (("status", tasks["waiting"]), tasks["root"]),
            (("status", tasks["waiting"], "--json"), tasks["root"]),
        ],
        env=NARROW,
    )
    assert_ok(text)
    rounds = next(ln for ln in text.stdout.splitlines() if ln.startswith("rounds "))
    assert "max_rounds 40" in rounds and "budget 50" in rounds, text.stdout
    cost = next(ln for ln in text.stdout.splitlines() if ln.startswith("cost "))
    assert "$2.0000" in cost, text.stdout
    assert "no_progress_rounds 4" in text.stdout
    doc = json_out(as_json)
    assert doc["limits"]["max_rounds"] == 40 and doc["limits"]["no_progress_rounds"] == 4
    assert doc["budget"]["limits"]["rounds"] == 50
    assert doc["budget"]["used"]["model_calls"] >= 1


# --- times and event types ----------------------------------------------------------------------


@pytest.mark.parametrize("command", ["timeline", "events"])
def test_timeline_and_events_show_dates_not_unix_floats(
    tasks: dict[str, Any], command: str
) -> None:
    proc = narrow(command, tasks["waiting"], cwd=tasks["root"])
    assert_ok(proc)
    assert "lease.claimed" in proc.stdout
    assert not RAW_TIME.search(proc.stdout), proc.stdout


def test_a_held_lease_is_reported_with_a_date() -> None:
    from tether.errors import TaskBusy

    msg = str(TaskBusy("t1", "host:1", 1796161988.4151442))
    assert "2026-12-01" in msg and "1796161988" not in msg, msg


@pytest.mark.parametrize("command", ["timeline", "events"])
def test_an_unknown_event_type_is_exit_2_listing_the_types(
    tasks: dict[str, Any], command: str
) -> None:
    proc = narrow(command, tasks["waiting"], "--type", "task.status", "--type", "bogus",
                  cwd=tasks["root"])  # fmt: skip
    msg = assert_clean_error(proc, 2, "bogus", "task.status", "lease.claimed", "op.result")
    assert "unknown" in msg.lower() or "no such event type" in msg.lower()
    known = tether(command, tasks["waiting"], "--type", "lease.claimed", cwd=tasks["root"])
    assert_ok(known)
    assert "lease.claimed" in known.stdout


def test_a_service_away_until_a_time_is_shown_as_a_date() -> None:
    """The runtime's messages carry unix times ("unavailable until 1796161988"); the
    timeline and `status` show them as dates."""
    from types import SimpleNamespace

    error = (
        "service tickets is unavailable until 1796161988: breaker open, cooling down until "
        "1796161988.415"
    )
    event = SimpleNamespace(
        seq=7,
        at=1796161900.5,
        type="op.result",
        data={"tool": "create_ticket", "status": "failed", "error": error},
    )
    line = views.timeline_line(event).plain
    assert "until 2026-12-01 21:53:08 UTC: breaker open" in line, line
    assert "1796161988" not in line
    waiting = {"kind": "external", "reason": f"create_ticket: {error}; the task continues then"}
    doc = {
        "task_id": "t1",
        "name": "n",
        "version": 1,
        "status": "waiting",
        "stop_reason": None,
        "ledger": {"objective": "o", "progress": _progress(pending=1), "items": []},
        "waiting": waiting,
        "budget": {"limits": {}, "used": dict.fromkeys(
            ("tokens", "cached_tokens", "money_usd", "wall_seconds", "rounds", "model_calls"), 0
        )},
    }  # fmt: skip
    console = Console(width=80, record=True, no_color=True, soft_wrap=True)
    console.print(views.status_view(doc))
    shown = console.export_text()
    assert "1796161988" not in shown and "until 2026-12-01 21:53:08 UTC" in shown, shown


def test_approvals_shows_the_impact_and_where_a_cut_call_is_whole(tmp_path: Path) -> None:
    """`tether approvals` is where a person reads what a call would do before approving
    it: the request's impact (here: it overwrites a file that was there before) is
    shown, and a call too long for the table says where it is whole."""
    (tmp_path / "notes.md").write_text("draft\n", encoding="utf-8")
    content = "final notes: " + "every line reviewed by the team " * 10 + "END-OF-NOTES\n"
    spec = {
        "objective": "Replace the draft in notes.md",
        "items": [{"id": "notes", "title": "notes.md is final"}],
        "tools": ["write_file"],
        "models": {"judge": "rules"},
    }
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    answers = [
        {
            "text": "rewriting notes.md",
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "notes.md", "content": content}}
            ],
        }
    ]
    (tmp_path / "answers.yaml").write_text(yaml.safe_dump(answers), encoding="utf-8")
    doc = json_out(
        tether("run", "spec.yaml", "--model", "scripted:answers.yaml", "--json", cwd=tmp_path)
    )
    assert doc["status"] == "waiting", doc
    tid = doc["task_id"]
    proc = narrow("approvals", tid, cwd=tmp_path)
    assert_ok(proc)
    flat = " ".join(proc.stdout.split())
    assert "(overwrites notes.md, which existed before the task started)" in flat, proc.stdout
    assert "END-OF-NOTES" not in flat  # cut short in the table...
    assert f"tether approvals {tid} --json shows their arguments whole" in flat, proc.stdout
    (asked,) = json_out(tether("approvals", tid, "--json", cwd=tmp_path))
    assert asked["request"]["args"]["content"] == content  # ...and whole where it says


def test_json_to_a_pipe_is_the_json_itself(tasks: dict[str, Any]) -> None:
    """`--json` in a pipe is the JSON text itself, unhighlighted and unwrapped (written
    as it is: a long task's events took 40 s through rich's rendering before)."""
    whole = narrow("events", tasks["waiting"], "--json", cwd=tasks["root"])
    assert_ok(whole)
    events = json_out(whole)
    assert events and whole.stdout == json.dumps(events, indent=2, ensure_ascii=False) + "\n"


def test_json_to_a_reader_that_stops_ends_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader that stops early (`| head`): the write's `BrokenPipeError` ends the
    output, and stdout is pointed at /dev/null so the flush at exit cannot fail again."""
    import io

    from tether.cli import _app

    class Gone(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    pointed: list[int] = []
    monkeypatch.setattr(_app.out, "_file", Gone())
    monkeypatch.setattr(_app.os, "dup2", lambda fd, to: pointed.append(to))
    monkeypatch.setattr(_app.sys, "stdout", io.StringIO())
    monkeypatch.setattr(_app.sys.stdout, "fileno", lambda: 1, raising=False)
    _app.print_json([{"seq": n} for n in range(10)])
    assert pointed == [1]

"""Hostile input on the newer surfaces: sources, probe limits, notify targets, item
order in a spec; `edit --source`, `tell`, `--by` on the command line; and what
`artifacts` and `report` print.

The same rules as `test_hostile_inputs`: a rejection is tether's `SpecError`/`UserError`
(one paragraph, exit 2 on the command line), never a traceback, and it writes nothing
(the database's rows are compared before and after). What is accepted can be stored and
used: a URL has a host and parses, a version is one printable line. Nothing a command
prints may act on the terminal.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sqlite3
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tether import errors
from tether.spec import parse_spec

FUZZ = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
FUZZ_CLI = settings(FUZZ, max_examples=25)

#: What would act on a terminal (as `tests/e2e/test_cli_hostile.py`).
UNSAFE = (
    {chr(c) for c in range(0x20)} - {"\n", "\t"}
    | {chr(c) for c in range(0x7F, 0xA0)}
    | set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029")
)
EVIL = "\x1b[31mEVIL\x1b]0;title\x07\u202e\x9b2J\r"

odd_text = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["", " ", "\x00", "\x1b[2J", "a\nb", "\u202e", "1.0\r", "a" * 300, "é"]),
)
odd_urls = st.one_of(
    st.sampled_from(
        [
            "http://",
            "http:///x",
            "https://[::1/x",
            "http://[::1]:8080/x",
            "http://u:pw@h/x",
            "http://h:99999/",
            "http://h:0/",
            "http://h:x/",
            "ftp://h/x",
            "file:///etc/passwd",
            "http://h/a b",
            "http://h/\x1b[2J",
            "http://h/\x00",
            "HTTP://H/X",
            "http://h/" + "a" * 5000,
            "//h/x",
            "http:h",
        ]
    ),
    st.builds(lambda a, b: f"http://{a}/{b}", st.text(max_size=12), st.text(max_size=12)),
    st.text(max_size=40),
)


def _base(**extra: Any) -> dict[str, Any]:
    return {"objective": "x", "items": [{"id": "a", "title": "A"}], **extra}


def _accepted_or_spec_error(doc: Any) -> Any:
    try:
        spec = parse_spec(doc)
    except errors.SpecError as exc:
        assert str(exc).strip()
        return None
    json.dumps(spec.model_dump(mode="json"), allow_nan=False)
    return spec


def _usable_url(url: str) -> None:
    parts = urllib.parse.urlsplit(url)
    assert parts.scheme.lower() in ("http", "https"), url
    assert parts.hostname, url
    assert parts.port != 0, url
    assert not any(c.isspace() or c in UNSAFE for c in url), url


@FUZZ
@given(
    kind=st.sampled_from(["document", "dataset", "url", "api", "other", 3]),
    location=st.one_of(odd_urls, odd_text),
    version=odd_text,
    method=st.sampled_from(["GET", "POST", "post", "", None]),
    body=st.sampled_from([None, {}, [], {"a": float("nan")}, "text", 5]),
    pin=st.sampled_from(["snapshot", "fingerprint", "", "SNAPSHOT", None]),
)
def test_any_source_is_usable_or_a_spec_error(
    kind: Any, location: str, version: str, method: Any, body: Any, pin: Any
) -> None:
    src: dict[str, Any] = {"id": "s", "kind": kind, "version": version, "location": location}
    src.update({k: v for k, v in (("method", method), ("body", body), ("pin", pin)) if v})
    spec = _accepted_or_spec_error(_base(sources=[src, dict(src, id="t")]))
    if spec is None:
        return
    for s in spec.sources:
        assert s.version.strip() and not any(c in UNSAFE for c in s.version), s.version
        if s.kind in ("url", "api"):
            _usable_url(s.location)
        else:
            assert s.location.strip() and not any(c in UNSAFE for c in s.location)


@pytest.mark.parametrize(
    "location",
    ["http://", "http:///x", "https://[::1/x", "http://h:99999/", "http://h/a b", "http://h/\x1b"],
)
def test_a_url_that_cannot_be_fetched_is_refused_where_it_is_written(location: str) -> None:
    with pytest.raises(errors.SpecError) as caught:
        parse_spec(
            _base(sources=[{"id": "s", "kind": "url", "version": "1", "location": location}])
        )
    assert "sources.0" in str(caught.value)


@pytest.mark.parametrize("version", ["1.0\x1b[2J", "  ", "2\r\n", "v\u202e1"])
def test_a_version_is_one_printable_line(version: str) -> None:
    with pytest.raises(errors.SpecError, match=r"sources\.0\.version"):
        parse_spec(_base(sources=[{"id": "s", "version": version, "location": "a.md"}]))


@FUZZ
@given(url=odd_urls, secret=st.sampled_from([None, "TOKEN", "1BAD", "", "A" * 200]))
def test_any_webhook_is_usable_or_a_spec_error(url: str, secret: Any) -> None:
    target: dict[str, Any] = {"webhook": url}
    if secret is not None:
        target["secret_env"] = secret
    spec = _accepted_or_spec_error(_base(notify={"targets": [target], "admin": [target, "log"]}))
    if spec is not None:
        for t in [*spec.notify.targets, *spec.notify.admin]:
            if not isinstance(t, str):
                _usable_url(t.webhook)


def test_a_bad_webhook_is_named_once_where_it_is() -> None:
    with pytest.raises(errors.SpecError) as caught:
        parse_spec(_base(notify={"targets": [{"webhook": "http://"}]}))
    text = str(caught.value)
    assert "notify.targets.0.webhook: has no host" in text
    assert "literal" not in text and "WebhookTarget" not in text


numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from(["", "5", "nan", "inf", None, True, [], {}]),
)


@FUZZ
@given(
    probe_after=numbers,
    on_failure=st.one_of(odd_text, st.sampled_from(["restart_round", "ask_human"])),
    renotify=numbers,
    on_exhausted=st.sampled_from(["fail_item", "ask_human", "compensate", "", "retry", None, 1]),
    secrets=st.one_of(st.lists(odd_text, max_size=3), odd_text),
)
def test_any_limit_tool_or_notify_value_is_storable_or_a_spec_error(
    probe_after: Any, on_failure: Any, renotify: Any, on_exhausted: Any, secrets: Any
) -> None:
    doc = _base(
        limits={"probe_after": probe_after, "on_probe_failure": on_failure},
        notify={"renotify_after": renotify, "suspend_after": renotify},
        tools=[{"name": "write_file", "on_exhausted": on_exhausted, "secrets": secrets}],
    )
    spec = _accepted_or_spec_error(doc)
    if spec is not None and spec.limits.probe_after is not None:
        assert 0 < spec.limits.probe_after <= 7 * 24 * 3600


@FUZZ
@given(
    edges=st.lists(
        st.tuples(st.integers(0, 7), st.one_of(st.integers(0, 9).map(str), odd_text)),
        max_size=20,
    ),
    alias=st.booleans(),
)
def test_any_item_order_is_usable_or_a_spec_error(
    edges: list[tuple[int, str]], alias: bool
) -> None:
    items: list[dict[str, Any]] = [{"id": str(n), "title": f"t{n}"} for n in range(8)]
    for n, to in edges:
        items[n].setdefault("depends_on" if alias else "after", []).append(to)
    spec = _accepted_or_spec_error({"objective": "x", "items": items})
    if spec is not None:
        ids = {i.id for i in spec.items}
        assert all(p in ids and p != i.id for i in spec.items for p in i.after)


def test_a_long_chain_of_items_and_a_long_cycle_answer_quickly() -> None:
    n = 3000
    chain = [{"id": f"i{k}", "title": "t", "after": [f"i{k - 1}"] if k else []} for k in range(n)]
    assert len(parse_spec({"objective": "x", "items": chain}).items) == n
    chain[0]["after"] = [f"i{n - 1}"]
    with pytest.raises(errors.SpecError, match="cycle"):
        parse_spec({"objective": "x", "items": chain})


@pytest.mark.parametrize(
    "done_when",
    [
        {"kind": "artifact"},
        {"kind": "artifact", "name": "x", "min_count": 0},
        {"kind": "artifact", "name": "x", "min_count": 10**30},
        {"kind": "artifact", "name": "x", "min_count": float("nan")},
        {"kind": "artifact", "name": "\x00"},
        {"kind": "artifact", "artifact_kind": ["claim"]},
        {"kind": "artifact", "name": "x", "extra": 1},
    ],
)
def test_odd_artifact_rules_are_spec_errors(done_when: dict[str, Any]) -> None:
    with pytest.raises(errors.SpecError, match=r"items\.0\.done_when"):
        parse_spec({"objective": "x", "items": [{"id": "a", "title": "A", "done_when": done_when}]})


# --- the command line, in-process ----------------------------------------------------------


def _invoke(args: list[str], cwd: Path) -> Any:
    from tether.cli import app

    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(app, args, catch_exceptions=True)
    finally:
        os.chdir(old)


def _no_traceback(result: Any) -> None:
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"escaped: {result.exception!r}\n{result.output}")
    assert "Traceback" not in result.output


def _rows(db: Path) -> str:
    """A digest of every stored row: equal before and after means nothing was written."""
    digest = hashlib.sha256()
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        for table in (
            "tasks",
            "task_specs",
            "events",
            "ledgers",
            "ledger_items",
            "ledger_skeletons",
            "artifacts",
            "ops",
            "approvals",
            "blobs",
        ):
            for row in con.execute(f"SELECT * FROM {table} ORDER BY 1"):
                digest.update(repr(row).encode())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def sourced(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(folder, task id): a queued task with two sources, in `.tether/tether.db`."""
    folder = tmp_path_factory.mktemp("sourced")
    spec = {
        "name": "src",
        "objective": "compare",
        "items": [{"id": "i", "title": "t"}],
        "sources": [
            {"id": "A", "version": "1.0", "location": "a.md"},
            {"id": "B", "kind": "url", "version": "2", "location": "http://127.0.0.1:9/b"},
        ],
    }
    (folder / "spec.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    result = _invoke(["submit", "spec.yaml", "--json"], folder)
    assert result.exit_code == 0, result.output
    return folder, json.loads(result.output)["task_id"]


source_values = st.one_of(
    odd_text,
    st.builds(lambda v, loc: f"{v}@{loc}", odd_text, st.one_of(odd_urls, odd_text)),
    st.sampled_from(["a=b", "3.0@http://", "3.0@http://h/\x1b", "\x1b[2J", "9" * 300]),
)


@FUZZ_CLI
@given(source=st.sampled_from(["A", "B", "Z", "", "A=1", "\x1b"]), value=source_values)
def test_edit_source_is_applied_or_refused_without_a_write(
    sourced: tuple[Path, str], source: str, value: str
) -> None:
    folder, tid = sourced
    db = folder / ".tether" / "tether.db"
    before = _rows(db)
    result = _invoke(["edit", tid, "--source", f"{source}={value}"], folder)
    _no_traceback(result)
    assert result.exit_code in (0, 2), result.output
    assert not (set(result.output) & UNSAFE), result.output
    if result.exit_code == 2:
        assert _rows(db) == before, result.output
        return
    status = _invoke(["status", tid, "--json"], folder)
    versions = [s["version"] for s in json.loads(status.output)["sources"]]
    assert not any(set(v) & UNSAFE for v in versions), versions


@FUZZ_CLI
@given(
    text=st.one_of(
        odd_text,
        st.sampled_from(["x" * 8001, "\ud800", " \n ", "ok" + EVIL]),
    ),
    by=st.sampled_from(["cli", "", "x" * 201, "a\x1bb", "ann"]),
)
def test_tell_is_stored_whole_or_refused_without_a_write(
    sourced: tuple[Path, str], text: str, by: str
) -> None:
    folder, tid = sourced
    db = folder / ".tether" / "tether.db"
    before = _rows(db)
    result = _invoke(["tell", tid, text, "--by", by], folder)
    _no_traceback(result)
    assert result.exit_code in (0, 2), result.output
    if result.exit_code == 2:
        assert _rows(db) == before, result.output
        return
    # Accepted: stored as given (never silently cut), and shown harmlessly.
    events = json.loads(_invoke(["events", tid, "--json"], folder).output)
    assert events[-1]["type"] == "user.message"
    assert events[-1]["data"]["text"] == text.strip()
    shown = _invoke(["timeline", tid, "--full"], folder).output
    assert not (set(shown) & UNSAFE)


def test_tell_refuses_a_long_message_instead_of_cutting_it(sourced: tuple[Path, str]) -> None:
    folder, tid = sourced
    db = folder / ".tether" / "tether.db"
    before = _rows(db)
    result = _invoke(["tell", tid, "x" * 8001], folder)
    assert result.exit_code == 2, result.output
    assert "at most 8,000" in result.output
    assert _rows(db) == before


async def _add_hostile_artifacts(db: Path, tid: str) -> None:
    from tether.store import open_store
    from tether.store.base import ArtifactRecord, blob_hash

    def record(ident: str, kind: str, name: str, *deps: str) -> ArtifactRecord:
        data = ident.encode()
        meta = {"excerpt": "quote" + EVIL, "location": "p. 3" + EVIL}
        return ArtifactRecord(
            ident, tid, kind, name, blob_hash(data), len(data), deps=deps, meta=meta
        )

    store = await open_store(f"sqlite:///{db}")
    try:
        arts = [
            record("snap" + EVIL, "source_snapshot", "A" + EVIL, "source:A@1.0"),
            record("ev" + EVIL, "evidence" + EVIL, "q" + EVIL, "artifact:snap" + EVIL),
        ]
        await store.commit(tid, None, [], artifacts=arts, blobs=[b"snap", b"ev"])
    finally:
        await store.close()


def test_artifacts_and_report_never_print_control_sequences(tmp_path: Path) -> None:
    spec = {
        "name": "n" + EVIL,
        "objective": "o" + EVIL,
        "items": [{"id": "i", "title": "t" + EVIL}],
        "sources": [{"id": "A", "version": "1.0", "location": "a.md", "title": "T" + EVIL}],
    }
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    result = _invoke(["submit", "spec.yaml", "--json"], tmp_path)
    tid = json.loads(result.output)["task_id"]
    asyncio.run(_add_hostile_artifacts(tmp_path / ".tether" / "tether.db", tid))
    assert _invoke(["edit", tid, "--source", "A=2.0"], tmp_path).exit_code == 0
    for args in (
        ["artifacts", tid],
        ["artifacts", tid, "--tree"],
        ["artifacts", tid, "--invalid"],
        ["report", tid],
        ["report", tid, "--format", "html"],
        ["report", tid, "--format", "json"],
        ["status", tid],
        ["timeline", tid, "--full"],
    ):
        shown = _invoke(args, tmp_path)
        _no_traceback(shown)
        assert shown.exit_code == 0, (args, shown.output)
        assert not (set(shown.output) & UNSAFE), (args, sorted(set(shown.output) & UNSAFE))
        assert "[dim]" not in shown.output and "[red]" not in shown.output, shown.output
    tree = _invoke(["artifacts", tid, "--tree"], tmp_path).output
    assert "snap\\x1b[31mEVIL" in tree, tree
    invalid = json.loads(_invoke(["artifacts", tid, "--invalid", "--json"], tmp_path).output)
    assert len(invalid) == 2, invalid
    # JSON printed on the terminal is still the same JSON.
    doc = json.loads(_invoke(["report", tid, "--format", "json"], tmp_path).output)
    assert doc["task"]["name"] == "n" + EVIL


@pytest.mark.parametrize("text", ["x" * 8001, "a\x00b", "a\ud800b"])
@pytest.mark.parametrize(
    "command",
    [
        ["waive", "{tid}", "i", "--reason"],
        ["abandon", "{tid}", "--reason"],
        ["retry", "{tid}", "i", "--hint"],
        ["reject", "{tid}", "r1", "--reason"],
        ["edit", "{tid}", "--set", "limits.max_rounds=9", "--reason"],
        ["tell", "{tid}"],
    ],
)
def test_a_reason_too_long_or_unstorable_is_refused_not_cut(
    sourced: tuple[Path, str], command: list[str], text: str
) -> None:
    folder, tid = sourced
    db = folder / ".tether" / "tether.db"
    before = _rows(db)
    result = _invoke([c.format(tid=tid) for c in command] + [text], folder)
    _no_traceback(result)
    assert result.exit_code == 2, result.output
    assert "at most 8,000" in result.output or "cannot be stored" in result.output, result.output
    assert _rows(db) == before


# --- the environment and the database URL ------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "needle"),
    [
        ("TETHER_INLINE_WAIT_MAX", "abc", "TETHER_INLINE_WAIT_MAX"),
        ("TETHER_INLINE_WAIT_MAX", "nan", "TETHER_INLINE_WAIT_MAX"),
        ("TETHER_INLINE_WAIT_MAX", "-1", "TETHER_INLINE_WAIT_MAX"),
        ("TETHER_WEBHOOK_URL", "ftp://x", "webhook"),
        ("TETHER_WEBHOOK_URL", "http://", "no host"),
        ("TETHER_WEBHOOK_URL", "http://h:99999/", "Port out of range"),
    ],
)
def test_a_bad_environment_setting_is_refused_before_a_task_is_written(
    tmp_path: Path, name: str, value: str, needle: str
) -> None:
    spec = {"objective": "x", "items": [{"id": "a", "title": "A"}], "models": {"judge": "rules"}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        from tether.cli import app

        for args in (
            ["run", "spec.yaml", "--model", "scripted:tests.e2e.policies:done_policy"],
            ["worker", "--once"],
        ):
            result = CliRunner().invoke(app, args, env={name: value}, catch_exceptions=True)
            _no_traceback(result)
            assert result.exit_code == 2, (args, result.output)
            assert needle in result.output, result.output
            assert not (tmp_path / ".tether").exists(), args
    finally:
        os.chdir(old)


@pytest.mark.parametrize("path", ["a" * 5000, "a/" * 3000 + "x.db", "x" * 300 + ".db"])
@pytest.mark.parametrize("command", [["list"], ["status", "t1"], ["artifacts", "t1", "--tree"]])
def test_a_database_path_the_system_refuses_is_a_clear_error(
    tmp_path: Path, path: str, command: list[str]
) -> None:
    result = _invoke([*command, "--db", f"sqlite:///{path}"], tmp_path)
    _no_traceback(result)
    assert result.exit_code == 2, result.output
    assert "cannot use" in result.output and "as a database file" in result.output


# --- sources that are not files ----------------------------------------------------------

ODD_SOURCES = ["zero", "fifo", "folder", "missing"]


def read_odd_sources(request: Any) -> Any:
    """A scripted policy: read every odd source once (one round), then stop."""
    from tether.models.base import ModelResponse
    from tether.models.scripted import tool_call

    if request.purpose != "act":
        return '{"changes": [], "decision": "continue", "reason": "rules decide"}'
    if any("read_source" in m.content for m in request.messages if m.role != "system"):
        return ModelResponse("Nothing more to read.")
    return ModelResponse("Reading.", tuple(tool_call("read_source", source=s) for s in ODD_SOURCES))


@pytest.mark.timeout(60)
def test_a_source_that_is_a_device_fifo_folder_or_missing_fails_the_read_only(
    tmp_path: Path,
) -> None:
    os.mkfifo(tmp_path / "pipe")  # nobody writes: a read would wait forever
    (tmp_path / "dir").mkdir()
    spec = {
        "objective": "read",
        "items": [{"id": "a", "title": "A"}],
        "tools": ["read_source"],
        "models": {"judge": "rules"},
        "limits": {"max_rounds": 3},
        "sources": [
            {"id": "zero", "version": "1", "location": "/dev/zero", "pin": "fingerprint"},
            {"id": "fifo", "version": "1", "location": "pipe"},
            {"id": "folder", "version": "1", "location": "dir"},
            {"id": "missing", "version": "1", "location": "nope.md"},
        ],
    }
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    model = f"scripted:{__name__}:read_odd_sources"
    result = _invoke(["run", "spec.yaml", "--model", model, "--json"], tmp_path)
    _no_traceback(result)
    tid = json.loads(result.output)["task_id"]
    events = json.loads(_invoke(["events", tid, "--json"], tmp_path).output)
    failed = [e["data"] for e in events if e["type"] == "op.result" and not e["data"].get("ok")]
    texts = " ".join(json.dumps(d) for d in failed)
    assert len(failed) == len(ODD_SOURCES), texts
    assert "source zero is not a regular file" in texts
    assert "source fifo is not a regular file" in texts


def test_a_task_stored_before_the_stricter_checks_stays_usable(tmp_path: Path) -> None:
    """A spec accepted by an earlier version (a version with ESC, a webhook without a
    host) is read as stored; an edit must fix what it touches, and can."""
    spec = {
        "objective": "x",
        "items": [{"id": "a", "title": "A"}],
        "sources": [{"id": "A", "version": "1.0", "location": "a.md"}],
    }
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    tid = json.loads(_invoke(["submit", "spec.yaml", "--json"], tmp_path).output)["task_id"]
    db = tmp_path / ".tether" / "tether.db"
    old = dict(spec, sources=[{"id": "A", "version": "1\x1b[2J", "location": "a.md"}])
    old["notify"] = {"targets": [{"webhook": "http://"}]}
    with sqlite3.connect(db) as con:
        row = con.execute("SELECT spec FROM task_specs WHERE task_id = ?", (tid,)).fetchone()
        stored = {**json.loads(row[0]), **old}
        con.execute("UPDATE task_specs SET spec = ? WHERE task_id = ?", (json.dumps(stored), tid))

    shown = _invoke(["status", tid], tmp_path)
    assert shown.exit_code == 0 and not (set(shown.output) & UNSAFE), shown.output
    before = _rows(db)
    half = _invoke(["edit", tid, "--source", "A=2.0"], tmp_path)
    assert half.exit_code == 2 and "notify.targets.0.webhook: has no host" in half.output
    assert _rows(db) == before
    fixed = _invoke(["edit", tid, "--source", "A=2.0", "--set", "notify.targets=[]"], tmp_path)
    assert fixed.exit_code == 0, fixed.output
    status = json.loads(_invoke(["status", tid, "--json"], tmp_path).output)
    assert [s["version"] for s in status["sources"]] == ["2.0"]


@pytest.mark.parametrize(
    "args",
    [
        ["status", "x" * 100_000],
        ["artifacts", "x" * 100_000, "--tree"],
        ["tell", "x" * 100_000, "hi"],
        ["edit", "{tid}", "--item", "a." * 20_000 + "x=1"],
        ["report", "x" * 100_000],
    ],
)
def test_an_echoed_huge_value_keeps_the_error_short(tmp_path: Path, args: list[str]) -> None:
    spec = {"objective": "x", "items": [{"id": "a", "title": "A"}]}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    tid = json.loads(_invoke(["submit", "spec.yaml", "--json"], tmp_path).output)["task_id"]
    result = _invoke([a.replace("{tid}", tid) for a in args], tmp_path)
    _no_traceback(result)
    assert result.exit_code in (2, 3), result.output
    assert len(result.output) < 1200, result.output[:300]
    assert "characters)" in result.output


set_paths = st.one_of(
    st.sampled_from(
        [
            "limits.probe_after",
            "limits.on_probe_failure",
            "limits.round_timeout",
            "notify.renotify_after",
            "notify.targets",
            "notify.admin",
            "tools",
            "sources",
            "items",
            "budget.money_usd",
            "models.timeout",
            "workspace",
            "name",
            "limits",
            "",
            ".",
            "a..b",
        ]
    ),
    st.text(max_size=20),
)
set_values = st.one_of(
    st.sampled_from(
        [
            "nan",
            "-1",
            "1e999",
            "0",
            "null",
            "[]",
            "{}",
            '[{"webhook": "http://"}]',
            '[{"name": "write_file", "on_exhausted": "explode"}]',
            '[{"id": "A", "version": "\\u001b", "location": "a.md"}]',
            '[{"id": "A", "kind": "api", "version": "1", "location": "ftp://x"}]',
            '[{"id": "i", "title": "t", "after": ["i"]}]',
            '"\\u0000"',
            "x" * 5000,
        ]
    ),
    st.text(max_size=30),
)


@FUZZ_CLI
@given(path=set_paths, value=set_values)
def test_edit_set_is_applied_or_refused_without_a_write(
    sourced: tuple[Path, str], path: str, value: str
) -> None:
    folder, tid = sourced
    db = folder / ".tether" / "tether.db"
    before = _rows(db)
    result = _invoke(["edit", tid, "--set", f"{path}={value}"], folder)
    _no_traceback(result)
    assert result.exit_code in (0, 2), result.output
    assert not (set(result.output) & UNSAFE), result.output
    if result.exit_code == 2:
        assert _rows(db) == before, result.output
    else:
        shown = _invoke(["status", tid], folder)
        assert shown.exit_code == 0 and not (set(shown.output) & UNSAFE), shown.output


@pytest.mark.parametrize(
    ("modify", "needle"),
    [
        ('{"x": 1}', "x: unknown argument"),
        ('{"path": 5, "content": "a"}', "path: Input should be a valid string"),
        ('{"path": "out/i1.txt"}', "content: required argument is missing"),
    ],
)
def test_approve_modify_with_arguments_the_tool_refuses_is_refused_now(
    tmp_path: Path, modify: str, needle: str
) -> None:
    from tests.support.cli import DONE, spec_dict

    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec_dict(1)), encoding="utf-8")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "i1.txt").write_text("old\n", encoding="utf-8")  # an overwrite
    doc = json.loads(_invoke(["run", "spec.yaml", "--model", DONE, "--json"], tmp_path).output)
    assert doc["status"] == "waiting", doc
    tid = doc["task_id"]
    rid = json.loads(_invoke(["approvals", tid, "--json"], tmp_path).output)[0]["request_id"]
    db = tmp_path / ".tether" / "tether.db"
    before = _rows(db)
    result = _invoke(["approve", tid, rid, "--modify", modify], tmp_path)
    _no_traceback(result)
    assert result.exit_code == 2, result.output
    assert "--modify: bad arguments for write_file" in result.output and needle in result.output
    assert _rows(db) == before
    good = '{"path": "out/i1.txt", "content": "new\\n"}'
    assert _invoke(["approve", tid, rid, "--modify", good], tmp_path).exit_code == 0


def _demo_target(base: Path, kind: str) -> Path:
    if kind == "file":
        (base / "afile").write_text("x", encoding="utf-8")
        return base / "afile"
    if kind == "someone's folder":
        (base / "proj").mkdir()
        (base / "proj" / "spec.yaml").write_text("mine", encoding="utf-8")
        return base / "proj"
    if kind == "long name":
        return base / ("a" * 300)
    (base / "home").mkdir()  # the home folder (HOME is set to it): too broad a workspace
    return base / "home"


@pytest.mark.parametrize(
    ("kind", "needle"),
    [
        ("file", "is a file"),
        ("someone's folder", "not empty"),
        ("long name", "File name too long"),
        ("home", "your home folder"),
    ],
)
def test_demo_dir_is_checked_before_anything_is_written(
    tmp_path: Path, kind: str, needle: str
) -> None:
    target = _demo_target(tmp_path, kind)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        from tether.cli import app

        args = ["demo", "--dir", str(target)]
        result = CliRunner().invoke(app, args, env={"HOME": str(tmp_path / "home")})
    finally:
        os.chdir(old)
    _no_traceback(result)
    assert result.exit_code == 2, result.output
    assert needle in result.output and "--allow-broad-workspace" not in result.output
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert not any(p.name == "docs" for p in tmp_path.rglob("*"))


@pytest.mark.parametrize(
    ("model", "env", "needle"),
    [
        ("openai-compatible:http://[::1/v1#m", {}, "Invalid IPv6 URL"),
        ("openai-compatible:http:///v1#m", {}, "has no host"),
        ("openai-compatible:http://h:99999/v1#m", {}, "Port out of range"),
        ("openai:gpt-x", {"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": "http://"}, "OPENAI_BASE_URL"),
        ("anthropic:c", {"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": "h x"}, "whitespace"),
    ],
)
def test_a_model_url_no_request_could_reach_is_refused_before_a_task_is_written(
    tmp_path: Path, model: str, env: dict[str, str], needle: str
) -> None:
    spec = {"objective": "x", "items": [{"id": "a", "title": "A"}]}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        from tether.cli import app

        result = CliRunner().invoke(app, ["run", "spec.yaml", "--model", model], env=env)
    finally:
        os.chdir(old)
    _no_traceback(result)
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert not (tmp_path / ".tether").exists()


def test_edit_source_given_twice_is_refused(sourced: tuple[Path, str]) -> None:
    folder, tid = sourced
    db = folder / ".tether" / "tether.db"
    before = _rows(db)
    result = _invoke(["edit", tid, "--source", "A=2", "--source", "A=3"], folder)
    assert result.exit_code == 2, result.output
    assert "given twice" in result.output
    assert _rows(db) == before

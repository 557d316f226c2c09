"""`tether demo` checks before it writes, and starts clean in an earlier demo's folder.

A second `tether demo --dir D` is a new demo: the earlier demo's outputs (what its task
wrote there, byte for byte) are cleared first, so the new task writes them again
without asking to approve 40 overwrites, and its summary lists its own outputs. A file
the demo would overwrite that is not its own (changed since, or a person's) is refused
with the command to run. A model that cannot run (no key) is refused before anything is
written: no folder, no documents, no queued task.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cli import assert_clean_error, cli_env, describe, json_out, snapshot, tether
from tether.demo import BROKEN, N_DOCS, SPEC_FILE, ground_truth

DEMO_TIMEOUT = 110.0
SATISFIED = f"satisfied (delivered_with_waivers: {BROKEN})"


def demo(folder: Path, cwd: Path, *extra: str, **env: str | None) -> Any:
    return tether(
        "demo", "--dir", folder, "--json", *extra, cwd=cwd, env=cli_env(**env), timeout=DEMO_TIMEOUT
    )


def task_ids(folder: Path) -> list[str]:
    db = f"sqlite:///{folder / '.tether' / 'tether.db'}"
    return [t["task_id"] for t in json_out(tether("list", "--json", "--db", db, cwd=folder))]


@pytest.fixture(scope="module")
def earlier(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A folder an earlier demo ran in (kept, as the tour says), with a person's note."""
    base = tmp_path_factory.mktemp("again")
    folder = base / "demo"
    first = json_out(demo(folder, base))
    assert first["summary"]["result"] == SATISFIED
    (folder / "my-notes.txt").write_text("what I saw in the demo\n", encoding="utf-8")
    return {"base": base, "folder": folder, "first": first["status"]["task_id"]}


def test_a_second_demo_in_the_same_folder_starts_clean(earlier: dict[str, Any]) -> None:
    folder, base = earlier["folder"], earlier["base"]
    before = task_ids(folder)
    proc = demo(folder, base)
    out = json_out(proc)
    summary, status = out["summary"], out["status"]
    assert summary["result"] == SATISFIED, describe(proc)
    assert summary["ledger"] == "42/43 done, 0 blocked, 1 waived"
    assert summary["outputs"] == "catalog.csv, summary.md, notice.md"
    tid = status["task_id"]
    assert tid not in before and earlier["first"] in before
    assert task_ids(folder)[0] == tid, "a new task, next to the earlier ones"
    db = f"sqlite:///{folder / '.tether' / 'tether.db'}"
    events = json_out(tether("events", tid, "--json", "--db", db, cwd=base))
    types = [e["type"] for e in events]
    assert "approval.requested" not in types, "the new demo asked to approve an overwrite"
    # This task made every output itself: each write created its file.
    results = [e["data"] for e in events if e["type"] == "op.result"]
    writes = [r["summary"] for r in results if r["tool"] == "write_file"]
    created = {w.split()[1] for w in writes if w.startswith("created ")}
    records = {f"records/{d}.json" for d in ground_truth() if d != BROKEN}
    assert records | {"catalog.csv", "summary.md", "notice.md"} <= created
    on_disk = {f"records/{p.name}" for p in (folder / "records").iterdir()}
    assert on_disk == records and len(on_disk) == N_DOCS - 1
    assert (folder / "my-notes.txt").read_text(encoding="utf-8") == "what I saw in the demo\n"


def test_a_changed_output_is_not_overwritten(earlier: dict[str, Any]) -> None:
    folder, base = earlier["folder"], earlier["base"]
    catalog = folder / "catalog.csv"
    original = catalog.read_bytes()
    catalog.write_bytes(original + b"docs/extra.txt,my own row,2026-12-01,finance\n")
    try:
        before = snapshot(folder)
        proc = demo(folder, base)
        assert_clean_error(proc, 2, "catalog.csv", f"tether demo --dir {folder}-2")
        assert snapshot(folder) == before, "a refused demo changed the folder"
    finally:
        catalog.write_bytes(original)


def test_a_changed_spec_or_document_is_not_overwritten(earlier: dict[str, Any]) -> None:
    folder, base = earlier["folder"], earlier["base"]
    spec, doc = folder / SPEC_FILE, folder / "docs" / "doc-05.txt"
    spec_text, doc_text = spec.read_bytes(), doc.read_bytes()
    mine = yaml.safe_load(spec_text)
    mine["objective"] = "My own objective now"
    spec.write_text(yaml.safe_dump(mine), encoding="utf-8")
    doc.write_bytes(doc_text + b"my annotation\n")
    try:
        before = snapshot(folder)
        msg = assert_clean_error(demo(folder, base), 2, SPEC_FILE, "docs/doc-05.txt")
        assert "tether demo --dir" in msg
        assert snapshot(folder) == before
    finally:
        spec.write_bytes(spec_text)
        doc.write_bytes(doc_text)


def test_the_spec_as_an_earlier_demo_ran_it_is_the_demos(tmp_path: Path) -> None:
    """A `demo-spec.yaml` written differently but holding the contract an earlier demo
    here ran (an older tether's layout, say) is the demo's own: the demo starts clean."""
    folder = tmp_path / "demo"
    assert json_out(demo(folder, tmp_path))["summary"]["result"] == SATISFIED
    spec = folder / SPEC_FILE
    spec.write_text(json.dumps(yaml.safe_load(spec.read_text("utf-8")), indent=1), "utf-8")
    again = json_out(demo(folder, tmp_path))
    assert again["summary"]["result"] == SATISFIED


def test_a_folder_that_is_not_a_demos_is_refused_with_the_command(tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "report.md").write_text("mine\n", encoding="utf-8")
    before = snapshot(folder)
    assert_clean_error(demo(folder, tmp_path), 2, "not empty", f"tether demo --dir {folder}-2")
    assert snapshot(folder) == before


# --- a model that cannot run: nothing written ----------------------------------------------------


def test_a_model_without_its_key_writes_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "real"
    proc = demo(folder, tmp_path, "--model", "openai:gpt-4.1-mini")
    assert_clean_error(proc, 2, "OPENAI_API_KEY")
    assert not folder.exists(), "the demo wrote its folder before checking the model"
    assert not (tmp_path / ".tether").exists()


def test_a_model_without_its_key_leaves_an_earlier_demo_alone(earlier: dict[str, Any]) -> None:
    folder, base = earlier["folder"], earlier["base"]
    before, tasks = snapshot(folder), task_ids(folder)
    proc = demo(folder, base, "--model", "openai:gpt-4.1-mini")
    assert_clean_error(proc, 2, "OPENAI_API_KEY")
    assert snapshot(folder) == before
    assert task_ids(folder) == tasks, "a queued orphan task was stored"


def test_a_model_without_its_key_makes_no_temporary_folder(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = tether(
        "demo", "--model", "anthropic:claude-sonnet-4-5", cwd=tmp_path, env=cli_env(TMPDIR=str(tmp))
    )
    assert_clean_error(proc, 2, "ANTHROPIC_API_KEY")
    assert list(tmp.iterdir()) == []


def test_an_unknown_model_provider_is_refused_first(tmp_path: Path) -> None:
    folder = tmp_path / "x"
    assert_clean_error(demo(folder, tmp_path, "--model", "nope:m"), 2, "unknown model provider")
    assert not folder.exists()

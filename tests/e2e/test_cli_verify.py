"""`tether verify TASK` through the CLI on SQLite and PostgreSQL: a delivered task whose
evidence content is lost goes back to work (journaled, crash-safe at its fail points)
and `tether resume` redoes just that work; a pinned source changed on disk whose
snapshot is lost is never stored again as that version: a person decides."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.blobs import delete_blob
from tests.support.cli import cli_env, describe, tether
from tests.support.compare import compare_contract

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

DATA = Path(__file__).resolve().parents[1] / "data"
MODEL = "scripted:tests.e2e.ab_policies:analyst"


class CLI:
    def __init__(self, db: str, root: Path) -> None:
        self.db, self.root, self.ws = db, root, root / "ws"
        shutil.copytree(DATA / "corpus_ab", self.ws / "corpus")
        (root / "spec.yaml").write_text(yaml.safe_dump(compare_contract(), sort_keys=False))

    def __call__(self, *args: str, code: int = 0, **env: str) -> Any:
        res = tether(*args, "--db", self.db, cwd=self.root, env=cli_env(**env), timeout=180)
        assert res.returncode == code, describe(res)
        return res

    def json(self, *args: str, code: int = 0) -> Any:
        return json.loads(self(*args, "--json", code=code).stdout)

    def delivered(self) -> str:
        doc = self.json("run", "spec.yaml", "--workspace", str(self.ws), "--model", MODEL)
        assert (doc["status"], doc["stop_reason"]) == ("satisfied", "delivered"), doc
        return str(doc["task_id"])


def test_verify_reopens_lost_evidence_and_resume_redoes_it(db_url: str, tmp_path: Path) -> None:
    db = db_url
    cli = CLI(db, tmp_path)
    task = cli.delivered()
    ok = cli("verify", task, COLUMNS="80")
    assert f"task {task}: everything it rests on holds" in ok.stdout
    assert all(len(line) <= 80 for line in ok.stdout.splitlines()), ok.stdout
    arts = cli.json("artifacts", task)
    lost = next(a for a in arts if a["kind"] == "evidence" and a["name"] == "A")
    delete_blob(db, lost["artifact_id"])

    # Killed before its write: nothing changed; killed right after: the write stands.
    res = cli("verify", task, code=137, TETHER_FAILPOINTS="before_verify_commit")
    assert "fail point before_verify_commit reached" in res.stderr
    assert cli.json("status", task)["status"] == "satisfied"
    res = cli("verify", task, code=137, TETHER_FAILPOINTS="after_verify_commit")
    doc = cli.json("status", task)
    assert doc["status"] == "queued", doc
    assert {i["id"]: i["status"] for i in doc["ledger"]["items"]} == {
        "claims": "pending", "sections": "pending", "report": "pending",
    }  # fmt: skip
    changes = [e["data"] for e in cli.json("events", task) if e["type"] == "task.status"]
    assert (changes[-1]["src"], changes[-1]["dst"]) == ("satisfied", "queued")
    assert lost["artifact_id"] in changes[-1]["reason"]
    # Verified again: what broke was reopened already; nothing more is written.
    again = cli.json("verify", task)
    assert again["outcome"] == "holds" and again["status"] == "queued", again
    assert cli.json("rebuild", task)["consistent"]

    done = cli.json("resume", task, "--model", MODEL)
    assert (done["status"], done["stop_reason"]) == ("satisfied", "delivered"), done
    now = cli.json("artifacts", task)
    before = {a["artifact_id"] for a in arts if a["valid"]}
    redone = [a for a in now if a["valid"] and a["artifact_id"] not in before]
    assert redone and not [a for a in redone if a["kind"] == "source_snapshot"]
    assert cli.json("verify", task)["outcome"] == "holds"


def test_a_source_changed_under_its_version_asks_a_person(db_url: str, tmp_path: Path) -> None:
    db = db_url
    cli = CLI(db, tmp_path)
    task = cli.delivered()
    snap = next(
        a
        for a in cli.json("artifacts", task)
        if a["kind"] == "source_snapshot" and a["name"] == "B"
    )
    delete_blob(db, snap["artifact_id"])
    doc = cli.ws / "corpus" / "b-2.0.md"
    doc.write_text(doc.read_text().replace("costs", "now costs"))
    res = cli("verify", task, code=1, COLUMNS="80")
    assert "gap: source B changed under version 2.0" in res.stdout, res.stdout
    assert all(len(line) <= 80 for line in res.stdout.splitlines()), res.stdout
    status = cli.json("status", task)
    assert status["status"] == "waiting" and status["waiting"]["kind"] == "decision", status
    assert "source B changed under version 2.0" in status["waiting"]["reason"]
    snaps = [a for a in cli.json("artifacts", task) if a["kind"] == "source_snapshot"]
    assert [a["name"] for a in snaps].count("B") == 1  # no second snapshot of B 2.0
    # The person pins a new version: the task goes on from it.
    cli("edit", task, "--source", "B=3.0@corpus/b-3.0.md", "--reason", "B moved on")
    done = cli.json("resume", task, "--model", MODEL)
    assert (done["status"], done["stop_reason"]) == ("satisfied", "delivered"), done


def test_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'tether.db'}"
    res = tether("worker", "--verify-every", "soon", "--db", db, cwd=tmp_path, env=cli_env())
    assert res.returncode == 2 and "not a duration" in res.stderr, describe(res)
    assert "Traceback" not in res.stderr
    res = tether("verify", "nope", "--db", db, cwd=tmp_path, env=cli_env())
    assert res.returncode == 2 and "no tether database" in res.stderr, describe(res)

"""`tether demo`: catalogue a folder of 40 short documents, offline.

The task: extract the title, date and topic of each document into `records/`, build
`catalog.csv`, write `summary.md` and a notice for the team. One document is a
corrupted scan that cannot be parsed; its item ends blocked after its attempts and the
task still delivers. Acceptance checks really inspect the outputs.

The offline model is a deterministic policy that works only from the request it is
given: it reads the goal ledger in the prompt to choose the next item, which is the
point of the demo (the ledger steers). The same spec runs with a real model:
`tether run demo-spec.yaml --model openai:gpt-4.1-mini`.
"""

from __future__ import annotations

import csv
import io
import json
import random
import re
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import tool_call

N_DOCS = 40
BROKEN = "doc-23"
TOPICS = ("finance", "engineering", "legal", "hiring", "security", "operations")
_SUBJECTS = {
    "finance": [
        "Quarterly budget review",
        "Travel expense policy",
        "Vendor payment terms",
        "Cloud cost forecast",
        "Audit preparation notes",
    ],
    "engineering": [
        "Database migration plan",
        "API versioning guide",
        "Release checklist",
        "Incident postmortem: cache outage",
        "Build pipeline upgrade",
    ],
    "legal": [
        "Data processing agreement",
        "Open source licence review",
        "Contract renewal memo",
        "Privacy notice update",
        "Trademark filing status",
    ],
    "hiring": [
        "Interview loop redesign",
        "Onboarding plan for new engineers",
        "Internship programme 2027",
        "Referral bonus rules",
        "Hiring committee minutes",
    ],
    "security": [
        "Access review results",
        "Phishing drill report",
        "Key rotation schedule",
        "Laptop encryption rollout",
        "Bug bounty triage",
    ],
    "operations": [
        "Office move logistics",
        "On-call rota changes",
        "Supplier onboarding",
        "Backup restore test",
        "Meeting room booking rules",
    ],
}
_SENTENCES = [
    "The team reviewed the current state and agreed on the next steps.",
    "Several open questions remain and are listed at the end of this note.",
    "Owners were assigned for each action, with dates for the first check-in.",
    "The previous approach did not scale with the number of requests we now see.",
    "Feedback from the last round was mostly positive, with two concerns raised.",
    "A short pilot will run first, and the results will be shared with everyone.",
    "Costs stay within the approved envelope if the plan is followed as written.",
    "Risks were discussed; the main one is the dependency on an external supplier.",
]


def doc_id(n: int) -> str:
    """`doc-07` for 7."""
    return f"doc-{n:02d}"


def ground_truth() -> dict[str, dict[str, str]]:
    """Title, date and topic of every parseable document (deterministic)."""
    rng = random.Random(20261130)
    truth: dict[str, dict[str, str]] = {}
    for n in range(1, N_DOCS + 1):
        topic = TOPICS[(n * 7) % len(TOPICS)]
        title = rng.choice(_SUBJECTS[topic])
        date = f"2026-{rng.randint(1, 11):02d}-{rng.randint(1, 28):02d}"
        truth[doc_id(n)] = {"title": f"{title} ({n})", "date": date, "topic": topic}
    return truth


def documents() -> dict[str, str]:
    """The 40 documents: path under the demo folder (`docs/doc-07.txt`) -> text."""
    rng = random.Random(7)
    found: dict[str, str] = {}
    for name, meta in ground_truth().items():
        if name == BROKEN:
            junk = "".join(chr(rng.choice([0xFFFD, 0x25A1, 0x2591, 0x00BF])) for _ in range(300))
            body = f"%%SCAN-0x7f ERR:CRC\n{junk}\n[page 1 of ? unreadable]\n"
        else:
            para = " ".join(rng.sample(_SENTENCES, 5))
            body = (
                f"Title: {meta['title']}\nDate: {meta['date']}\nTopic: {meta['topic']}\n\n"
                f"{para}\n\n{' '.join(rng.sample(_SENTENCES, 4))}\n"
            )
        found[f"docs/{name}.txt"] = body
    return found


def make_documents(folder: Path) -> None:
    """Write the 40 documents under `folder/docs/`."""
    (folder / "docs").mkdir(parents=True, exist_ok=True)
    for path, body in documents().items():
        (folder / path).write_text(body, encoding="utf-8")


def output_paths() -> list[str]:
    """What the task writes into the demo folder: a record per document, the catalogue,
    the summary and the notice."""
    return [f"records/{doc_id(n)}.json" for n in range(1, N_DOCS + 1)] + [
        "catalog.csv",
        "summary.md",
        "notice.md",
    ]


def spec_dict() -> dict[str, Any]:
    """The demo's contract."""
    items: list[dict[str, Any]] = [
        {
            "id": doc_id(n),
            "title": f"Extract title, date and topic of docs/{doc_id(n)}.txt into "
            f"records/{doc_id(n)}.json",
            "milestone": "extract",
        }
        for n in range(1, N_DOCS + 1)
    ]
    items += [
        {
            "id": "catalog",
            "title": "Write catalog.csv (path,title,date,topic) with one row per record",
            "milestone": "deliver",
            "done_when": {
                "kind": "file",
                "path": "catalog.csv",
                "contains": "path,title,date,topic",
            },
        },
        {
            "id": "summary",
            "title": "Write summary.md: counts by topic and the documents that failed",
            "milestone": "deliver",
            "done_when": {"kind": "file", "path": "summary.md", "contains": "# Catalogue summary"},
        },
        {
            "id": "notice",
            "title": "Write notice.md: a short notice telling the team the catalogue is ready",
            "milestone": "deliver",
            "done_when": {"kind": "file", "path": "notice.md", "contains": "catalog.csv"},
        },
    ]
    return {
        "name": "catalogue-documents",
        "objective": "Catalogue the folder docs/: extract title, date and topic of each "
        "document into catalog.csv, write summary.md and a notice for the team.",
        "instructions": "Each document starts with Title:, Date: and Topic: lines. Write one "
        'JSON record per document to records/<doc-id>.json ({"title", "date", "topic"}). '
        "A document that cannot be parsed is reported in summary.md, not guessed.",
        "acceptance": [
            {
                "id": "catalog-correct",
                "description": "catalog.csv has a correct row for every readable document",
                "check": {"callable": "tether.demo:check_catalog"},
            },
            {
                "id": "summary-correct",
                "description": "summary.md gives the right counts and names the failed document",
                "check": {"callable": "tether.demo:check_summary"},
            },
            {
                "id": "notice-written",
                "description": "notice.md exists and points to catalog.csv",
                "check": {"command": "grep -q catalog.csv notice.md"},
            },
        ],
        "milestones": [
            {"id": "extract", "title": "Extract metadata from every document"},
            {"id": "deliver", "title": "Deliver the catalogue, the summary and the notice"},
        ],
        "items": items,
        "tools": ["list_files", "read_file", "write_file"],
        "limits": {"max_rounds": 160},
        "context": {"input_budget_tokens": 12000},
        "budget": {"rounds": 200},
    }


SPEC_FILE = "demo-spec.yaml"


def spec_text() -> str:
    """`spec_dict()` as the YAML of `demo-spec.yaml`."""
    return yaml.safe_dump(spec_dict(), sort_keys=False, width=100)


def write_spec(folder: Path) -> Path:
    """Write `demo-spec.yaml` into `folder` and return its path."""
    path = folder / SPEC_FILE
    path.write_text(spec_text(), encoding="utf-8")
    return path


# --- acceptance checks (they read the outputs, not the ledger) --------------------------


def _read_catalog(ws: Path) -> list[dict[str, str]]:
    with (ws / "catalog.csv").open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def check_catalog(ws: Path) -> tuple[bool, str]:
    """Every readable document has a correct row; the broken one has none."""
    if not (ws / "catalog.csv").is_file():
        return False, "catalog.csv is missing"
    rows = {Path(r.get("path", "")).stem: r for r in _read_catalog(ws)}
    truth = ground_truth()
    wrong = []
    for name, meta in truth.items():
        if name == BROKEN:
            if name in rows:
                wrong.append(f"{name} cannot be parsed but has a row")
            continue
        row = rows.get(name)
        if row is None:
            wrong.append(f"{name} missing")
        elif any(row.get(k) != meta[k] for k in ("title", "date", "topic")):
            wrong.append(f"{name} has wrong values")
    if wrong:
        return False, "; ".join(wrong[:5]) + (
            f" (+{len(wrong) - 5} more)" if len(wrong) > 5 else ""
        )
    return True, f"{len(rows)} rows correct"


def check_summary(ws: Path) -> tuple[bool, str]:
    """Counts by topic match the catalogue, and the broken document is named."""
    p = ws / "summary.md"
    if not p.is_file():
        return False, "summary.md is missing"
    text = p.read_text(encoding="utf-8")
    truth = {k: v for k, v in ground_truth().items() if k != BROKEN}
    counts = Counter(v["topic"] for v in truth.values())
    for topic, n in counts.items():
        if not re.search(rf"\b{topic}\b\D*\b{n}\b", text):
            return False, f"summary.md does not give {n} documents for {topic}"
    if BROKEN not in text:
        return False, f"summary.md does not name the failed document {BROKEN}"
    return True, "counts and failures reported"


# --- the offline model: a deterministic policy over the request -------------------------

_NEXT = re.compile(r"^Next: (\S+)", re.M)
_FIELD = re.compile(r"^(Title|Date|Topic):\s*(.+)$", re.M)
_MORE = re.compile(r"The full output is artifact (\S+);")


def _latest_ledger(request: ModelRequest) -> str:
    for m in reversed(request.messages):
        if m.role == "user" and "GOAL LEDGER" in m.content:
            return m.content
    return request.system


def _tool_results(request: ModelRequest) -> list[tuple[str, dict[str, Any], str]]:
    """(tool, args, result) of every tool call still in the history, oldest first."""
    calls: dict[str, tuple[str, dict[str, Any]]] = {}
    out = []
    for m in request.messages:
        for c in m.tool_calls:
            calls[c.id] = (c.name, dict(c.arguments or {}))
        if m.role == "tool" and m.tool_call_id in calls:
            name, args = calls[m.tool_call_id]
            out.append((name, args, m.content))
    return out


def _whole(results: list[tuple[str, dict[str, Any], str]], text: str) -> str | None:
    """The whole output behind a preview, or None when it still has to be fetched."""
    more = _MORE.search(text)
    if not more:
        return text
    full = [
        r for (t, a, r) in results if t == "read_artifact" and a.get("artifact_id") == more.group(1)
    ]
    return full[-1] if full else None


def _fetch(text: str) -> ModelResponse:
    more = _MORE.search(text)
    assert more is not None
    return ModelResponse(
        "That output was cut to a preview; reading all of it.",
        (tool_call("read_artifact", artifact_id=more.group(1), offset=0, limit=20000),),
    )


def _act(request: ModelRequest) -> ModelResponse:
    ledger = _latest_ledger(request)
    found = _NEXT.findall(ledger)
    nxt = found[-1] if found else "nothing"
    results = _tool_results(request)
    if nxt.startswith("doc-"):
        path = f"docs/{nxt}.txt"
        reads = [r for (t, a, r) in results if t == "read_file" and a.get("path") == path]
        if not reads or reads[-1].startswith("ERROR"):
            return ModelResponse(f"Reading {path}.", (tool_call("read_file", path=path),))
        fields = dict(_FIELD.findall(reads[-1]))
        if {"Title", "Date", "Topic"} <= fields.keys():
            record = {k.lower(): fields[k].strip() for k in ("Title", "Date", "Topic")}
            return ModelResponse(
                f"{nxt}: {record['title']}.",
                (
                    tool_call(
                        "write_file",
                        path=f"records/{nxt}.json",
                        content=json.dumps(record, sort_keys=True),
                    ),
                ),
            )
        return ModelResponse(
            f"I cannot find Title/Date/Topic lines in {path}; reading it again.",
            (tool_call("read_file", path=path),),
        )
    if nxt == "catalog":
        listing = [r for (t, a, r) in results if t == "list_files" and a.get("path") == "records"]
        recs = {
            a["path"]: r
            for (t, a, r) in results
            if t == "read_file" and str(a.get("path", "")).startswith("records/")
        }
        if not listing:
            return ModelResponse("Listing the records.", (tool_call("list_files", path="records"),))
        whole = _whole(results, listing[-1])
        if whole is None:
            return _fetch(listing[-1])
        names = sorted(set(re.findall(r"(doc-\d+\.json)", whole)))
        missing = [f"records/{n}" for n in names if f"records/{n}" not in recs]
        if missing:
            calls = tuple(tool_call("read_file", path=p) for p in missing)
            return ModelResponse(f"Reading {len(missing)} records.", calls)
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["path", "title", "date", "topic"])
        for n in names:
            rec = json.loads(recs[f"records/{n}"])
            w.writerow([f"docs/{n[:-5]}.txt", rec["title"], rec["date"], rec["topic"]])
        return ModelResponse(
            "Writing the catalogue.",
            (tool_call("write_file", path="catalog.csv", content=buf.getvalue()),),
        )
    if nxt == "summary":
        cat = [r for (t, a, r) in results if t == "read_file" and a.get("path") == "catalog.csv"]
        if not cat:
            return ModelResponse(
                "Reading the catalogue.", (tool_call("read_file", path="catalog.csv"),)
            )
        text = _whole(results, cat[-1])
        if text is None:
            return _fetch(cat[-1])
        rows = list(csv.DictReader(io.StringIO(text)))
        counts = Counter(r["topic"] for r in rows)
        blocked = re.findall(r"^\s*\[!\] (\S+):", ledger, re.M)
        lines = [
            "# Catalogue summary",
            "",
            f"{len(rows)} documents catalogued.",
            "",
            "| topic | documents |",
            "| --- | --- |",
        ]
        lines += [f"| {t} | {n} |" for t, n in sorted(counts.items())]
        lines += ["", "## Documents that could not be parsed", ""]
        lines += [f"- docs/{b}.txt" for b in blocked] or ["- none"]
        return ModelResponse(
            "Writing the summary.",
            (tool_call("write_file", path="summary.md", content="\n".join(lines) + "\n"),),
        )
    if nxt == "notice":
        text = (
            "# Notice: the document catalogue is ready\n\nHello team,\n\nThe catalogue of "
            "the shared documents is in catalog.csv, with counts by topic in summary.md. "
            "Documents that could not be read are listed there; please send a clean copy.\n"
        )
        return ModelResponse(
            "Writing the notice.", (tool_call("write_file", path="notice.md", content=text),)
        )
    return ModelResponse("All items in the ledger are closed. The work is complete.")


def _judge(request: ModelRequest) -> str:
    payload = json.loads(request.messages[0].content)
    if "summary" in payload:
        return _audit_summary(payload)
    changes = []
    for op in payload.get("op_journal", []):
        m = re.fullmatch(r"records/(doc-\d+)\.json", str(op.get("args", {}).get("path", "")))
        if op.get("tool") == "write_file" and op.get("status") == "succeeded" and m:
            changes.append({"item": m.group(1), "status": "done", "evidence": [op["evidence_ref"]]})
    items = payload["ledger"]["items"]
    touched = {c["item"] for c in changes}
    still_open = [
        i["id"]
        for i in items
        if i["status"] in ("pending", "in_progress") and i["id"] not in touched
    ]
    decision = "continue" if still_open else "satisfied"
    return json.dumps(
        {"changes": changes, "decision": decision, "reason": f"{len(changes)} records written"}
    )


def _audit_summary(payload: dict[str, Any]) -> str:
    """The judge's reading of a compaction summary: which items it claims finished.
    The demo's compressor states counts, never that a named item is done, so a claim is
    only a document id the summary itself calls done or written."""
    summary = str(payload["summary"])
    claimed = sorted(set(re.findall(r"(doc-\d+) (?:is|was) (?:done|written)", summary)))
    return json.dumps({"claimed_done": claimed, "whole_task": False, "quote": ""})


def _compact(request: ModelRequest) -> str:
    text = request.messages[-1].content
    written = sorted(set(re.findall(r"records/(doc-\d+)\.json", text)))
    read = sorted(set(re.findall(r"docs/(doc-\d+)\.txt", text)))
    return (
        f"Earlier rounds read {len(read)} documents ({', '.join(read[:3])}...) and wrote records "
        f"for {len(written)} of them. Progress is whatever the ledger says."
    )


def _review(request: ModelRequest) -> str:
    payload = json.loads(request.messages[0].content)
    failed = [c["id"] for c in payload["acceptance_checks"] if not c["passed"]]
    return json.dumps({"passed": not failed, "gaps": failed, "reopen": []})


def policy(request: ModelRequest) -> ModelResponse | str:
    """The offline model: acts, judges, compacts and reviews from the request alone."""
    if request.purpose == "judge":
        return _judge(request)
    if request.purpose == "compact":
        return _compact(request)
    if request.purpose == "review":
        return _review(request)
    return _act(request)

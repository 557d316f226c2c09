"""A scripted analyst for the A/B comparison scenario (`test_ab_comparison.py`).

It behaves like a model that reads its context, not like a fixed script: every answer
is worked out from the request alone (so a fresh worker process after a crash picks up
where the journal says the task is):

- the contract in the system prompt names the sources with their versions and the
  required dimensions (`Required dimensions: price (costs); ...`, each with the word
  the documents use for it);
- the conversation's tool results say what it read (the snapshot's text and id), which
  evidence, claims, sections and report it recorded, and the errors it got;
- the runtime's notices ("Invalidated since your last turn", the completion check's
  gaps, a refused citation) say which of those artifacts no longer hold;
- the ledger (`request.ledger`) says which items are open.

From that it does the next missing thing: read each declared source at its current
version once (one per round), quote the line of each dimension as evidence, claim it,
write a section per dimension citing the current claims, write the report (listing the
dimensions no document answers as open questions), then file one ticket with those
questions. With nothing open it says so.

`report_is_complete` is the contract's acceptance check of the report file.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tether.models.base import ModelRequest, ModelResponse, ToolCall

REPORT = "report.md"
_SOURCE = re.compile(r"^  - ([A-Za-z_][\w-]*) version (\S+) \((?:document|url|dataset|api)", re.M)
_DIMS = re.compile(r"^Required dimensions: (.+)$", re.M)
_READ = re.compile(
    r"source (\S+) version (\S+) \([^)]*\); cite snapshot artifact (\S+)\n(.*)", re.S
)
_EVIDENCE = re.compile(r"^evidence artifact (\S+) \(source (\S+) (\S+)\)")
_CLAIM = re.compile(r"^claim artifact (\S+) ")
_SECTION = re.compile(r"^report section artifact (\S+) \((.*)\)")
_INVALID_BLOCK = re.compile(r"Invalidated since your last turn[^\n]*\n((?:  - .*\n?)+)")
_REFUSED = re.compile(r": ([\w.\-, ]+?) (?:is|are) not a valid \w+ artifact")
_MISSING = re.compile(r"artifact ([\w.\-]+) (?:cites|is missing)")


def _call(name: str, **arguments: Any) -> ToolCall:
    # Ids unique across processes: a resumed task's history holds the calls of the
    # worker that died, and a result is matched to its call by id.
    return ToolCall(
        id=f"call_{uuid.uuid4().hex[:12]}",
        name=name,
        arguments=arguments,
        raw_arguments=json.dumps(arguments, sort_keys=True),
    )


@dataclass
class Knowledge:
    """What the analyst can tell from one request."""

    sources: list[tuple[str, str]] = field(default_factory=list)
    dims: list[tuple[str, str]] = field(default_factory=list)
    reads: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    evidence: dict[tuple[str, str, str], tuple[str, str]] = field(default_factory=dict)
    claims: dict[tuple[str, str, str], tuple[str, str]] = field(default_factory=dict)
    sections: dict[str, tuple[str, list[str]]] = field(default_factory=dict)
    invalid: set[str] = field(default_factory=set)

    def valid(self, ident: str) -> bool:
        """Not known to be invalid."""
        return ident not in self.invalid


def _user_notices(text: str, into: set[str]) -> None:
    for block in _INVALID_BLOCK.findall(text):
        into.update(line.split(":", 1)[0].strip(" -") for line in block.splitlines())
    if "Completion check found gaps" in text or "found gaps" in text:
        into.update(_MISSING.findall(text))


def learn(request: ModelRequest) -> Knowledge:
    """Read the contract, the tool results and the notices of `request`."""
    k = Knowledge()
    k.sources = _SOURCE.findall(request.system)
    found = _DIMS.search(request.system)
    if found:
        for part in found.group(1).split(";"):
            name, _, word = part.strip().partition(" (")
            k.dims.append((name.strip(), word.rstrip(")").strip()))
    calls: dict[str, ToolCall] = {}
    for m in request.messages:
        for c in m.tool_calls:
            calls[c.id] = c
        if m.role == "user":
            _user_notices(m.content, k.invalid)
        if m.role != "tool":
            continue
        call = calls.get(m.tool_call_id or "")
        args = dict(call.arguments or {}) if call else {}
        body = m.content
        refused = _REFUSED.search(body)
        if refused:
            k.invalid.update(i.strip() for i in refused.group(1).split(","))
        if m.name == "read_source" and (hit := _READ.search(body)):
            src, ver, snap, text = hit.groups()
            k.reads[(src, ver)] = (snap, text)
        elif m.name == "record_evidence" and (hit := _EVIDENCE.search(body)):
            dim = str(args.get("location", "")).split(",")[0]
            k.evidence[(hit.group(2), hit.group(3), dim)] = (hit.group(1), str(args["excerpt"]))
        elif m.name == "record_claim" and (hit := _CLAIM.search(body)):
            ev_id = str((args.get("evidence") or [""])[0])
            key = next((key for key, (i, _) in k.evidence.items() if i == ev_id), None)
            if key is not None:
                k.claims[key] = (hit.group(1), str(args.get("text", "")))
        elif m.name == "write_report_section" and (hit := _SECTION.search(body)):
            k.sections[hit.group(2)] = (hit.group(1), [str(c) for c in args.get("claims", [])])
    return k


def _lines(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]


def _fact(text: str, word: str) -> tuple[int, str] | None:
    for n, line in enumerate(_lines(text), 1):
        if word.lower() in line.lower() and not line.startswith("["):
            return n, line
    return None


def _current(k: Knowledge, table: dict[Any, tuple[str, Any]], key: Any) -> str | None:
    got = table.get(key)
    return got[0] if got and k.valid(got[0]) else None


def open_questions(k: Knowledge) -> list[str]:
    """The required dimensions no declared source answers (at its current version)."""
    out = []
    for src, ver in k.sources:
        read = k.reads.get((src, ver))
        if read is None:
            continue
        out += [
            f"{src} {ver}: {dim} is not documented" for dim, w in k.dims if not _fact(read[1], w)
        ]
    return out


def _open(request: ModelRequest, item: str) -> bool:
    for it in (request.ledger or {}).get("items", []):
        if it["id"] == item:
            return bool(it["status"] != "done")
    return False


def decide(request: ModelRequest) -> ModelResponse:
    """The analyst's next step (see the module docstring)."""
    k = learn(request)
    # 1. Read each declared source at its current version, once, one per round.
    for src, ver in k.sources:
        read = k.reads.get((src, ver))
        if read is None or not k.valid(read[0]):
            return ModelResponse(f"Reading {src} {ver}.", (_call("read_source", source=src),))
    # 2. Quote each documented dimension from the snapshot read (not from disk).
    quotes = []
    for src, ver in k.sources:
        snap, text = k.reads[(src, ver)]
        for dim, word in k.dims:
            fact = _fact(text, word)
            if fact and not _current(k, k.evidence, (src, ver, dim)):
                n, line = fact
                quotes.append(
                    _call(
                        "record_evidence",
                        source_artifact=snap,
                        excerpt=line,
                        location=f"{dim}, line {n}",
                    )
                )
    if quotes:
        return ModelResponse(f"Quoting {len(quotes)} facts.", tuple(quotes))
    # 3. Claim what each current piece of evidence says.
    claims = []
    for (src, ver, dim), (ev_id, excerpt) in k.evidence.items():
        if (
            (src, ver) in k.sources
            and k.valid(ev_id)
            and not _current(k, k.claims, (src, ver, dim))
        ):
            claims.append(
                _call(
                    "record_claim",
                    text=f"{src} {ver} {dim}: {excerpt}",
                    evidence=[ev_id],
                    topic=src,
                )
            )
    if claims:
        return ModelResponse(f"Claiming {len(claims)} facts.", tuple(claims))
    # 4. A section per dimension, citing every current claim about it.
    by_dim: dict[str, list[tuple[str, str]]] = {}
    for (src, ver, dim), (claim_id, text) in k.claims.items():
        if (src, ver) in k.sources and k.valid(claim_id):
            by_dim.setdefault(dim, []).append((claim_id, text))
    sections = []
    for dim, _ in k.dims:
        cited = by_dim.get(dim)
        have = k.sections.get(dim)
        fresh = have and k.valid(have[0]) and set(have[1]) == {c for c, _ in cited or []}
        if cited and not fresh:
            text = " ".join(t for _, t in cited)
            sections.append(
                _call("write_report_section", title=dim, text=text, claims=[c for c, _ in cited])
            )
    if sections:
        return ModelResponse(f"Writing {len(sections)} sections.", tuple(sections))
    questions = open_questions(k)
    # 5. The report, when the ledger wants one.
    if _open(request, "report"):
        order = [k.sections[d][0] for d, _ in k.dims if d in k.sections]
        return ModelResponse(
            "Writing the report.",
            (
                _call(
                    "write_report",
                    path=REPORT,
                    title="Comparison of A and B",
                    sections=order,
                    open_questions=questions,
                ),
            ),
        )
    # 6. One ticket for the open questions.
    if _open(request, "ticket"):
        title = "Open questions: " + "; ".join(questions or ["none"])
        return ModelResponse("Filing the open questions.", (_call("create_ticket", title=title),))
    return ModelResponse("Every item is done; the report lists its open questions.")


def analyst(request: ModelRequest) -> ModelResponse | str:
    """The act policy; compaction and review answers for the other purposes."""
    if request.purpose == "compact":
        return "Earlier rounds read sources and recorded evidence; the ledger is authoritative."
    if request.purpose == "review":
        return '{"passed": true, "gaps": [], "reopen": []}'
    if request.purpose != "act":
        return '{"changes": [], "decision": "continue", "reason": "rules decide"}'
    return decide(request)


# ---------------------------------------------------------------- acceptance check


def cited_claims(text: str) -> list[str]:
    """The claim ids a report cites (`[id]`)."""
    return re.findall(r"\[([\w.\-]+\.claim)\]", text)


def report_is_complete(workspace: Path) -> bool | str:
    """The report exists, has a section for each dimension the spec file lists in
    `dimensions.txt`, cites a claim in each, and lists its open questions."""
    report = workspace / REPORT
    if not report.is_file():
        return f"{REPORT} is missing"
    text = report.read_text("utf-8")
    wanted = _wanted(workspace)
    headings = set(re.findall(r"^## (.+)$", text, re.M))
    missing = [d for d in wanted if d not in headings]
    if missing:
        return f"{REPORT} has no section for {', '.join(missing)}"
    if not cited_claims(text):
        return f"{REPORT} cites no claim"
    tail = text.partition("## Open questions")[2]
    if not re.search(r"^- \S", tail, re.M) or "- none" in tail:
        return f"{REPORT} does not list its open questions"
    return True


def _wanted(workspace: Path) -> Iterable[str]:
    path = workspace / "dimensions.txt"
    return path.read_text("utf-8").split() if path.is_file() else ()

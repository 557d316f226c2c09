"""The A/B comparison contract the sourced-task tests share (`tests/data/corpus_ab`, the
scripted analyst of `tests/e2e/ab_policies.py`): claims, sections, then the report."""

from __future__ import annotations

from typing import Any


def compare_contract(*, report: bool = True) -> dict[str, Any]:
    """Compare A 1.0 and B 2.0 on price and sso (residency documented by neither): four
    claims, two sections and (`report`) a report."""
    contract: dict[str, Any] = {
        "name": "compare",
        "objective": "compare A and B",
        "instructions": "Required dimensions: price (costs); sso (sign-on); "
        "residency (stored in)",
        "sources": [
            {"id": "A", "version": "1.0", "location": "corpus/a-1.0.md", "title": "A"},
            {"id": "B", "version": "2.0", "location": "corpus/b-2.0.md"},
        ],
        "items": [
            {"id": "claims", "title": "claims",
             "done_when": {"kind": "artifact", "artifact_kind": "claim", "min_count": 4}},
            {"id": "sections", "title": "sections", "after": ["claims"],
             "done_when": {"kind": "artifact", "artifact_kind": "report_section",
                           "min_count": 2}},
            {"id": "report", "title": "the report", "after": ["sections"],
             "done_when": {"kind": "artifact", "artifact_kind": "report"}},
        ],
        "tools": ["read_source", "record_evidence", "record_claim",
                  "write_report_section", "write_report"],
        "limits": {"no_progress_rounds": 6},
    }  # fmt: skip
    if not report:
        contract["items"] = contract["items"][:2]
        contract["tools"] = contract["tools"][:4]
    return contract

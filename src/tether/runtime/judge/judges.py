"""The judges' names in one place (the module that held all three judges until they
got modules of their own): `facts` (what they exchange), `audit` (pure), `llm`, `rules`,
`commands` and `completion`. Kept for the paths tests and docs use; new code imports
the module that holds a name.
"""

from __future__ import annotations

from tether.runtime.judge.audit import audit
from tether.runtime.judge.completion import partial_record
from tether.runtime.judge.facts import (
    AuditOutcome,
    AuditWarning,
    Decision,
    Evidence,
    ItemPolicy,
    OpSummary,
    ProposedChange,
    RoundFacts,
    RuntimeDecision,
    Verdict,
    belongs,
)
from tether.runtime.judge.llm import (
    JUDGE_INSTRUCTIONS,
    VerdictParseError,
    compact_ledger,
    judge_request,
    parse_verdict,
)
from tether.runtime.judge.rules import RuleEnv, rule_verdict
from tether.runtime.judge.rules.commands import run_command

__all__ = [
    "JUDGE_INSTRUCTIONS",
    "AuditOutcome",
    "AuditWarning",
    "Decision",
    "Evidence",
    "ItemPolicy",
    "OpSummary",
    "ProposedChange",
    "RoundFacts",
    "RuleEnv",
    "RuntimeDecision",
    "Verdict",
    "VerdictParseError",
    "audit",
    "belongs",
    "compact_ledger",
    "judge_request",
    "parse_verdict",
    "partial_record",
    "rule_verdict",
    "run_command",
]

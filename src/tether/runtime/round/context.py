"""Context assembly: the system prompt, the history window, and what the model reads.

The system prompt is, in order: static instructions, the contract skeleton, then the
current ledger at the very tail. It is assembled once per epoch (task start, after a
compaction, after a goal change, after the provider cache expired) and never changed
inside it; within an epoch only appends happen, so every request's serialized prefix
is byte-identical to the previous one's and provider prompt caches hit.

History is a list of entries: a turn's opening message, a round's assistant message
and tool results, the runtime's continuation message with the judged ledger, and (after
a compaction) a summary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tether import ledger_view, tokens
from tether.ledger import Ledger
from tether.models.base import Message, ModelRequest, Purpose, ToolSchema
from tether.spec import TaskSpec

EntryKind = Literal["turn", "round", "continuation", "summary"]

STATIC_INSTRUCTIONS = """\
You are an agent run by tether, a durable runtime for long tasks.

How this works:
- The GOAL LEDGER is kept by the runtime, outside this conversation. It is the audited
  truth about progress: an item is done only when the ledger says so, with evidence.
  Your own memory of progress, and any summary of earlier work, may be stale.
- Work on the item the ledger names as "Next" unless it cannot be done yet. Make real
  progress with tool calls; saying something is done is not progress.
- After every round a judge checks the tool results and updates the ledger; you then
  receive a progress update with the judged ledger.
- Large tool outputs are stored as artifacts and shown as a preview; call
  read_artifact(artifact_id, offset, limit) to read more.
- If you cannot go on without a human (missing access, unclear goal), answer with a
  line starting NEED_HELP: and say what you need.
"""

#: The most gaps a continuation message lists one by one (then a count).
_GAPS_MAX = 25

SUMMARY_PREFIX = (
    "Summary of earlier rounds, written by a compressor. It may be wrong about progress: "
    "the GOAL LEDGER is authoritative over it.\n\n"
)


def render_contract(spec: TaskSpec) -> str:
    """The stable contract part of the system prompt (no state)."""
    lines = ["CONTRACT", f"Objective: {spec.objective}"]
    if spec.instructions.strip():
        lines += ["Instructions:", spec.instructions.strip()]
    if spec.acceptance:
        lines.append("Acceptance criteria:")
        lines += [f"  - [{a.id}] {a.description}" for a in spec.acceptance]
    if spec.tools:
        lines.append("Allowed tools: " + ", ".join(spec.tool_names()))
    if spec.sources:
        # The model can read only these (read_source refuses others), at these versions.
        lines.append("Sources (read them with read_source; cite what you read):")
        lines += [
            f"  - {s.id} version {s.version} ({s.kind}{f': {s.title}' if s.title else ''})"
            for s in spec.sources
        ]
    return "\n".join(lines)


def render_system(spec: TaskSpec, ledger: Ledger) -> str:
    """The whole system prompt: static part, contract, then the ledger at the tail."""
    return "\n\n".join(
        [
            STATIC_INSTRUCTIONS.strip(),
            render_contract(spec),
            ledger_view.render(ledger, header="GOAL LEDGER"),
        ]
    )


def turn_message(kind: str, ledger: Ledger, *, epoch: bool) -> str:
    """The user message that opens a turn."""
    if epoch:
        if kind == "start":
            return (
                "Start the task. The goal ledger is at the end of the system prompt; "
                f"begin with the item named Next ({ledger.next_item() or 'none'})."
            )
        return (
            f"Continue the task ({kind}). The goal ledger at the end of the system prompt is "
            f"current; go on with the item named Next ({ledger.next_item() or 'none'})."
        )
    # Not an epoch boundary: the system prompt is frozen, the ledger comes as a message.
    return (
        f"Continue the task ({kind}). The system prompt's ledger may be stale; this is the "
        "current audited ledger:\n\n" + ledger_view.render(ledger, header="CURRENT GOAL LEDGER")
    )


def continuation_message(
    ledger: Ledger,
    reason: str = "",
    gaps: Sequence[str] = (),
    changed: Sequence[str] = (),
) -> str:
    """The message appended after a `continue` verdict: the judged ledger (done, open and
    blocked, with evidence for what changed) and what is next."""
    parts = ["Progress update from the runtime (judged after your last round)."]
    if reason:
        parts.append(f"Judge: {reason}")
    lines = []
    # A long ledger's view lists what changed itself (bounded); a short one is shown
    # whole, so the changes are spelled out here.
    for item_id in () if ledger_view.paged(ledger) else changed:
        if ledger.has_item(item_id):
            s = ledger.item(item_id)
            ev = (
                f" (evidence {', '.join(s.evidence[:3])})"
                if s.evidence and s.status == "done"
                else ""
            )
            note = f" ({s.note})" if s.note and s.status in ("blocked", "skipped") else ""
            lines.append(f"  - {item_id} is now {s.status}{ev}{note}")
    if lines:
        parts.append("Changed this round:\n" + "\n".join(lines))
    if gaps:
        shown = gaps if len(gaps) <= _GAPS_MAX else gaps[: _GAPS_MAX - 5]
        more = [f"  ... and {len(gaps) - len(shown)} more"] if len(shown) < len(gaps) else []
        parts.append(
            "Completion check found gaps:\n" + "\n".join([*(f"  - {g}" for g in shown), *more])
        )
    parts.append(
        ledger_view.render(ledger, header="CURRENT GOAL LEDGER", compact=True, changed=changed)
    )
    nxt = ledger.next_item()
    if nxt:
        parts.append(f"Work on {nxt} next: {ledger.definition(nxt).title}")
    return "\n\n".join(parts)


@dataclass
class Entry:
    """A run of messages that enter or leave the history together."""

    kind: EntryKind
    messages: list[Message]
    round: int | None = None
    tokens: int = 0

    def __post_init__(self) -> None:
        if not self.tokens:
            # A loop, not `sum` over a generator: every round makes an entry.
            n = 0
            for m in self.messages:
                n += tokens.estimate_message(m)
            self.tokens = n


class Context:
    """A task's working view for the model: frozen system prompt plus appended history.

    The history's token total and its flat message list are kept as entries come and
    go (`append`, `drop`, assigning `entries`), so a round's estimates and its request
    cost no pass over the whole history. An entry changed in place (compaction trims
    them) must be followed by `recount`.
    """

    def __init__(
        self,
        system: str,
        tools: tuple[ToolSchema, ...],
        entries: list[Entry] | None = None,
        calibrator: tokens.Calibrator | None = None,
    ) -> None:
        self.system = system
        self.tools = tools
        self.calibrator = calibrator if calibrator is not None else tokens.Calibrator()
        self._fixed_cache: tuple[str, tuple[ToolSchema, ...], int] | None = None
        #: (system prompt, where its ledger starts): found once per epoch, not per round.
        self._cut_cache: tuple[str, int] | None = None
        self._entries: list[Entry] = []
        #: Sum of the entries' `tokens`, and all their messages in order.
        self._tokens = 0
        self._messages: list[Message] = []
        #: `messages()` as last built (None once the history changed).
        self._frozen: tuple[Message, ...] | None = ()
        self.entries = entries if entries is not None else []

    def __repr__(self) -> str:
        return f"Context(system={self.system!r}, tools={self.tools!r}, entries={self._entries!r})"

    @property
    def entries(self) -> list[Entry]:
        """The history entries, oldest first. Change it through `append`, `drop` or by
        assigning a new list (then `recount` is done for you)."""
        return self._entries

    @entries.setter
    def entries(self, entries: list[Entry]) -> None:
        self._entries = entries
        self.recount()

    def recount(self) -> None:
        """Recompute the running totals from the entries (after an entry was changed in
        place)."""
        self._tokens = sum(e.tokens for e in self._entries)
        self._messages = [m for e in self._entries for m in e.messages]
        self._frozen = None

    def append(self, entry: Entry) -> None:
        """Add an entry at the end (the only way history changes within an epoch)."""
        self._entries.append(entry)
        self._tokens += entry.tokens
        self._messages.extend(entry.messages)
        self._frozen = None

    def drop(self, index: int) -> Entry:
        """Remove and return the entry at `index` (compaction folds it into the
        summary)."""
        entry = self._entries.pop(index)
        self.recount()
        return entry

    def history_tokens(self) -> int:
        """The estimated tokens of the history entries (their `tokens`, summed)."""
        return self._tokens

    def messages(self) -> tuple[Message, ...]:
        """All messages in order."""
        frozen = self._frozen
        if frozen is None:
            frozen = self._frozen = tuple(self._messages)
        return frozen

    def request(
        self,
        purpose: Purpose = "act",
        *,
        task_id: str | None = None,
        max_output_tokens: int = 2048,
        ledger: Mapping[str, Any] | None = None,
    ) -> ModelRequest:
        """The request for the next act call (`ledger`: the ledger as data, see
        `ModelRequest.ledger`)."""
        # The ledger sits at the tail of the system prompt; the part before it is stable
        # across epochs, so providers with explicit breakpoints can cache it apart.
        system = self.system
        cached = self._cut_cache
        if cached is None or cached[0] is not system:
            cached = self._cut_cache = (system, system.rfind("\n\nGOAL LEDGER"))
        cut = cached[1]
        meta = {"system_stable_prefix": cut} if cut > 0 else {}
        return ModelRequest(
            purpose=purpose,
            system=system,
            messages=self.messages(),
            tools=self.tools,
            max_output_tokens=max_output_tokens,
            task_id=task_id,
            metadata=meta,
            ledger=ledger,
        )

    def _fixed(self) -> int:
        """Tokens of the system prompt and tools, counted once per epoch (both change
        only at an epoch boundary, by assignment)."""
        cached = self._fixed_cache
        if cached is None or cached[0] is not self.system or cached[1] is not self.tools:
            n = tokens.estimate_text(self.system) + tokens.estimate_tools(self.tools)
            cached = self._fixed_cache = (self.system, self.tools, n)
        return cached[2]

    def raw_estimate(self) -> int:
        """Estimated input tokens of the next request, before calibration."""
        return self._fixed() + self._tokens

    def estimate(self) -> int:
        """Calibrated estimate of the next request's input tokens."""
        return self.calibrator.scale(self.raw_estimate())

    def split(self, keep_tokens: int) -> tuple[list[Entry], list[Entry]]:
        """`(older, recent)`: the longest suffix of whole rounds within `keep_tokens`.

        A round's continuation stays with its round; a summary is always "older".
        """
        recent: list[Entry] = []
        used = 0
        idx = len(self.entries)
        while idx > 0:
            # Group an entry with the continuation that follows it.
            j = idx - 1
            group = [self.entries[j]]
            if (
                self.entries[j].kind == "continuation"
                and j > 0
                and self.entries[j - 1].kind == "round"
            ):
                j -= 1
                group.insert(0, self.entries[j])
            if any(e.kind == "summary" for e in group):
                break
            cost = self.calibrator.scale(sum(e.tokens for e in group))
            if used + cost > keep_tokens:
                break
            recent = group + recent
            used += cost
            idx = j
        return self.entries[:idx], recent


def transcript(entries: Sequence[Entry], limit_chars: int) -> str:
    """Plain-text rendering of history entries for the compressor, newest kept if cut."""
    blocks: list[str] = []
    add = blocks.append
    for e in entries:
        # Once per entry, not per message: a compaction transcribes dozens of rounds.
        where = f" (round {e.round}):\n" if e.round else ":\n"
        for m in e.messages:
            role = m.role
            head = f"TOOL RESULT ({m.name or m.tool_call_id})" if role == "tool" else role.upper()
            body = m.content
            if m.tool_calls:
                calls = "; ".join(f"{c.name}({c.raw_arguments[:200]})" for c in m.tool_calls)
                body = (body + "\n" if body else "") + f"[tool calls: {calls}]"
            add(head + where + body)
    text = "\n\n".join(blocks)
    if len(text) > limit_chars:
        text = "[... earlier part cut ...]\n" + text[-limit_chars:]
    return text

"""Typed events: one definition per event type, serialized as JSON with a schema version.

Every change to a task is an event appended to its log; projections (task row, ledger,
ops, artifacts) are updated in the same transaction. Readers are tolerant: unknown
fields are ignored and unknown types decode as `UnknownEvent`, so a newer log can be
read by an older tether and an older log by a newer one (new fields need defaults).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Field

#: The envelope schema version written with each event.
EVENT_SCHEMA_VERSION = 1

#: A duration in milliseconds, written to the microsecond by `Event.data` (a clock's
#: further digits are noise, bytes every round; a pydantic serializer function would
#: slow every dump), read as stored: a log of any precision decodes the same.
Millis = Annotated[float, "millis"]


class Event(BaseModel):
    """Base of all typed events."""

    model_config = ConfigDict(extra="ignore", frozen=True, defer_build=True)
    TYPE: ClassVar[str] = ""
    MILLIS: ClassVar[tuple[str, ...]] = ()  # its `Millis` fields (`_register`)

    def data(self) -> dict[str, Any]:
        """The JSON-ready payload (`model_dump(mode="json")`, its serializer called
        directly, without its wrapper: a round stores seven events; `Millis` rounded)."""
        out: dict[str, Any] = self.__pydantic_serializer__.to_python(self, mode="json")
        for key in self.MILLIS:
            if type(ms := out[key]) is float:  # (not an unchecked `model_construct` value)
                out[key] = round(ms, 3)
        return out

    def json_text(self) -> str:
        """`model_dump_json()`, the serializer called directly (see `data`)."""
        return self.__pydantic_serializer__.to_json(self).decode()


_E = TypeVar("_E", bound=type[Event])
EVENT_TYPES: dict[str, type[Event]] = {}


def _register(type_name: str) -> Any:
    def deco(cls: _E) -> _E:
        if type_name in EVENT_TYPES:
            raise RuntimeError(f"event type {type_name} defined twice")
        cls.TYPE = type_name
        cls.MILLIS = tuple(k for k, f in cls.__pydantic_fields__.items() if "millis" in f.metadata)
        EVENT_TYPES[type_name] = cls
        return cls

    return deco


class UnknownEvent(Event):
    """An event of a type this tether does not know (written by a newer one)."""

    model_config = ConfigDict(extra="allow", frozen=True, defer_build=True)


# --- task lifecycle ------------------------------------------------------------------


@_register("task.created")
class TaskCreated(Event):
    """A task was created from a spec."""

    name: str
    objective: str
    items: int
    workspace: str | None = None
    preexisting: dict[str, str] = Field(default_factory=dict)
    #: How the task was started (`runtime.launch`): model names, tool modules; no secrets.
    launch: dict[str, Any] | None = None
    #: The id in the workspace's marker file (`tether.placement`): workers check it.
    workspace_id: str | None = None

    def data(self) -> dict[str, Any]:
        """The JSON-ready payload (without `launch` or `workspace_id` when there is none)."""
        d = super().data()
        for key in ("launch", "workspace_id"):
            if d.get(key) is None:
                d.pop(key, None)
        return d


@_register("task.status")
class TaskStatusChanged(Event):
    """The task moved between lifecycle states."""

    src: str
    dst: str
    stop_reason: str | None = None
    reason: str = ""
    #: A wait's own words, as `status` tells them (the model's NEED_HELP question, the
    #: command that raises a limit): what a notice of it says, even sent later. Stored
    #: only when there are some.
    told: str = ""

    def data(self) -> dict[str, Any]:
        """The JSON-ready payload (without an empty `told`)."""
        d = super().data()
        if not d.get("told"):
            d.pop("told", None)
        return d


@_register("task.edited")
class TaskEdited(Event):
    """The goal or constraints changed; the task version rose."""

    old_version: int
    new_version: int
    changes: dict[str, Any] = Field(default_factory=dict)
    invalidated: list[str] = Field(default_factory=list)
    by: str = "user"
    #: The `task.edit_requested` event (its seq) this edit applies, when a running
    #: task's owner applied it at a round boundary.
    request: int | None = None


@_register("task.edit_requested")
class EditRequested(Event):
    """Someone edited a task a worker was running: the edit waits, journaled, for the
    worker to apply it at its next round boundary (a `task.edited` naming this seq)."""

    changes: dict[str, Any] = Field(default_factory=dict)
    add_items: list[dict[str, Any]] = Field(default_factory=list)
    remove_items: list[str] = Field(default_factory=list)
    update_items: dict[str, dict[str, Any]] = Field(default_factory=dict)
    by: str = "user"
    reason: str = ""


@_register("task.pause_requested")
class PauseRequested(Event):
    """Someone asked a running task to pause: its worker moves it to `paused` at the
    next round boundary."""

    by: str = "user"
    reason: str = ""


@_register("task.cancel_requested")
class CancelRequested(Event):
    """Someone asked the task to stop."""

    by: str = "user"
    reason: str = ""


@_register("lease.claimed")
class LeaseClaimed(Event):
    """A worker claimed the task."""

    worker_id: str
    token: int
    expires_at: float


@_register("user.message")
class UserMessage(Event):
    """A message from the user to the agent."""

    text: str
    by: str = "user"


# --- turns, rounds, model calls ------------------------------------------------------


@_register("turn.started")
class TurnStarted(Event):
    """A turn began; `epoch` says whether the system prompt was re-rendered."""

    turn: int
    kind: str
    epoch: bool
    epoch_reason: str = ""
    system_blob: str | None = None
    system_chars: int = 0
    message: str = ""


@_register("round.started")
class RoundStarted(Event):
    """A round began."""

    round: int
    turn: int
    item: str | None = None


@_register("model.called")
class ModelCalled(Event):
    """One model call: its request (by reference, or a blob), response, usage and cost."""

    call_id: str
    purpose: str
    model: str
    round: int | None = None
    request_blob: str | None = None
    #: The request by reference (the actor's calls; see `tether.runtime.round.history`).
    request: dict[str, Any] | None = None
    response_blob: str | None = None  # an older tether's: `response` in its place now
    response: dict[str, Any] | None = None  # less usage etc.: `history.called_response`
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    latency_ms: Millis = 0.0
    cost_usd: float = 0.0
    summary: str = ""
    tool_calls: int = 0
    #: Requests sent to the provider for this answer (1 + its retries).
    attempts: int = 1


@_register("model.failed")
class ModelFailed(Event):
    """A model call failed (after its retries)."""

    call_id: str
    purpose: str
    model: str
    error: str
    transient: bool = False
    attempts: int = 1


@_register("round.committed")
class RoundCommitted(Event):
    """A round's results are durable; the last event of a round."""

    round: int
    turn: int
    ops: int = 0
    text: str = ""
    messages_blob: str | None = None
    #: The round's messages by reference (see `tether.runtime.round.history`).
    messages: dict[str, Any] | None = None
    item: str | None = None


@_register("probe.answered")
class ProbeAnswered(Event):
    """A round in flight had been silent for `silent_for` seconds: the model was asked
    whether it still works on `item`. `answer`: DONE, WORKING, STUCK or `unusable` (no
    clear word, an error, no answer in time); `text` is what it said (or the error)."""

    round: int
    answer: str
    item: str | None = None
    attempt: int = 1
    silent_for: float = 0.0
    text: str = ""


# --- ops and artifacts ----------------------------------------------------------------


@_register("op.intended")
class OpIntended(Event):
    """A tool call is about to be sent; `op_id` is its idempotency key."""

    op_id: str
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    round: int = 0
    call_index: int = 0
    effect: str = "read"


@_register("op.dispatched")
class OpDispatched(Event):
    """A tool call was sent."""

    op_id: str
    attempt: int = 1


@_register("op.result")
class OpResult(Event):
    """A tool call ended: `succeeded`, `failed` or `unknown`."""

    op_id: str
    tool: str
    status: str
    summary: str = ""
    artifact_id: str | None = None
    error_class: str | None = None
    error: str | None = None
    attempt: int = 1
    duration_ms: Millis = 0.0


@_register("op.committed")
class OpCommitted(Event):
    """A tool call's outcome is part of the committed history."""

    op_id: str
    round: int


@_register("op.retry_scheduled")
class OpRetryScheduled(Event):
    """A transient failure; the next attempt's time is stored (durable backoff)."""

    op_id: str
    attempt: int
    next_attempt_at: float
    delay: float
    error_class: str
    error: str = ""


@_register("op.reconciled")
class OpReconciled(Event):
    """Recovery asked the outside world about an op whose outcome was unknown."""

    op_id: str
    outcome: str
    detail: str = ""


@_register("op.exhausted")
class OpExhausted(Event):
    """An op's retries ran out; its policy's `on_exhausted` says what happens next
    (`ask_human`: a request; `compensate`: the ops it names are undone, newest first)."""

    op_id: str
    tool: str
    attempts: int
    policy: str
    error: str = ""
    item: str | None = None
    compensate: list[str] = Field(default_factory=list)


@_register("op.compensated")
class OpCompensated(Event):
    """An applied op was undone by its compensation (`by`, an op itself), or left as
    it is by a human (`outcome`: `compensated`, `done_by_hand`, `left`)."""

    op_id: str
    by: str
    outcome: str = "compensated"
    after: str = ""


@_register("breaker.changed")
class BreakerChanged(Event):
    """A service's shared circuit breaker changed state."""

    service: str
    src: str
    dst: str
    reason: str = ""


@_register("artifact.stored")
class ArtifactStored(Event):
    """A content-addressed artifact was stored."""

    artifact_id: str
    kind: str
    name: str
    blob: str
    size: int
    source: str = ""


@_register("artifacts.invalidated")
class ArtifactsInvalidated(Event):
    """Artifacts that depended on a source version (or on other invalidated artifacts)
    became invalid, and the results of the ops that read the old version went to history
    with them: they stay stored, never current; the items they proved reopen."""

    artifacts: list[str]
    reason: str
    roots: list[str] = Field(default_factory=list)
    items: list[str] = Field(default_factory=list)
    #: Ops whose results were made from the old version (reads of the source): history
    #: from now on (their result says `superseded_by`), never evidence again.
    ops: list[str] = Field(default_factory=list)


# --- judge, ledger, audits -------------------------------------------------------------


@_register("judge.verdict")
class JudgeVerdict(Event):
    """The judge's verdict after a round, whether or not the ledger changed."""

    round: int
    decision: str
    reason: str = ""
    goal: str = ""
    done: int = 0
    total: int = 0
    percent: float = 0.0
    changes: list[dict[str, Any]] = Field(default_factory=list)
    judges: list[str] = Field(default_factory=list)
    continuation: str = ""
    #: The continuation is the text of the last one the history holds, again: left out
    #: of `continuation` (empty) and read back from there (`runtime.round.history`).
    same_continuation: bool = False
    #: A round's verdict: its focus item (None when the round worked on none) and the
    #: progress marks the audits remember of it (`RunState.seen`, which `tether rebuild`
    #: folds from these). None on a verdict that is not a round's (before delivery).
    item: str | None = None
    marks: list[str] | None = None


@_register("ledger.updated")
class LedgerUpdated(Event):
    """The ledger changed; `diff` lists every field change."""

    version: int
    diff: list[dict[str, Any]]
    cause: str = "judge"


@_register("audit.warning")
class AuditWarning(Event):
    """A mechanical audit refused or flagged something."""

    code: str
    message: str
    details: dict[str, Any] = Field(default_factory=dict)


@_register("notice.sent")
class NoticeSent(Event):
    """People were told about the task: it waits for them (`waiting`, `reminder`), waited
    too long (`escalation`), or its worker went silent (`stalled`)."""

    kind: str
    channel: str
    text: str = ""
    #: The notice's id (`TASK:SEQ` for a journal event's notice; empty before it existed).
    notice_id: str = ""


@_register("decision.requested")
class DecisionRequested(Event):
    """Nothing is open but not everything is finished: a human decides (retry an item,
    waive it, or abandon the task). `partial` is the partial-completion record. With
    `report` (the execution report), the work is complete and a person signs off on it
    (`review: human`): approve or reject."""

    reason: str
    partial: dict[str, Any] = Field(default_factory=dict)
    report: dict[str, Any] = Field(default_factory=dict)


@_register("signoff.decided")
class SignoffDecided(Event):
    """A person answered a sign-off request (`review: human`): `approve` (deliver the
    work as reported) or `reject` (the items in `reopen` go back to work with `hint`)."""

    decision: str
    by: str = "user"
    hint: str = ""
    reopen: list[str] = Field(default_factory=list)
    ledger_version: int = 0


@_register("item.retried")
class ItemRetried(Event):
    """A human sent an item back to work, its counters reset, with an optional hint."""

    item: str
    by: str = "user"
    hint: str = ""
    previous: str = ""


@_register("item.waived")
class ItemWaived(Event):
    """A human waived an item: the task may be delivered without it."""

    item: str
    by: str = "user"
    reason: str = ""
    previous: str = ""


@_register("completion.checked")
class CompletionChecked(Event):
    """The completion check ran on a proposed `satisfied`."""

    passed: bool
    results: list[dict[str, Any]] = Field(default_factory=list)
    reviewer: str | None = None
    gaps: list[str] = Field(default_factory=list)


@_register("context.compacted")
class ContextCompacted(Event):
    """Older rounds were folded into a summary."""

    summary_blob: str
    rounds_compacted: int
    upto_round: int
    tokens_before: int
    tokens_after: int
    claimed_done: list[str] = Field(default_factory=list)
    fallback: bool = False


@_register("budget.threshold")
class BudgetThreshold(Event):
    """A budget crossed 50%, 80% or 100%."""

    scope: str
    resource: str
    percent: int
    used: float
    limit: float


# --- recovery ---------------------------------------------------------------------------


@_register("recovery.started")
class RecoveryStarted(Event):
    """A worker began recovering a task it claimed."""

    worker_id: str
    previous_owner: str | None = None


@_register("recovery.step")
class RecoveryStep(Event):
    """One step of recovery: `version`, `artifacts`, `ops`, `ledger` or `context`."""

    step: str
    details: dict[str, Any] = Field(default_factory=dict)


# --- humans ------------------------------------------------------------------------------


@_register("approval.requested")
class ApprovalRequested(Event):
    """The task waits for a human decision."""

    request_id: str
    what: str
    impact: str = ""
    op_id: str | None = None
    options: list[str] = Field(default_factory=lambda: ["approve", "reject", "modify"])


@_register("approval.decided")
class ApprovalDecided(Event):
    """A human decided on an approval request."""

    request_id: str
    decision: str
    by: str = "user"
    modified_args: dict[str, Any] | None = None


@_register("approval.closed")
class ApprovalClosed(Event):
    """A request closed with what it decided about, undecided (or approved but never
    acted on): the task ended, or the item its call worked for was waived or removed by
    an edit. A closed request is final: it is never approved, rejected or sent later."""

    request_id: str
    reason: str
    by: str = "tether"
    op_id: str | None = None
    #: The request's status when it was closed (`pending`, or `approved` and unsent).
    previous: str = "pending"


def encode(event: Event) -> tuple[str, int, dict[str, Any]]:
    """`(type, schema_version, data)` for storage."""
    if isinstance(event, UnknownEvent):
        raise TypeError("cannot write an UnknownEvent")
    if not event.TYPE:
        raise TypeError(f"{type(event).__name__} is not a registered event type")
    return event.TYPE, EVENT_SCHEMA_VERSION, event.data()


def decode(type_name: str, data: dict[str, Any]) -> Event:
    """A typed event from stored data; `UnknownEvent` for types this tether lacks."""
    cls = EVENT_TYPES.get(type_name)
    if cls is None:
        return UnknownEvent.model_validate(data)
    return cls.model_validate(data)

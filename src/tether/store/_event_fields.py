"""The fields of each stored event type and their plain defaults, for `store._rules`
`compact`/`expand` (a SQL store leaves fields at their defaults out of the rows it
writes and puts them back when it reads).

A table rather than the event models themselves: a command that only reads (`tether
status`) decodes rows without importing `tether.events` and pydantic's models (a few
hundred milliseconds of start-up). `tests/unit/test_event_fields.py` checks it against
the models; when an event type changes, regenerate it with
`derived()` (it reads the models) and paste it here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tether import events as ev

#: Per event type: `(field,)` for a field with no plain default, `(field, default)` for
#: one whose default (None, a bool, number or string, an empty list or dict) a store
#: may leave out; None for a type that writes its own data (stored as it writes it).
FIELDS: dict[str, tuple[tuple[Any, ...], ...] | None] = {
    "approval.closed": (
        ("request_id",),
        ("reason",),
        ("by", "tether"),
        ("op_id", None),
        ("previous", "pending"),
    ),
    "approval.decided": (("request_id",), ("decision",), ("by", "user"), ("modified_args", None)),
    "approval.requested": (
        ("request_id",),
        ("what",),
        ("impact", ""),
        ("op_id", None),
        ("options",),
    ),
    "artifact.stored": (
        ("artifact_id",),
        ("kind",),
        ("name",),
        ("blob",),
        ("size",),
        ("source", ""),
    ),
    "artifacts.invalidated": (
        ("artifacts",),
        ("reason",),
        ("roots", []),
        ("items", []),
        ("ops", []),
    ),
    "audit.warning": (("code",), ("message",), ("details", {})),
    "breaker.changed": (("service",), ("src",), ("dst",), ("reason", "")),
    "budget.threshold": (("scope",), ("resource",), ("percent",), ("used",), ("limit",)),
    "completion.checked": (("passed",), ("results", []), ("reviewer", None), ("gaps", [])),
    "context.compacted": (
        ("summary_blob",),
        ("rounds_compacted",),
        ("upto_round",),
        ("tokens_before",),
        ("tokens_after",),
        ("claimed_done", []),
        ("fallback", False),
    ),
    "decision.requested": (("reason",), ("partial", {}), ("report", {})),
    "item.retried": (("item",), ("by", "user"), ("hint", ""), ("previous", "")),
    "item.waived": (("item",), ("by", "user"), ("reason", ""), ("previous", "")),
    "judge.verdict": (
        ("round",),
        ("decision",),
        ("reason", ""),
        ("goal", ""),
        ("done", 0),
        ("total", 0),
        ("percent", 0.0),
        ("changes", []),
        ("judges", []),
        ("continuation", ""),
        ("same_continuation", False),
        ("item", None),
        ("marks", None),
    ),
    "lease.claimed": (("worker_id",), ("token",), ("expires_at",)),
    "ledger.updated": (("version",), ("diff",), ("cause", "judge")),
    "model.called": (
        ("call_id",),
        ("purpose",),
        ("model",),
        ("round", None),
        ("request_blob", None),
        ("request", None),
        ("response_blob", None),
        ("response", None),
        ("input_tokens", 0),
        ("output_tokens", 0),
        ("cached_tokens", 0),
        ("cache_write_tokens", 0),
        ("latency_ms", 0.0),
        ("cost_usd", 0.0),
        ("summary", ""),
        ("tool_calls", 0),
        ("attempts", 1),
    ),
    "model.failed": (
        ("call_id",),
        ("purpose",),
        ("model",),
        ("error",),
        ("transient", False),
        ("attempts", 1),
    ),
    "notice.sent": (("kind",), ("channel",), ("text", ""), ("notice_id", "")),
    "op.committed": (("op_id",), ("round",)),
    "op.compensated": (("op_id",), ("by",), ("outcome", "compensated"), ("after", "")),
    "op.dispatched": (("op_id",), ("attempt", 1)),
    "op.exhausted": (
        ("op_id",),
        ("tool",),
        ("attempts",),
        ("policy",),
        ("error", ""),
        ("item", None),
        ("compensate", []),
    ),
    "op.intended": (
        ("op_id",),
        ("tool",),
        ("args", {}),
        ("round", 0),
        ("call_index", 0),
        ("effect", "read"),
    ),
    "op.reconciled": (("op_id",), ("outcome",), ("detail", "")),
    "op.result": (
        ("op_id",),
        ("tool",),
        ("status",),
        ("summary", ""),
        ("artifact_id", None),
        ("error_class", None),
        ("error", None),
        ("attempt", 1),
        ("duration_ms", 0.0),
    ),
    "op.retry_scheduled": (
        ("op_id",),
        ("attempt",),
        ("next_attempt_at",),
        ("delay",),
        ("error_class",),
        ("error", ""),
    ),
    "probe.answered": (
        ("round",),
        ("answer",),
        ("item", None),
        ("attempt", 1),
        ("silent_for", 0.0),
        ("text", ""),
    ),
    "recovery.started": (("worker_id",), ("previous_owner", None)),
    "recovery.step": (("step",), ("details", {})),
    "round.committed": (
        ("round",),
        ("turn",),
        ("ops", 0),
        ("text", ""),
        ("messages_blob", None),
        ("messages", None),
        ("item", None),
    ),
    "round.started": (("round",), ("turn",), ("item", None)),
    "signoff.decided": (
        ("decision",),
        ("by", "user"),
        ("hint", ""),
        ("reopen", []),
        ("ledger_version", 0),
    ),
    "task.cancel_requested": (("by", "user"), ("reason", "")),
    "task.created": None,
    "task.edit_requested": (
        ("changes", {}),
        ("add_items", []),
        ("remove_items", []),
        ("update_items", {}),
        ("by", "user"),
        ("reason", ""),
    ),
    "task.edited": (
        ("old_version",),
        ("new_version",),
        ("changes", {}),
        ("invalidated", []),
        ("by", "user"),
        ("request", None),
    ),
    "task.pause_requested": (("by", "user"), ("reason", "")),
    "task.status": None,
    "turn.started": (
        ("turn",),
        ("kind",),
        ("epoch",),
        ("epoch_reason", ""),
        ("system_blob", None),
        ("system_chars", 0),
        ("message", ""),
    ),
    "user.message": (("text",), ("by", "user")),
}


#: JSON values a field may default to that `compact` leaves out of a stored event.
_SCALARS = (type(None), bool, int, float, str)


def _plain_defaults(cls: type[ev.Event]) -> tuple[tuple[str, Any], ...] | None:
    """`(field, default)` of an event type's fields, in order; `_NO_DEFAULT` for a field
    without a plain (None, bool, number, string, empty list or dict) default. None for a
    type with its own `data`, which may leave fields out itself: stored as it writes it."""
    if cls in _DEFAULTS:
        return _DEFAULTS[cls]
    from tether.events import Event

    got: tuple[tuple[str, Any], ...] | None = None
    if cls.data is Event.data:
        pairs = []
        for name, field in cls.model_fields.items():
            default: Any = _NO_DEFAULT
            if field.default_factory is not None:
                made = field.default_factory()  # type: ignore[call-arg]
                if made in ([], {}):
                    default = made
            elif type(field.default) in _SCALARS:
                default = field.default
            pairs.append((name, default))
        got = tuple(pairs)
    _DEFAULTS[cls] = got
    return got


_NO_DEFAULT = object()
_DEFAULTS: dict[type[ev.Event], tuple[tuple[str, Any], ...] | None] = {}


def derived() -> dict[str, tuple[tuple[Any, ...], ...] | None]:
    """`_event_fields.FIELDS` as the event models say it: `(field,)` or `(field,
    default)` per field, None for a type with its own `data` (imports the models)."""
    from tether.events import EVENT_TYPES

    out: dict[str, tuple[tuple[Any, ...], ...] | None] = {}
    for name, cls in EVENT_TYPES.items():
        pairs = _plain_defaults(cls)
        out[name] = (
            None if pairs is None else tuple((f,) if d is _NO_DEFAULT else (f, d) for f, d in pairs)
        )
    return out

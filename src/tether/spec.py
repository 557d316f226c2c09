"""The task contract: what "done" means, loaded from YAML or built in Python.

A `TaskSpec` names the objective, the acceptance criteria (each optionally checked by a
shell command or a Python callable), milestones and checklist items (each optionally
with a `done_when` rule the runtime can check without a model), the allowed tools,
budgets and limits. Unknown fields are refused so that a typo never silently turns a
limit off.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    model_validator,
)

from tether import _validation, errors

_ID = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$"
_SEP = "\n"
#: Union tags pydantic puts into error locations; the user never wrote them.
_TAGS = frozenset({"op", "file", "artifact", "command", "callable"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_kind(value: Any) -> str:
    # A check with a `callable` key is a CallableCheck; anything else a CommandCheck, so
    # a typo is reported once, against the fields of the kind the user meant.
    if isinstance(value, dict):
        return "callable" if "callable" in value else "command"
    return "callable" if isinstance(value, CallableCheck) else "command"


class CommandCheck(_Strict):
    """Run a shell command in the workspace; it passes when the exit code matches."""

    command: str = Field(min_length=1)
    exit_code: int = 0
    timeout: float = Field(default=60.0, gt=0)


class CallableCheck(_Strict):
    """Call `module:function(workspace: Path) -> bool | str`; a string is a failure reason."""

    callable: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class AcceptanceCriterion(_Strict):
    """One condition the delivered work must meet."""

    id: str = Field(pattern=_ID)
    description: str = Field(min_length=1)
    check: (
        Annotated[
            Annotated[CommandCheck, Tag("command")] | Annotated[CallableCheck, Tag("callable")],
            Discriminator(_check_kind),
        ]
        | None
    ) = None


class OpRule(_Strict):
    """Done when a committed op of `tool` succeeded, optionally with matching arguments."""

    kind: Literal["op"] = "op"
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)


class FileRule(_Strict):
    """Done when a file in the workspace exists (and optionally contains a text)."""

    kind: Literal["file"] = "file"
    path: str
    contains: str | None = None
    fresh: bool = Field(
        default=True,
        description="the file must differ from what was there when the task was created",
    )


class ArtifactRule(_Strict):
    """Done when a valid artifact with this name (and kind) exists."""

    kind: Literal["artifact"] = "artifact"
    name: str
    artifact_kind: str | None = None


class CommandRule(_Strict):
    """Done when a shell command exits with the expected code."""

    kind: Literal["command"] = "command"
    command: str
    exit_code: int = 0
    timeout: float = Field(default=60.0, gt=0)


DoneWhen = Annotated[OpRule | FileRule | ArtifactRule | CommandRule, Field(discriminator="kind")]


class Budget(_Strict):
    """Caps on spend; `None` means no cap."""

    tokens: int | None = Field(default=None, gt=0)
    money_usd: float | None = Field(default=None, gt=0)
    wall_seconds: float | None = Field(default=None, gt=0)
    rounds: int | None = Field(default=None, gt=0)


class Milestone(_Strict):
    """A group of checklist items with an optional budget of its own."""

    id: str = Field(pattern=_ID)
    title: str = Field(min_length=1)
    budget: Budget = Field(default_factory=Budget)


class EvidenceLinks(_Strict):
    """Evidence the contract links to an item wherever it was produced: ops of these
    tools, artifacts with these names."""

    tools: list[str] = Field(default_factory=list)
    artifacts: list[str] = Field(default_factory=list)


class ChecklistItem(_Strict):
    """One unit of work the ledger tracks.

    Evidence belongs to an item when it is the item's own `done_when` result, an op or
    artifact produced in a round whose focus was the item, or one `evidence_from` links
    to it. Evidence already credited to another item counts only with
    `shared_evidence: true`. An `optional` item may end `skipped` instead of `done`.
    """

    id: str = Field(pattern=_ID)
    title: str = Field(min_length=1)
    milestone: str | None = None
    done_when: DoneWhen | None = None
    max_attempts: int | None = Field(default=None, gt=0)
    optional: bool = False
    shared_evidence: bool = False
    evidence_from: EvidenceLinks = Field(default_factory=EvidenceLinks)


class Limits(_Strict):
    """Loop guards and breaker thresholds."""

    max_rounds: int = Field(default=200, gt=0)
    max_rounds_per_milestone: int | None = Field(default=None, gt=0)
    max_attempts_per_item: int = Field(default=3, gt=0)
    no_progress_rounds: int = Field(
        default=3, gt=0, description="rounds on one item without progress before it is blocked"
    )
    same_failure_repeats: int = Field(default=3, gt=0)
    breaker_failure_rate: float = Field(default=0.3, gt=0, le=1)
    breaker_min_calls: int = Field(default=10, gt=0)
    breaker_cooldown_seconds: float = Field(default=60.0, gt=0)


class ToolPermission(_Strict):
    """A tool on the allowlist, with what the contract says about it."""

    name: str = Field(min_length=1)
    approval: bool | None = Field(
        default=None,
        description="require a human's approval; default: only for risky effects "
        "(overwrite, delete, send, pay, publish)",
    )
    max_attempts: int | None = Field(default=None, gt=0, description="transient retries")


class McpServer(_Strict):
    """An MCP server whose tools join the task's registry (stdio command or HTTP URL)."""

    name: str = Field(pattern=_ID)
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    url: str | None = None
    tools: list[str] | None = Field(default=None, description="expose only these tools")
    timeout: float = Field(default=30.0, gt=0)

    @model_validator(mode="after")
    def _one_transport(self) -> McpServer:
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of command (stdio) or url (streamable HTTP)")
        return self


class ServicePolicy(_Strict):
    """Breaker and concurrency settings of one external service (shared by all workers)."""

    max_concurrency: int | None = Field(default=None, gt=0)
    failure_rate: float | None = Field(default=None, gt=0, le=1)
    min_calls: int | None = Field(default=None, gt=0)
    window_seconds: float = Field(default=60.0, gt=0)
    cooldown_seconds: float | None = Field(default=None, gt=0)


class Models(_Strict):
    """Model names by purpose; judge, compact and review default to the actor's."""

    actor: str | None = None
    judge: str | None = None
    compact: str | None = None
    review: str | None = None


class ContextConfig(_Strict):
    """How much history a model call may carry."""

    input_budget_tokens: int = Field(default=16_000, ge=1_000)
    preview_chars: int = Field(default=800, ge=100)
    cache_ttl_seconds: float = Field(default=300.0, ge=0)


class TaskSpec(_Strict):
    """A task's contract. Build it in Python or load it with `load_spec`."""

    name: str = Field(default="task", min_length=1)
    objective: str = Field(min_length=1)
    instructions: str = ""
    acceptance: list[AcceptanceCriterion] = Field(default_factory=list)
    milestones: list[Milestone] = Field(default_factory=list)
    items: list[ChecklistItem] = Field(min_length=1)
    tools: list[str | ToolPermission] = Field(default_factory=list)
    mcp_servers: list[McpServer] = Field(default_factory=list)
    services: dict[str, ServicePolicy] = Field(default_factory=dict)
    budget: Budget = Field(default_factory=Budget)
    limits: Limits = Field(default_factory=Limits)
    models: Models = Field(default_factory=Models)
    context: ContextConfig = Field(default_factory=ContextConfig)
    workspace: str | None = None
    review: bool = False

    @model_validator(mode="after")
    def _check_references(self) -> TaskSpec:
        problems: list[str] = []
        ms_ids = [m.id for m in self.milestones]
        for dup in sorted({i for i in ms_ids if ms_ids.count(i) > 1}):
            problems.append(f"milestones: id {dup!r} is used more than once")
        item_ids = [i.id for i in self.items]
        for dup in sorted({i for i in item_ids if item_ids.count(i) > 1}):
            problems.append(f"items: id {dup!r} is used more than once")
        acc_ids = [a.id for a in self.acceptance]
        for dup in sorted({i for i in acc_ids if acc_ids.count(i) > 1}):
            problems.append(f"acceptance: id {dup!r} is used more than once")
        for n, item in enumerate(self.items):
            if item.milestone is not None and item.milestone not in ms_ids:
                problems.append(
                    f"items.{n}.milestone: {item.milestone!r} is not a milestone id "
                    f"(expected one of {ms_ids or 'none declared'})"
                )
        if problems:
            raise ValueError(_SEP.join(problems))
        return self

    def tool_names(self) -> list[str]:
        """The allowlist, as names."""
        return [t if isinstance(t, str) else t.name for t in self.tools]

    def permission(self, name: str) -> ToolPermission | None:
        """What the contract says about one allowed tool (None if not allowed)."""
        for t in self.tools:
            if (t if isinstance(t, str) else t.name) == name:
                return ToolPermission(name=t) if isinstance(t, str) else t
        return None

    def milestone_of(self, item_id: str) -> str | None:
        """The milestone id of an item, or None."""
        for item in self.items:
            if item.id == item_id:
                return item.milestone
        return None


_TOP = "(top level)"
_UNKNOWN_HINT = " (check the spelling; allowed fields are listed in the docs)"


def _loc(loc: tuple[int | str, ...]) -> str:
    """Where an error is, without the discriminator tags pydantic adds to the path."""
    kept = [
        p
        for n, p in enumerate(loc)
        if not (n > 0 and loc[n - 1] in ("done_when", "check") and p in _TAGS)
    ]
    return _validation.where(kept, root=_TOP)


def _describe(err: Any) -> list[str]:
    """The lines of one pydantic error: a validator's own problems one per line, else
    the wording shared with tool arguments (`tether._validation`)."""
    loc = _loc(tuple(err["loc"]))
    if err["type"] == "value_error":
        msg = str(err.get("ctx", {}).get("error", err["msg"]))
        lines = [ln for ln in msg.split(_SEP) if ln.strip()]
        return lines if loc == _TOP else [f"{loc}: {ln}" for ln in lines]
    return [_validation.describe_error(err, loc, noun="field", unknown_hint=_UNKNOWN_HINT)]


def parse_spec(data: Any, *, source: str = "<spec>") -> TaskSpec:
    """Validate a decoded spec (a dict) and return the `TaskSpec`."""
    if not isinstance(data, dict):
        raise errors.SpecError(
            f"expected a mapping at the top level, got {type(data).__name__}", source=source
        )
    try:
        return TaskSpec.model_validate(data)
    except ValidationError as exc:
        problems = [p for e in exc.errors() for p in _describe(e)]
        raise errors.SpecError("the spec is not valid", source=source, problems=problems) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe loader that refuses a key given twice in one mapping (YAML allows it
    silently; in a contract it is always a mistake)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"the key {key!r} appears twice in one mapping",
                    key_node.start_mark,
                )
            seen[key] = True
        return super().construct_mapping(node, deep=deep)


def load_spec(path: str | Path) -> TaskSpec:
    """Load a YAML (or JSON) spec file; a bad file raises `SpecError` naming file and field."""
    p = Path(path)
    source = str(p)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise errors.SpecError("file not found", source=source) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise errors.SpecError(f"cannot read the file ({exc})", source=source) from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise errors.SpecError(f"malformed YAML{where}: {problem}", source=source) from None
    spec = parse_spec(data, source=source)
    if spec.workspace is not None and not re.match(r"^[^\x00]+$", spec.workspace):
        raise errors.SpecError("workspace: not a usable path", source=source)
    return spec

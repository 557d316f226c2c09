"""The task contract: what "done" means, loaded from YAML or built in Python.

A `TaskSpec` names the objective, the acceptance criteria (each optionally checked by a shell
command or a Python callable), milestones and checklist items (each optionally with a
`done_when` rule the runtime can check without a model), the allowed tools, budgets and limits.
Unknown fields are refused so that a typo never silently turns a limit off.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import re
import weakref
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AliasChoices,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from tether import _validation, errors, mcp_config, placement, spec_problems
from tether import review as _review
from tether._spec_model import _Strict
from tether._validation import cut as _cut
from tether._validation import http_url_problem
from tether.schedule import Schedule
from tether.spec_limits import DEFAULT_MAX_ROUNDS as DEFAULT_MAX_ROUNDS
from tether.spec_limits import ROUNDS_PER_ITEM as ROUNDS_PER_ITEM
from tether.spec_limits import Limits as Limits
from tether.spec_policies import StopPolicy
from tether.spec_problems import MAX_PROBLEMS as MAX_PROBLEMS
from tether.spec_tools import ToolPermission as ToolPermission
from tether.spec_tools import _bare_permission
from tether.spec_values import MAX_DEPTH as MAX_DEPTH
from tether.spec_values import MAX_INT as MAX_INT
from tether.spec_values import MAX_NAME_BYTES as MAX_NAME_BYTES
from tether.spec_values import MAX_NODES as MAX_NODES
from tether.spec_values import MAX_PATH_CHARS as MAX_PATH_CHARS
from tether.spec_values import data_problem as data_problem
from tether.spec_values import file_path_problem as file_path_problem

#: What an id (of an item, a milestone, a criterion, a source, a server) may be.
_ID = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$"

# Bounds on what a spec may hold. A contract is a short document; these refuse a hostile
# one (a "billion laughs" of YAML aliases, nesting that would overflow the stack, numbers
# no database column holds) quickly and with a clear message, instead of a traceback, a
# hang or gigabytes of memory.

#: The largest spec file `load_spec` reads.
MAX_SPEC_BYTES = 1 << 20
#: The most alias uses (`*name`) in one YAML file.
MAX_ALIASES = 200

#: What a label (a source's version) may not contain: the controls that would act on a
#: terminal (ESC, CR, BEL...), DEL and C1 controls, bidirectional overrides, line
#: separators.
_BAD_IN_LABEL = re.compile(f"[{_validation.CONTROLS}]")


def label_problem(text: str) -> str | None:
    """Why `text` cannot be a one-line label (a source's version), or None: not blank,
    and without control characters that would act on a terminal where it is shown."""
    if not text.strip():
        return "is blank"
    bad = _BAD_IN_LABEL.search(text)
    if bad:
        return f"contains a control character ({bad.group()!r})"
    return None


def _stored(info: ValidationInfo) -> bool:
    """Whether a stored task's spec is being read (`parse_spec(..., stored=True)`): the
    input checks of URLs and labels are for what is written now, not what was."""
    return bool(info.context and info.context.get("stored"))


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

    @field_validator("args", mode="after")
    @classmethod
    def _json_args(cls, value: dict[str, Any]) -> dict[str, Any]:
        problem = data_problem(value)
        if problem:
            raise ValueError(problem)
        return value


class FileRule(_Strict):
    """Done when a file in the workspace exists (and optionally contains a text)."""

    kind: Literal["file"] = "file"
    path: str = Field(description="relative to the workspace, and inside it")
    contains: str | None = None
    fresh: bool = Field(
        default=True,
        description="the file must differ from what was there when the task was created",
    )

    @field_validator("path", mode="after")
    @classmethod
    def _inside_the_workspace(cls, value: str) -> str:
        problem = file_path_problem(value)
        if problem:
            raise ValueError(problem)
        return value


class ArtifactRule(_Strict):
    """Done when at least `min_count` valid artifacts with this name and/or kind exist
    (not already proving another item, unless the item shares evidence)."""

    kind: Literal["artifact"] = "artifact"
    name: str | None = None
    artifact_kind: str | None = None
    min_count: int = Field(default=1, gt=0, le=1000)

    @model_validator(mode="after")
    def _names_something(self) -> ArtifactRule:
        if self.name is None and self.artifact_kind is None:
            raise ValueError("give name, artifact_kind or both")
        return self


SourceKind = Literal["document", "url", "dataset", "api"]


class Source(_Strict):
    """A source the task may read, at a version. `pin: snapshot` stores the bytes read
    (content-addressed: a re-read after a crash sees the same bytes); `pin: fingerprint`
    records a version fingerprint (a file's hash, size and mtime; a URL's ETag,
    Last-Modified and content hash), and a re-read that finds it changed invalidates
    what depended on the earlier read.

    `document` and `dataset` are files (`location` a path, relative to the workspace);
    `url` is fetched with an HTTP GET of `location`; `api` is an HTTP request to
    `location` asking for JSON: a GET, or with `method: POST` a POST of `body` as JSON.
    """

    id: str = Field(pattern=_ID)
    kind: SourceKind = "document"
    version: str = Field(min_length=1, max_length=200)
    location: str = Field(min_length=1, max_length=4096)
    pin: Literal["snapshot", "fingerprint"] = "snapshot"
    title: str = ""
    method: Literal["GET", "POST"] = "GET"
    body: dict[str, Any] | list[Any] | None = None

    @field_validator("version", mode="after")
    @classmethod
    def _one_line(cls, value: str, info: ValidationInfo) -> str:
        problem = None if _stored(info) else label_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _http_fields(self, info: ValidationInfo) -> Source:
        if self.kind in ("url", "api"):
            if not re.match(r"(?i)^https?://", self.location):
                raise ValueError(f"a {self.kind} source's location must be an http(s):// URL")
            problem = None if _stored(info) else http_url_problem(self.location)
            if problem:
                raise ValueError(f"location {problem}")
        elif not _stored(info):
            bad = _BAD_IN_LABEL.search(self.location)
            if bad or not self.location.strip():
                raise ValueError(
                    "location is not a usable file path "
                    + (f"(it contains {bad.group()!r})" if bad else "(it is blank)")
                )
        if self.kind != "api" and (self.method != "GET" or self.body is not None):
            raise ValueError("method and body are for api sources only")
        if self.body is not None and self.method != "POST":
            raise ValueError("an api source's body is sent with method: POST")
        return self


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
    allow_unpriced: bool = Field(
        default=False,
        description="run with money_usd although a model has no price (its calls count $0)",
    )


class ModelPrice(_Strict):
    """A model's price in USD per million tokens (`prices:` in a contract)."""

    input: float = Field(ge=0, le=1_000_000)
    output: float = Field(ge=0, le=1_000_000)
    cached_input: float | None = Field(
        default=None, ge=0, le=1_000_000, description="cache reads; the input price if unset"
    )
    cache_write: float | None = Field(
        default=None, ge=0, le=1_000_000, description="cache writes; the input price if unset"
    )


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
    after: list[str] = Field(
        default_factory=list,
        validation_alias=AliasChoices("after", "depends_on"),
        description="ids of items that must be finished before this one starts",
    )


class WebhookTarget(_Strict):
    """A webhook that receives a task's notices: a JSON POST per notice, signed with
    HMAC-SHA256 when `secret_env` names an environment variable that holds the secret
    (the secret itself never goes into a contract)."""

    webhook: str = Field(min_length=1, max_length=2048)
    secret_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")

    @field_validator("webhook")
    @classmethod
    def _http_url(cls, value: str, info: ValidationInfo) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"must be an http(s) URL, not {_cut(value, 80)}")
        problem = None if _stored(info) else http_url_problem(value)
        if problem:
            raise ValueError(problem)
        return value


#: Where notices go: `log` (warnings in the worker's log) or a webhook.
NotifyTarget = Literal["log"] | WebhookTarget


class NotifyConfig(_Strict):
    """Who is told when the task needs people (besides `TETHER_WEBHOOK_URL`), reminded
    and escalated when (seconds; unset: 6 h, 24 h); `admin`: also told of escalations."""

    targets: list[NotifyTarget] = Field(default_factory=list, max_length=10)
    renotify_after: float | None = Field(default=None, gt=0)
    suspend_after: float | None = Field(default=None, gt=0)
    admin: list[NotifyTarget] = Field(default_factory=list, max_length=10)


class McpServer(_Strict):
    """An MCP server whose tools join the task's registry: a stdio `command` or a `url`,
    with the fields of the MCP clients' configs (`tether.mcp_config`). `prefix`:
    its tools are exposed as `<prefix>__<tool>` (default: its name, characters providers
    refuse turned into `_`; `''`: unprefixed). `restart_attempts`: tries (with backoff) to
    restart it or reopen its session when the connection is lost, before a call fails."""

    name: str = Field(pattern=_ID)
    type: Literal["stdio", "http", "streamable-http", "sse"] | None = None
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    tools: list[str] | None = Field(default=None, description="expose only these tools")
    timeout: float = Field(default=30.0, gt=0)
    prefix: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{0,40}$")
    restart_attempts: int = Field(default=3, ge=0, le=20)

    @model_validator(mode="after")
    def _one_transport(self, info: ValidationInfo) -> McpServer:
        problem = mcp_config.transport_problem(self, stored=_stored(info))
        if problem:
            raise ValueError(problem)
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
    timeout: float | None = Field(
        default=None, gt=0, le=3600, description="seconds one model request may take"
    )
    max_retries: int | None = Field(
        default=None, ge=0, le=10, description="retries of a failed model request"
    )


class ContextConfig(_Strict):
    """How much history a model call may carry."""

    input_budget_tokens: int = Field(default=32_000, ge=1_000)
    preview_chars: int = Field(default=800, ge=100)
    cache_ttl_seconds: float = Field(default=300.0, ge=0)


def _order_problems(items: list[ChecklistItem]) -> list[str]:
    """Unknown or self-referencing `after` ids, and cycles (an item that would wait for
    itself through its predecessors)."""
    ids = [i.id for i in items]
    known = set(ids)
    problems: list[str] = []
    graph: dict[str, list[str]] = {}
    for n, item in enumerate(items):
        for p in item.after:
            if p == item.id:
                problems.append(f"items.{n}.after: item {item.id!r} cannot come after itself")
            elif p not in known:
                problems.append(
                    f"items.{n}.after: {p!r} is not an item id (expected one of {ids[:10]})"
                )
        graph[item.id] = [p for p in item.after if p in known and p != item.id]
    cycle = _find_cycle(graph)
    if cycle:
        problems.append(
            "items: the `after` order has a cycle ("
            + " -> ".join(cycle if len(cycle) <= 8 else [*cycle[:4], "...", *cycle[-3:]])
            + "); no item of it could ever start"
        )
    return problems


def _find_cycle(graph: dict[str, list[str]]) -> list[str] | None:
    """One cycle of `graph` as a path that ends where it starts, or None (iterative: a
    hostile spec may chain thousands of items)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in graph:
        if root in state:
            continue
        path: list[str] = [root]
        stack = [iter(graph[root])]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(graph[nxt]))
    return None


class TaskSpec(_Strict):
    """A task's contract. Build it in Python or load it with `load_spec`."""

    name: str = Field(default="task", min_length=1)
    objective: str = Field(min_length=1)
    instructions: str = ""
    acceptance: list[AcceptanceCriterion] = Field(default_factory=list)
    milestones: list[Milestone] = Field(default_factory=list)
    items: list[ChecklistItem] = Field(min_length=1)
    tools: list[str | ToolPermission] = Field(default_factory=list)
    mcp_servers: list[McpServer] = Field(
        default_factory=list, validation_alias=AliasChoices("mcp_servers", "mcpServers")
    )
    services: dict[str, ServicePolicy] = Field(default_factory=dict)
    budget: Budget = Field(default_factory=Budget)
    limits: Limits = Field(default_factory=Limits)
    models: Models = Field(default_factory=Models)
    #: Prices by model name (or `prefix*`), over `TETHER_PRICES` and the built-in table.
    prices: dict[Annotated[str, Field(min_length=1, max_length=300)], ModelPrice] = Field(
        default_factory=dict
    )
    context: ContextConfig = Field(default_factory=ContextConfig)
    notify: NotifyConfig = Field(default_factory=NotifyConfig)
    on_budget_exhausted: StopPolicy = StopPolicy()  # see `tether.spec_policies`
    on_unanswered: StopPolicy = StopPolicy()
    workspace: str | None = None
    #: Pinned to workers started with one of these `--host-tag`s (`tether.placement`).
    runs_on: list[placement.HostTag] = Field(default_factory=list)
    review: _review.ReviewPolicy = Field(default_factory=_review.ReviewPolicy)
    sources: list[Source] = Field(default_factory=list)
    #: A recurring task: `tether submit` stores the schedule; workers start occurrences.
    schedule: Schedule | None = None

    _mcp_map = field_validator("mcp_servers", mode="before")(mcp_config.servers_from_map)

    _workspace_text = field_validator("workspace", mode="before")(placement.workspace_text)

    @model_validator(mode="before")
    @classmethod
    def _rounds_for_the_checklist(cls, data: Any) -> Any:
        """`limits.max_rounds` left out: `ROUNDS_PER_ITEM` per item, at least the default
        (written into the contract, so the stored task keeps the number it started with)."""
        if not isinstance(data, Mapping):
            return data
        items, limits = data.get("items"), data.get("limits", {})
        if not isinstance(items, list) or not isinstance(limits, Mapping):
            return data  # the field checks say what is wrong
        if "max_rounds" in limits or ROUNDS_PER_ITEM * len(items) <= DEFAULT_MAX_ROUNDS:
            return data
        return {**data, "limits": {**limits, "max_rounds": ROUNDS_PER_ITEM * len(items)}}

    @model_validator(mode="after")
    def _check_references(self) -> TaskSpec:
        problems: list[str] = []
        ms_ids = [m.id for m in self.milestones]
        known_ms = set(ms_ids)
        for what, ids in (
            ("milestones", ms_ids),
            ("items", [i.id for i in self.items]),
            ("acceptance", [a.id for a in self.acceptance]),
            ("sources", [src.id for src in self.sources]),
        ):
            for dup in sorted(i for i, n in Counter(ids).items() if n > 1):
                problems.append(f"{what}: id {dup!r} is used more than once")
        for n, item in enumerate(self.items):
            if item.milestone is not None and item.milestone not in known_ms:
                problems.append(
                    f"items.{n}.milestone: {item.milestone!r} is not a milestone id "
                    f"(expected one of {ms_ids or 'none declared'})"
                )
        problems += _order_problems(self.items)
        if problems:
            raise ValueError(spec_problems.SEP.join(problems))
        return self

    def tool_names(self) -> list[str]:
        """The allowlist, as names."""
        return [t if isinstance(t, str) else t.name for t in self.tools]

    def permission(self, name: str) -> ToolPermission | None:
        """What the contract says about one allowed tool (None if not allowed)."""
        for t in self.tools:
            if (t if isinstance(t, str) else t.name) == name:
                return _bare_permission(t) if isinstance(t, str) else t
        return None

    def source(self, source_id: str) -> Source | None:
        """The declared source with this id, or None (not an allowed source)."""
        return next((src for src in self.sources if src.id == source_id), None)

    def milestone_of(self, item_id: str) -> str | None:
        """The milestone id of an item, or None."""
        for item in self.items:
            if item.id == item_id:
                return item.milestone
        return None


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """The cyclic garbage collector held off while a spec is validated: a checklist of
    ten thousand items makes hundreds of thousands of objects, none of them garbage,
    and the collections they set off were 40% of the time (the spec's size is bounded,
    so the pause is too)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def parse_spec(data: Any, *, source: str = "<spec>", stored: bool = False) -> TaskSpec:
    """Validate a decoded spec (a dict) and return the `TaskSpec`.

    `stored`: the spec of a task already in the database (its decoded JSON). Checks
    added after it was accepted (see `_stored`) are skipped, so a task stored by an
    earlier version stays readable, resumable and editable (an edit validates its new
    spec in full); and equal data is validated once per process (`_PARSED`)."""
    if data is None:
        raise errors.SpecError(
            "the file is empty: a spec needs at least `objective:` and `items:`", source=source
        )
    if not isinstance(data, dict):
        kind = {"str": "a line of text", "list": "a list"}.get(type(data).__name__, "a value")
        raise errors.SpecError(
            f"expected a mapping at the top level (objective:, items:, ...), got {kind}",
            source=source,
        )
    key = _stored_key(data) if stored else None
    parsed = _PARSED.get(key) if key is not None else None
    if parsed is not None:
        # A copy (a few fields' references): each call's source is its own (`source_of`).
        return _from(parsed.model_copy(), source)
    try:
        with _gc_paused():
            spec = TaskSpec.model_validate(data, context={"stored": True} if stored else None)
    except ValidationError as exc:
        problems = spec_problems.problems(exc.errors(), TaskSpec)
        raise errors.SpecError("the spec is not valid", source=source, problems=problems) from None
    except RecursionError:
        raise errors.SpecError(
            f"the spec is nested too deeply (at most {MAX_DEPTH} levels)", source=source
        ) from None
    if key is not None:
        _remember(key, spec)
    return _from(spec, source)


def _from(spec: TaskSpec, source: str) -> TaskSpec:
    """`spec`, remembered as read from `source` (`source_of`) while it lives."""
    _SOURCES[id(spec)] = source
    weakref.finalize(spec, _SOURCES.pop, id(spec), None)
    return spec


#: Where each parsed spec was read from, by object (not a field: two equal contracts
#: are equal wherever they came from).
_SOURCES: dict[int, str] = {}

#: Stored contracts already validated, by the digest of their data (`_stored_key`).
#: A worker reads each task's contract when it claims it and when its run loads it, and
#: a queue's tasks mostly share one: validating it again (milliseconds of pydantic for
#: a checklist of ten items) was a large part of a short task's cost. A stored spec's
#: validation depends on its data alone (no clock, environment or file), and a
#: `TaskSpec` is frozen, so one parsed contract serves every equal one.
_PARSED: dict[bytes, TaskSpec] = {}
#: The most contracts kept (the oldest goes first).
PARSED_KEPT: Final = 64


def _stored_key(data: Any) -> bytes | None:
    """The digest of a stored spec's `repr` (None when too deep to write out): decoded
    JSON, what a store gives, has one text per value, and `repr`, unlike the JSON
    text, also tells a tuple from a list and a number from text as a key."""
    try:
        text = repr(data)
    except RecursionError:
        return None
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def _remember(key: bytes, spec: TaskSpec) -> None:
    with contextlib.suppress(KeyError, RuntimeError, StopIteration):  # another thread's eviction
        while len(_PARSED) >= PARSED_KEPT:
            del _PARSED[next(iter(_PARSED))]
    _PARSED[key] = spec


def source_of(spec: TaskSpec) -> str:
    """Where `spec` was read from (its file's name, `task T`), for its errors; `<spec>`
    for one built in Python."""
    return _SOURCES.get(id(spec), "<spec>")


def load_spec(path: str | Path) -> TaskSpec:
    """Load a YAML (or JSON) spec file; a bad file raises `SpecError` naming file and field.

    Bounded: a file over `MAX_SPEC_BYTES`, nesting deeper than `MAX_DEPTH`, more than
    `MAX_ALIASES` aliases or `MAX_NODES` values is refused before it is expanded."""
    source = str(Path(path))
    spec = parse_spec(load_document(path), source=source)
    if spec.workspace is not None and not re.match(r"^[^\x00]+$", spec.workspace):
        raise errors.SpecError("workspace: not a usable path", source=source)
    return spec


def load_document(path: str | Path) -> Any:
    """A YAML (or JSON) file's data, read with the bounds of `load_spec` (a partial spec
    for `tether edit`, for instance); a bad file raises `SpecError`."""
    p = Path(path)
    source = str(p)
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_SPEC_BYTES + 1)
    except FileNotFoundError:
        raise errors.SpecError("file not found", source=source) from None
    except (OSError, ValueError) as exc:
        raise errors.SpecError(f"cannot read the file ({exc})", source=source) from None
    if len(raw) > MAX_SPEC_BYTES:
        raise errors.SpecError(
            f"the file is larger than {MAX_SPEC_BYTES // 1024} KiB; a spec is a short contract",
            source=source,
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise errors.SpecError(f"cannot read the file ({exc})", source=source) from None
    from tether import spec_yaml  # YAML loads when a file is read, not with the contract

    try:
        data = spec_yaml.read(
            text, max_depth=MAX_DEPTH, max_aliases=MAX_ALIASES, max_nodes=MAX_NODES
        )
    except spec_yaml.YamlProblem as exc:
        raise errors.SpecError(str(exc), source=source) from None
    except RecursionError:
        raise errors.SpecError(
            f"cannot load the YAML: nested deeper than {MAX_DEPTH} levels", source=source
        ) from None
    return data

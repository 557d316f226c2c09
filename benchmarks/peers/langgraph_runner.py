"""The LangGraph side of the peer benchmark.

A `StateGraph` with an `agent` node (the zero-latency fake model: an `AIMessage` with
one `do_step` tool call) and a `tool` node (the side effect, and a 1 KB `ToolMessage`),
looping agent -> tool -> agent N times, then END. The state is the conversation, as
in a LangGraph agent: `messages` with the `add_messages` reducer (every checkpoint
holds the whole list), or, in the `delta-*` configurations, a `DeltaChannel` with
LangGraph's batch messages reducer (checkpoints hold only the new writes; beta in
langgraph 1.2). Checkpointers: `SqliteSaver`, `PostgresSaver`, or none; every
`invoke` passes `durability="sync"` (each step is persisted before the next starts).
A resume after a crash invokes again with the same `thread_id` and `None` input.
"""

# No `from __future__ import annotations` here: LangGraph reads the state's type hints
# at run time, and the state class is local to `_graph`.
import contextlib
import importlib.util
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any, TypedDict

from harness import Probe, Setup, Storage, pg_params, tool_output

SYSTEM = "langgraph"
CONFIGS: dict[str, str | None] = {
    "sqlite": "sqlite",
    "postgres": "postgres",
    "delta-sqlite": "sqlite",
    "delta-postgres": "postgres",
    "none": None,
}
CRASH_CONFIGS = ("sqlite", "postgres")
LABELS = {
    "sqlite": "SqliteSaver, add_messages, durability=sync",
    "postgres": "PostgresSaver, add_messages, durability=sync",
    "delta-sqlite": "SqliteSaver, DeltaChannel messages, durability=sync",
    "delta-postgres": "PostgresSaver, DeltaChannel messages, durability=sync",
    "none": "no checkpointer (in memory)",
}
THREAD = "peers"


def problem(config: str | None = None) -> str | None:
    """Why this system (or one configuration) cannot run here (None: it can)."""
    need = ["langgraph"]
    if config in ("sqlite", "delta-sqlite"):
        need.append("langgraph.checkpoint.sqlite")
    if config in ("postgres", "delta-postgres"):
        need.append("langgraph.checkpoint.postgres")
    for mod in need:
        try:
            found = importlib.util.find_spec(mod) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            return f"{mod} is not installed (pip install -e '.[peers]')"
    if config and config.startswith("delta") and not _has_delta():
        return "this langgraph has no DeltaChannel"
    return None


def _has_delta() -> bool:
    try:
        return importlib.util.find_spec("langgraph.channels.delta") is not None
    except ModuleNotFoundError:
        return False


def versions() -> dict[str, str]:
    """Package versions to print beside the table."""
    out = {}
    for pkg in ("langgraph", "langgraph-checkpoint-sqlite", "langgraph-checkpoint-postgres"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[pkg] = metadata.version(pkg)
    return out


def _db_path(setup: Setup) -> Path:
    return setup.workdir / "langgraph.db"


def storage(setup: Setup) -> Storage | None:
    """Where this configuration keeps its data, with its settings."""
    kind = CONFIGS[setup.config]
    if kind == "sqlite":
        # SqliteSaver switches the file to WAL and leaves synchronous at the default,
        # FULL (what `_open` reads back from its connection).
        return Storage("sqlite", path=_db_path(setup), journal="wal", synchronous="FULL")
    if kind == "postgres":
        return Storage("postgres", url=setup.pg_url, schema=setup.schema)
    return None


def _graph(setup: Setup, probe: Probe) -> Any:
    from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
    from langgraph.graph import END, START, StateGraph
    from langgraph.graph.message import add_messages

    if setup.config.startswith("delta"):
        from langgraph.channels.delta import DeltaChannel
        from langgraph.graph.message import _messages_delta_reducer

        reducer: Any = DeltaChannel(_messages_delta_reducer)
    else:
        reducer = add_messages

    class State(TypedDict):
        messages: Annotated[list[AnyMessage], reducer]
        step: int

    n = setup.n

    def agent(state: State) -> dict[str, Any]:
        t0 = probe.model_start()
        step = state["step"] + 1
        msg = AIMessage(
            content=f"Step {step}.",
            tool_calls=[{"name": "do_step", "args": {"step": step}, "id": f"call-{step}"}],
        )
        probe.model_done(t0)
        return {"messages": [msg]}

    def tool(state: State) -> dict[str, Any]:
        t0 = probe.tool_start()
        call = state["messages"][-1].tool_calls[0]
        step = int(call["args"]["step"])
        setup.effects.append(step)
        setup.after_effect(step)
        msg = ToolMessage(content=tool_output(step), tool_call_id=call["id"])
        probe.tool_done(t0)
        return {"messages": [msg], "step": step}

    g = StateGraph(State)
    g.add_node("agent", agent)
    g.add_node("tool", tool)
    g.add_edge(START, "agent")
    g.add_edge("agent", "tool")
    g.add_conditional_edges("tool", lambda s: "agent" if s["step"] < n else END)
    return g


def _saver(setup: Setup) -> Any:
    """A context manager factory for the checkpointer (imports done here, not in it)."""
    kind = CONFIGS[setup.config]
    if kind == "sqlite":
        from langgraph.checkpoint.sqlite import SqliteSaver

        @contextlib.contextmanager
        def sqlite() -> Iterator[Any]:
            with SqliteSaver.from_conn_string(str(_db_path(setup))) as saver:
                saver.setup()
                sync = saver.conn.execute("PRAGMA synchronous").fetchone()[0]
                assert sync == 2, f"SqliteSaver runs with synchronous={sync}, not FULL"
                yield saver

        return sqlite
    if kind == "postgres":
        from langgraph.checkpoint.postgres import PostgresSaver

        @contextlib.contextmanager
        def postgres() -> Iterator[Any]:
            # The saver's tables go to this block's schema, through the search_path.
            url = pg_params(setup.pg_app_url(), options=f"-c search_path={setup.schema}")
            with PostgresSaver.from_conn_string(url) as saver:
                saver.setup()
                yield saver

        return postgres
    return lambda: contextlib.nullcontext(None)


def run(setup: Setup, probe: Probe, ready: Any) -> dict[str, Any]:
    """Run (or resume) N steps; `ready()` is called once the checkpointer is set up."""
    graph = _graph(setup, probe)
    opener = _saver(setup)
    if setup.resume:  # after the imports, as for the other systems
        setup.resume_called_at = time.perf_counter()
    with opener() as saver:
        app = graph.compile(checkpointer=saver)
        config: dict[str, Any] = {
            "configurable": {"thread_id": THREAD},
            "recursion_limit": 2 * setup.n + 10,  # two supersteps per step
        }
        kwargs: dict[str, Any] = {"durability": "sync"} if saver is not None else {}
        if setup.resume:
            final = app.invoke(None, config, **kwargs)
        else:
            ready()
            first = {"messages": [("user", f"Do {setup.n} steps with do_step.")], "step": 0}
            final = app.invoke(first, config, **kwargs)
        probe.finish()
        return {"status": "done" if final["step"] == setup.n else "incomplete"}

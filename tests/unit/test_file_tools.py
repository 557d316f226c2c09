"""The built-in file tools: confinement to the workspace, atomic writes, validation.

The tools are called the way the engine calls them: arguments checked by the `@tool`
declaration, then the tool's function with a `ToolContext` naming the workspace.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tether import errors
from tether.models.base import ToolSchema
from tether.tools import files, registry
from tether.tools.builtin.files import FILE_TOOLS, default_registry
from tether.tools.builtin.sources import SOURCE_TOOLS
from tether.tools.files import Workspace
from tether.tools.registry import Tool, ToolContext

BY_NAME: dict[str, Tool] = {t.name: t for t in FILE_TOOLS}


async def run_file_tool(ws: Workspace, name: str, args: Mapping[str, Any]) -> str:
    """One file tool call as the engine makes it: checked arguments, then the call."""
    t = BY_NAME[name]
    ctx = ToolContext(
        op_id="t1.r1.c0",
        task_id="t1",
        task_version=1,
        fencing_token=1,
        workspace=ws.root,
        logger=logging.getLogger("test"),
    )
    result = await t.fn(t.check_args(args), ctx)
    assert isinstance(result, str)
    return result


def snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every entry under `folder` (not following symlinks): content or link target."""
    out: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = p.relative_to(folder).as_posix()
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            elif p.is_dir():
                out[rel] = "<dir>"
            else:
                out[rel] = p.read_bytes()
    return out


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[tuple[Workspace, Path, Path]]:
    """A workspace `ws/` with a sibling `outside/` folder holding a secret."""
    root = tmp_path / "ws"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("top secret")
    (root / "hello.txt").write_text("hello world")
    yield Workspace(root), root, outside


async def call(ws: Workspace, name: str, **args: Any) -> str:
    return await run_file_tool(ws, name, args)


# --- confinement -------------------------------------------------------------------------


ESCAPES = [
    "../outside/secret.txt",
    "../outside/new.txt",
    "sub/../../outside/secret.txt",
    "..",
    "../..",
    "./../outside",
]


@pytest.mark.parametrize("path", ESCAPES)
def test_resolve_refuses_dotdot(tree: tuple[Workspace, Path, Path], path: str) -> None:
    ws, _, _ = tree
    with pytest.raises(errors.ToolFailed, match=r"^not permitted: .* is outside the workspace$"):
        ws.resolve(path)


def test_resolve_accepts_absolute_paths_inside_only(tree: tuple[Workspace, Path, Path]) -> None:
    ws, root, outside = tree
    assert ws.resolve(str(root / "hello.txt")) == root.resolve() / "hello.txt"
    assert ws.resolve(str(root.resolve() / "new" / "f.txt")) == root.resolve() / "new/f.txt"
    for path in [str(outside / "secret.txt"), "/etc/passwd", str(root / ".." / "x")]:
        with pytest.raises(errors.ToolFailed, match="not permitted"):
            ws.resolve(path)


def test_resolve_allows_inner_dotdot_and_missing_files(tree: tuple[Workspace, Path, Path]) -> None:
    ws, root, _ = tree
    assert ws.resolve("a/../hello.txt") == root.resolve() / "hello.txt"
    assert ws.resolve("new/deep/file.txt") == root.resolve() / "new/deep/file.txt"
    assert ws.resolve(".") == root.resolve()


def test_resolve_refuses_nul(tree: tuple[Workspace, Path, Path]) -> None:
    ws, _, _ = tree
    with pytest.raises(errors.ToolFailed, match="not permitted"):
        ws.resolve("a\x00b")


def test_root_that_is_a_symlink_works(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    ws = Workspace(tmp_path / "link")
    ws.write_file("a.txt", "x")
    assert (real / "a.txt").read_text() == "x"


@pytest.mark.parametrize("tool", ["read_file", "write_file", "append_file", "list_files"])
@pytest.mark.parametrize(
    "path",
    [*ESCAPES, "/etc/passwd", "OUTSIDE_ABS", "esc_file", "esc_dir/secret.txt", "esc_dir/new.txt"],
)
async def test_no_tool_reaches_outside(
    tree: tuple[Workspace, Path, Path], tool: str, path: str
) -> None:
    ws, root, outside = tree
    (root / "esc_file").symlink_to(outside / "secret.txt")
    (root / "esc_dir").symlink_to(outside, target_is_directory=True)
    if path == "OUTSIDE_ABS":
        path = str(outside / "secret.txt")
    before = snapshot(outside)
    args: dict[str, Any] = {"path": path}
    if tool in ("write_file", "append_file"):
        args["content"] = "PWNED"
    with pytest.raises(errors.ToolFailed, match="not permitted") as info:
        await run_file_tool(ws, tool, args)
    assert "top secret" not in str(info.value)
    assert snapshot(outside) == before


async def test_symlink_final_component_escaping(tree: tuple[Workspace, Path, Path]) -> None:
    ws, root, outside = tree
    (root / "link.txt").symlink_to(outside / "secret.txt")
    before = snapshot(outside)
    for tool in ("read_file", "write_file", "append_file"):
        args: dict[str, Any] = {"path": "link.txt"}
        if tool != "read_file":
            args["content"] = "x"
        with pytest.raises(errors.ToolFailed, match=r"not permitted: link\.txt is outside"):
            await run_file_tool(ws, tool, args)
    assert snapshot(outside) == before
    assert (root / "link.txt").is_symlink()


async def test_dangling_symlink_to_outside_is_not_created(
    tree: tuple[Workspace, Path, Path],
) -> None:
    # A link to a file that does not exist yet: writing through it would create it
    # outside the workspace.
    ws, root, outside = tree
    (root / "dangling").symlink_to(outside / "not-yet.txt")
    with pytest.raises(errors.ToolFailed, match="not permitted"):
        await call(ws, "write_file", path="dangling", content="x")
    assert not (outside / "not-yet.txt").exists()


async def test_symlinked_parent_folder_escaping(tree: tuple[Workspace, Path, Path]) -> None:
    ws, root, outside = tree
    (root / "sub").mkdir()
    (root / "sub" / "out").symlink_to(outside, target_is_directory=True)
    before = snapshot(outside)
    for path in ["sub/out/secret.txt", "sub/out/new.txt", "sub/out/deeper/new.txt", "sub/out"]:
        for tool in ("write_file", "append_file", "read_file", "list_files"):
            args: dict[str, Any] = {"path": path}
            if tool in ("write_file", "append_file"):
                args["content"] = "x"
            with pytest.raises(errors.ToolFailed, match="not permitted"):
                await run_file_tool(ws, tool, args)
            assert snapshot(outside) == before


async def test_symlink_chain_escaping(tree: tuple[Workspace, Path, Path]) -> None:
    # inside -> inside -> outside: only the end of the chain counts.
    ws, root, outside = tree
    (root / "b").symlink_to(outside, target_is_directory=True)
    (root / "a").symlink_to(root / "b", target_is_directory=True)
    with pytest.raises(errors.ToolFailed, match="not permitted"):
        await call(ws, "write_file", path="a/new.txt", content="x")
    assert not (outside / "new.txt").exists()


async def test_relative_symlink_escaping(tree: tuple[Workspace, Path, Path]) -> None:
    ws, root, outside = tree
    (root / "rel").symlink_to(Path("..") / "outside")
    with pytest.raises(errors.ToolFailed, match="not permitted"):
        await call(ws, "read_file", path="rel/secret.txt")
    with pytest.raises(errors.ToolFailed, match="not permitted"):
        await call(ws, "write_file", path="rel/secret.txt", content="x")
    assert (outside / "secret.txt").read_text() == "top secret"


async def test_symlink_loop(tree: tuple[Workspace, Path, Path]) -> None:
    ws, root, outside = tree
    (root / "loop1").symlink_to(root / "loop2")
    (root / "loop2").symlink_to(root / "loop1")
    (root / "self").symlink_to("self")
    before_out = snapshot(outside)
    for path in ["loop1", "loop2/x.txt", "self", "self/a/b"]:
        for tool in ("read_file", "write_file", "append_file", "list_files"):
            args: dict[str, Any] = {"path": path}
            if tool in ("write_file", "append_file"):
                args["content"] = "x"
            with pytest.raises(errors.ToolFailed, match="not permitted"):
                await run_file_tool(ws, tool, args)
    assert snapshot(outside) == before_out
    assert (root / "loop1").is_symlink() and (root / "self").is_symlink()


async def test_symlink_inside_workspace_is_followed(tree: tuple[Workspace, Path, Path]) -> None:
    ws, root, _ = tree
    (root / "docs").mkdir()
    (root / "docs" / "a.txt").write_text("A")
    (root / "alias").symlink_to(root / "docs", target_is_directory=True)
    (root / "alias.txt").symlink_to("docs/a.txt")
    assert await call(ws, "read_file", path="alias/a.txt") == "A"
    assert await call(ws, "read_file", path="alias.txt") == "A"
    await call(ws, "write_file", path="alias.txt", content="B")
    assert (root / "docs" / "a.txt").read_text() == "B"
    assert (root / "alias.txt").is_symlink()


# --- behaviour ---------------------------------------------------------------------------


async def test_write_creates_parents_and_reads_back(tree: tuple[Workspace, Path, Path]) -> None:
    ws, root, _ = tree
    out = await call(ws, "write_file", path="a/b/c.txt", content="héllo\nwörld\r\n")
    assert out == "created a/b/c.txt with 13 characters"
    assert (root / "a/b/c.txt").read_bytes() == "héllo\nwörld\r\n".encode()
    assert await call(ws, "read_file", path="a/b/c.txt") == "héllo\nwörld\r\n"


async def test_write_replaces_and_leaves_no_temp_files(tree: tuple[Workspace, Path, Path]) -> None:
    ws, root, _ = tree
    for n in range(5):
        await call(ws, "write_file", path="f.txt", content=f"version {n}")
    assert (root / "f.txt").read_text() == "version 4"
    assert sorted(p.name for p in root.iterdir()) == ["f.txt", "hello.txt"]


async def test_outputs_say_whether_the_file_was_created(
    tree: tuple[Workspace, Path, Path],
) -> None:
    ws, root, _ = tree
    made = await call(ws, "write_file", path="new.txt", content="one")
    again = await call(ws, "write_file", path="./new.txt", content="two")
    old = await call(ws, "write_file", path="hello.txt", content="bye")
    appended = await call(ws, "append_file", path="hello.txt", content="!")
    assert made == "created new.txt with 3 characters"
    assert again == "wrote 3 characters to new.txt (replacing its previous content)"
    assert files.says_created(made)
    assert not any(files.says_created(o) for o in (again, old, appended))
    assert (root / "hello.txt").read_text() == "bye!"


def test_existing_file(tree: tuple[Workspace, Path, Path]) -> None:
    ws, root, outside = tree
    (root / "dir").mkdir()
    (root / "link.txt").symlink_to("hello.txt")
    (root / "out.txt").symlink_to(outside / "secret.txt")
    real = root.resolve() / "hello.txt"
    assert ws.existing_file("hello.txt") == real
    assert ws.existing_file("./dir/../hello.txt") == real
    assert ws.existing_file("link.txt") == real  # the file a symlink names
    for path in ["missing.txt", "dir", ".", "../outside/secret.txt", "out.txt", "/etc/hosts"]:
        assert ws.existing_file(path) is None, path


async def test_write_is_atomic_when_replace_fails(
    tree: tuple[Workspace, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    ws, root, _ = tree
    (root / "f.txt").write_text("old content")

    def boom(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(errors.ToolFailed, match="No space left on device"):
        await call(ws, "write_file", path="f.txt", content="new content")
    with pytest.raises(errors.ToolFailed):
        await call(ws, "append_file", path="f.txt", content="more")
    assert (root / "f.txt").read_text() == "old content"
    assert sorted(p.name for p in root.iterdir()) == ["f.txt", "hello.txt"]


async def test_write_goes_through_a_temp_file_in_the_same_folder(
    tree: tuple[Workspace, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    ws, root, _ = tree
    seen: list[tuple[str, str]] = []
    real_replace = os.replace

    def spy(src: Any, dst: Any) -> None:
        seen.append((os.fspath(src), os.fspath(dst)))
        # The target is untouched until the rename.
        assert not Path(dst).exists() or Path(dst).read_text() == "old"
        real_replace(src, dst)

    (root / "d").mkdir()
    (root / "d" / "f.txt").write_text("old")
    monkeypatch.setattr(os, "replace", spy)
    await call(ws, "write_file", path="d/f.txt", content="new")
    [(src, dst)] = seen
    assert Path(src).parent == Path(dst).parent == root.resolve() / "d"
    assert (root / "d" / "f.txt").read_text() == "new"


async def test_write_to_folder_or_root_fails(tree: tuple[Workspace, Path, Path]) -> None:
    ws, root, _ = tree
    (root / "dir").mkdir()
    for path in ["dir", ".", "dir/.."]:
        with pytest.raises(errors.ToolFailed, match="is a folder"):
            await call(ws, "write_file", path=path, content="x")
    assert (root / "dir").is_dir()


async def test_write_under_a_file_fails_cleanly(tree: tuple[Workspace, Path, Path]) -> None:
    ws, _, _ = tree
    with pytest.raises(errors.ToolFailed, match=r"hello\.txt/x\.txt"):
        await call(ws, "write_file", path="hello.txt/x.txt", content="x")


async def test_append(tree: tuple[Workspace, Path, Path]) -> None:
    ws, root, _ = tree
    out = await call(ws, "append_file", path="log/notes.md", content="one\n")
    assert out == "created log/notes.md with 4 characters"
    out = await call(ws, "append_file", path="log/notes.md", content="two\n")
    assert out == "appended 4 characters to log/notes.md (now 8 characters)"
    await call(ws, "append_file", path="hello.txt", content="!")
    assert (root / "log/notes.md").read_text() == "one\ntwo\n"
    assert (root / "hello.txt").read_text() == "hello world!"
    assert sorted(p.name for p in (root / "log").iterdir()) == ["notes.md"]


async def test_append_refuses_binary(tree: tuple[Workspace, Path, Path]) -> None:
    ws, root, _ = tree
    (root / "bin").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(errors.ToolFailed, match="not UTF-8"):
        await call(ws, "append_file", path="bin", content="x")
    assert (root / "bin").read_bytes() == b"\xff\xfe\x00"


async def test_list(tree: tuple[Workspace, Path, Path]) -> None:
    ws, root, outside = tree
    (root / "b_dir").mkdir()
    (root / "b_dir" / "inner.txt").write_text("12345")
    (root / "a.txt").write_text("")
    (root / "z_link").symlink_to(outside, target_is_directory=True)
    assert await call(ws, "list_files") == "\n".join(
        ["a.txt (0 bytes)", "b_dir/", "hello.txt (11 bytes)", "z_link@"]
    )
    assert await call(ws, "list_files", path="b_dir") == "inner.txt (5 bytes)"
    (root / "empty").mkdir()
    assert await call(ws, "list_files", path="empty") == "empty: empty folder"
    with pytest.raises(errors.ToolFailed, match="no such folder: nope"):
        await call(ws, "list_files", path="nope")
    with pytest.raises(errors.ToolFailed, match=r"not a folder: hello\.txt"):
        await call(ws, "list_files", path="hello.txt")


async def test_read_missing_and_folder(tree: tuple[Workspace, Path, Path]) -> None:
    ws, root, _ = tree
    (root / "dir").mkdir()
    with pytest.raises(errors.ToolFailed, match=r"no such file: nope\.txt"):
        await call(ws, "read_file", path="nope.txt")
    with pytest.raises(errors.ToolFailed, match="dir is a folder"):
        await call(ws, "read_file", path="dir")


async def test_read_large_file_in_chunks(tree: tuple[Workspace, Path, Path]) -> None:
    ws, root, _ = tree
    text = "".join(f"{n:05d}\n" for n in range(10_000))  # 60,000 characters
    (root / "big.txt").write_text(text)
    first = await call(ws, "read_file", path="big.txt")
    body, note = first[: files.DEFAULT_READ_LIMIT], first[files.DEFAULT_READ_LIMIT :]
    assert body == text[:20_000]
    assert "40000 more characters of 60000" in note
    assert "offset=20000" in note

    got = ""
    offset = 0
    while True:
        out = await call(ws, "read_file", path="big.txt", offset=offset, limit=7_000)
        chunk = out.split("\n[... ", 1)[0] if offset + 7_000 < len(text) else out
        got += chunk
        assert len(chunk) <= 7_000
        offset += len(chunk)
        if offset >= len(text):
            assert "more characters" not in out
            break
    assert got == text
    past = await call(ws, "read_file", path="big.txt", offset=70_000)
    assert "past the end" in past and "60000 characters" in past


async def test_read_exact_size_has_no_note(tree: tuple[Workspace, Path, Path]) -> None:
    ws, _, _ = tree
    assert await call(ws, "read_file", path="hello.txt", limit=11) == "hello world"
    assert await call(ws, "read_file", path="hello.txt", offset=6) == "world"
    out = await call(ws, "read_file", path="hello.txt", limit=5)
    assert out.startswith("hello\n[... 6 more characters of 11")


# --- arguments and schemas ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "args", "expected"),
    [
        ("read_file", {}, r"bad arguments for read_file: path: required argument is missing"),
        ("read_file", {"path": 3}, r"path: Input should be a valid string \(got 3\)"),
        ("read_file", {"path": "a", "limit": "10"}, r"limit: Input should be a valid integer"),
        ("read_file", {"path": "a", "limit": 0}, r"limit: .*greater than or equal to 1"),
        ("read_file", {"path": "a", "offset": -1}, r"offset: .*greater than or equal to 0"),
        ("read_file", {"path": "a", "limit": 10**9}, r"limit: .*less than or equal to"),
        ("read_file", {"path": "a", "mode": "rb"}, r"mode: unknown argument"),
        ("write_file", {"path": "a"}, r"content: required argument is missing"),
        ("write_file", {"path": "a", "content": None}, r"content: Input should be a valid string"),
        ("write_file", {"path": "a", "content": "x", "force": True}, r"force: unknown argument"),
        ("append_file", {"content": "x"}, r"path: required argument is missing"),
        ("list_files", {"path": ["a"]}, r"path: Input should be a valid string"),
        ("list_files", {"recursive": True}, r"recursive: unknown argument"),
        # An empty path names the workspace folder itself.
        ("read_file", {"path": ""}, r"\. is a folder \(use list_files"),
        ("write_file", {"path": "", "content": "x"}, r"\. is a folder, not a file"),
    ],
)
async def test_argument_validation(
    tree: tuple[Workspace, Path, Path], name: str, args: dict[str, Any], expected: str
) -> None:
    ws, root, _ = tree
    before = snapshot(root)
    with pytest.raises(errors.ToolFailed, match=expected) as info:
        await run_file_tool(ws, name, args)
    assert "Traceback" not in str(info.value)
    assert "pydantic" not in str(info.value)
    assert snapshot(root) == before


def test_the_file_tools_are_declared_with_the_public_tool_decorator() -> None:
    # The same declaration a user would write gives the same tool (the hook aside).
    def write_file(ctx: ToolContext, path: str, content: str) -> str:
        return ""

    mine = registry.tool(effect="write", idempotent=True)(write_file)
    builtin = BY_NAME["write_file"]
    assert builtin.args_model is not None  # its arguments are checked like any tool's
    assert set(mine.parameters["properties"]) == set(builtin.parameters["properties"])
    assert (mine.effect, mine.idempotent, mine.timeout, mine.retry) == (
        builtin.effect,
        builtin.idempotent,
        builtin.timeout,
        builtin.retry,
    )


#: What the model has always been shown: the `@tool` declarations must keep it.
_PATH = {"type": "string", "description": "path relative to the workspace folder"}
EXPECTED_SCHEMAS = (
    ToolSchema(
        "list_files",
        "List the files and folders in a workspace folder (folders end in /).",
        {
            "type": "object",
            "properties": {"path": {**_PATH, "default": "."}},
            "required": [],
            "additionalProperties": False,
        },
    ),
    ToolSchema(
        "read_file",
        "Read a text file from the workspace: at most `limit` characters (default 20000) "
        "from character `offset`; says how many remain.",
        {
            "type": "object",
            "properties": {
                "path": _PATH,
                "offset": {"type": "integer", "minimum": 0, "default": 0},
                "limit": {"type": "integer", "minimum": 1, "maximum": 200000, "default": 20000},
            },
            "required": ["path"],
            "additionalProperties": False,
        },
    ),
    ToolSchema(
        "write_file",
        "Create or replace a text file in the workspace (folders are created).",
        {
            "type": "object",
            "properties": {"path": _PATH, "content": {"type": "string"}},
            "required": ["path", "content"],
            "additionalProperties": False,
        },
    ),
    ToolSchema(
        "append_file",
        "Append text to a file in the workspace (created if it does not exist).",
        {
            "type": "object",
            "properties": {"path": _PATH, "content": {"type": "string"}},
            "required": ["path", "content"],
            "additionalProperties": False,
        },
    ),
)


def test_schemas_and_effects_match_the_tools() -> None:
    assert [t.schema() for t in FILE_TOOLS] == list(EXPECTED_SCHEMAS)
    assert {t.name: (t.effect, t.idempotent, t.service) for t in FILE_TOOLS} == {
        "list_files": ("read", True, None),
        "read_file": ("read", True, None),
        "write_file": ("write", True, None),
        "append_file": ("write", False, None),
    }
    # Writers refine their effect per call (`overwrite` for a file the task did not make).
    assert [t.name for t in FILE_TOOLS if t.effect_of is not None] == [
        "write_file",
        "append_file",
    ]
    registry = default_registry(lambda: None)  # type: ignore[arg-type,return-value]
    assert registry.names() == sorted([*BY_NAME, "read_artifact", "ledger_items", *SOURCE_TOOLS])
    assert registry.get("delete_file") is None
    # What the built-in reads show only the task changes (its workspace, its records):
    # none is volatile, so the same answer again is no progress, never waiting.
    assert [t.name for t in (registry.get(n) for n in registry.names()) if t and t.volatile] == []


def test_a_read_is_volatile_unless_it_says_otherwise() -> None:
    @registry.tool(effect="read")
    def status() -> str:
        return "running"

    @registry.tool(effect="read", volatile=False)
    def local() -> str:
        return "same"

    @registry.tool(effect="write", idempotent=True)
    def put() -> str:
        return "ok"

    assert status.volatile and not local.volatile and not put.volatile
    # A tool with effects is volatile only when it says so (a shell of status checks).
    shell = registry.tool(lambda: "x", name="shell", effect="write", volatile=True)
    assert shell.volatile and shell.effect == "write"


async def test_defaults_apply(tree: tuple[Workspace, Path, Path]) -> None:
    ws, _, _ = tree
    assert "hello.txt" in await run_file_tool(ws, "list_files", {})
    assert await run_file_tool(ws, "read_file", {"path": "hello.txt"}) == "hello world"


@pytest.mark.parametrize("block", [1, 3, 7, 64])
def test_read_streams_across_blocks(
    tree: tuple[Workspace, Path, Path], monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    ws, root, _ = tree
    text = "".join(chr(0x61 + n % 26) + ("é" if n % 5 == 0 else "") for n in range(50))
    (root / "t.txt").write_text(text, encoding="utf-8")
    monkeypatch.setattr(files, "_READ_BLOCK", block)
    for offset in [0, 1, 6, 7, 30, len(text) - 1, len(text)]:
        for limit in [1, 5, 7, 20, 1000]:
            out = ws.read_file("t.txt", offset, limit)
            want = text[offset : offset + limit]
            assert out.split("\n[... ", 1)[0] == want
            left = len(text) - offset - len(want)
            assert (f"[... {left} more characters" in out) == (left > 0)

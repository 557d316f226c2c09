"""Fast checks of every fenced block of README.md and docs/*.md, without running them.

`.ci/doc-tests` runs the pages (tests/docs/doc_blocks.py); these tests catch what can
be seen without running: a block of an unknown kind or with a bad marker, a skip with no
reason or one the reader is not told about, YAML or JSON that does not parse, a contract
that tether would refuse, a `tether` command or option the CLI does not have, a
`tether.NAME` that does not exist, an install hint spelled another way, and an event
type or task state the operations page leaves out. And the runner itself: it follows a
page, carries the folder and the exports, and fails when a block or a shown output does
not hold.
"""

from __future__ import annotations

import ast
import importlib
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from tether import events, lifecycle
from tether.cli import app
from tether.models.registry import load_script
from tether.spec import TaskSpec, parse_spec

from .doc_blocks import ROOT, Block, BlockFailed, pages, parse_page, run_page

PAGES = pages()
BLOCKS = [b for page in PAGES for b in parse_page(page)]
#: Skipped blocks stay few: raise this only with a reason the reader is told.
MAX_SKIPS = 8


def ids(blocks: list[Block]) -> list[str]:
    return [b.where for b in blocks]


def of(*langs: str) -> list[Block]:
    return [b for b in BLOCKS if b.lang in langs]


@pytest.mark.parametrize("block", BLOCKS, ids=ids(BLOCKS))
def test_every_block_is_of_a_known_kind_with_good_markers(block: Block) -> None:
    assert not block.problems, f"{block.where}: {block.problems}"
    if block.lang in ("bash", "sh", "shell"):
        assert block.runs or block.skip, f"{block.where}: a shell block either runs or says why not"


def test_the_docs_run_blocks_and_skip_few() -> None:
    runs = [b for b in BLOCKS if b.runs]
    skips = [b for b in BLOCKS if b.skip]
    assert len(runs) >= 20, [b.where for b in runs]
    assert len(skips) <= MAX_SKIPS, [f"{b.where}: {b.skip}" for b in skips]


@pytest.mark.parametrize(
    "block", [b for b in BLOCKS if b.skip], ids=ids([b for b in BLOCKS if b.skip])
)
def test_a_skip_has_a_reason_the_reader_sees(block: Block) -> None:
    """The marker is an HTML comment, invisible on GitHub: the text just before the
    block must tell the reader that the doc tests do not run it."""
    assert block.skip and len(block.skip) >= 10, f"{block.where}: say why it is skipped"
    lines = block.page.read_text(encoding="utf-8").splitlines()[: block.line - 1]
    visible: list[str] = []
    for line in reversed(lines):
        if line.startswith("```") or line.startswith("#"):
            break
        if not line.strip().startswith("<!--"):
            visible.insert(0, line)
    paragraph = " ".join(visible)
    assert "doc tests" in paragraph, (
        f"{block.where}: the paragraph before a skipped block must say the doc tests skip it "
        f"(and why): {paragraph[-300:]!r}"
    )


@pytest.mark.parametrize("block", of("json"), ids=ids(of("json")))
def test_json_blocks_parse(block: Block) -> None:
    import json

    json.loads(block.text)


def _contract(data: dict[str, Any]) -> TaskSpec:
    """A YAML block of contract fields, completed to a whole contract where it is a part."""
    whole = {"objective": "The doc's example", "items": [{"id": "a", "title": "A"}], **data}
    return parse_spec(whole)


@pytest.mark.parametrize("block", of("yaml"), ids=ids(of("yaml")))
def test_yaml_blocks_parse_and_contracts_are_valid(block: Block, tmp_path: Path) -> None:
    data = yaml.safe_load(block.text)
    if isinstance(data, list):  # a script of answers for `--model scripted:FILE`
        path = tmp_path / "answers.yaml"
        path.write_text(block.text, encoding="utf-8")
        assert load_script(path)
        return
    assert isinstance(data, dict), f"{block.where}: a YAML block is a mapping or a list"
    fields = set(TaskSpec.model_fields)
    unknown = set(data) - fields
    assert not unknown, f"{block.where}: not contract fields: {sorted(unknown)}"
    _contract(data)


def _names(tree: ast.AST) -> set[str]:
    """Every `tether.a.b` attribute chain and `from tether.x import y` of a program."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain: list[str] = []
            cur: ast.AST = node
            while isinstance(cur, ast.Attribute):
                chain.insert(0, cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name) and cur.id == "tether":
                found.add(".".join(["tether", *chain]))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tether"):
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def _resolves(dotted: str) -> bool:
    """The longest importable module of the chain, then attributes of it."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


@pytest.mark.parametrize("block", of("python", "py"), ids=ids(of("python", "py")))
def test_python_blocks_parse_and_their_tether_names_exist(block: Block) -> None:
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT | ast.PyCF_ONLY_AST
    tree = compile(block.text, block.where, "exec", flags=flags, dont_inherit=True)
    missing = sorted(n for n in _names(tree) if not _resolves(n))
    assert not missing, f"{block.where}: no such name in tether: {missing}"


CODE_SPAN = re.compile(r"`(tether [^`]+)`")


def _cli_lines() -> list[tuple[str, str]]:
    """Every `tether ...` command of a shell block (skipped ones too) or an inline code
    span of the prose, with where it is."""
    out: list[tuple[str, str]] = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for n, line in enumerate(text.splitlines(), 1):
            for span in CODE_SPAN.findall(line):
                out.append((f"{page.name}:{n}", span))
    for block in of("bash", "sh", "shell"):
        for line in block.text.splitlines():
            code = line.split(" #", 1)[0]
            for part in re.split(r"&&|\|\||;|\|", code):
                words = part.split()
                while words and "=" in words[0] and not words[0].startswith("-"):
                    words.pop(0)  # VAR=value before the command
                if words and words[0] == "tether":
                    out.append((block.where, " ".join(words)))
    return out


CLI = typer.main.get_command(app)
ROOT_OPTIONS = {o for p in CLI.params for o in p.opts}


@pytest.mark.parametrize(("where", "line"), _cli_lines(), ids=[w for w, _ in _cli_lines()])
def test_documented_commands_and_options_exist(where: str, line: str) -> None:
    try:
        words = shlex.split(line)
    except ValueError:  # an unbalanced quote in a prose span: the words up to it
        words = line.split()
    words = words[1:]
    if words and words[0].startswith("-"):
        assert words[0] in ROOT_OPTIONS, f"{where}: `tether {words[0]}` is not an option"
        return
    if not words or not re.fullmatch(r"[a-z]+", words[0]):
        return  # `tether TASK`-like prose, or a placeholder
    commands = CLI.commands  # type: ignore[attr-defined]
    assert words[0] in commands, f"{where}: `tether {words[0]}` is not a command"
    command, name = commands[words[0]], words[0]
    sub = getattr(command, "commands", None)  # a group: `tether schedule list ...`
    if sub is not None and len(words) > 1 and not words[1].startswith("-"):
        assert words[1] in sub, f"{where}: `tether {name} {words[1]}` is not a command"
        command, name, words = sub[words[1]], f"{name} {words[1]}", words[1:]
    options = {o for p in command.params for o in p.opts} | {"--help"}
    for word in words[1:]:
        if word.startswith("--") and word != "--":
            flag = word.split("=", 1)[0]
            assert flag in options, f"{where}: `tether {name}` has no option {flag}"


INSTALL = re.compile(r"pip install[^`\n]*")
ALLOWED_INSTALLS = (
    re.compile(r"pip install '(tether\[[a-z,]+\])'"),
    re.compile(r"pip install -e '\.\[[a-z,]+\]'"),
    re.compile(r"pip install mcp-server-time"),
    re.compile(r"pip install tether\b"),
    re.compile(r"pip install\s+--group dev"),
    re.compile(r"pip install$"),  # a hint wrapped over two lines of prose
)


def test_install_hints_are_spelled_one_way() -> None:
    """`pip install 'tether[web]'` everywhere; `pip install -e '.[web]'` (the same from
    a checkout) only in the README, which says how one reads as the other."""
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        assert '"tether[' not in text, f"{page.name}: spell it pip install 'tether[...]'"
        for hint in INSTALL.findall(text):
            hint = hint.strip()
            assert any(p.match(hint) for p in ALLOWED_INSTALLS), f"{page.name}: {hint!r}"
            if hint.startswith("pip install -e"):
                assert page.name == "README.md" and page.parent == ROOT, (page, hint)


def test_every_extra_a_page_names_exists() -> None:
    import tomllib

    extras = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    )
    for page in PAGES:
        for named in re.findall(r"tether\[([a-z,]+)\]", page.read_text(encoding="utf-8")):
            assert set(named.split(",")) <= extras, f"{page.name}: tether[{named}]"


def _operations() -> str:
    return (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")


def test_every_event_type_is_in_the_operations_table() -> None:
    text = _operations()
    registered = re.findall(
        r'_register\("([a-z_.]+)"\)', Path(events.__file__).read_text(encoding="utf-8")
    )
    assert registered
    missing = [t for t in registered if f"`{t}`" not in text]
    assert not missing, f"docs/operations.md does not describe {missing}"


def test_every_task_state_is_in_the_states_table() -> None:
    text = _operations()
    table = text[text.index("## Task states") : text.index("## Waiting")]
    rows = set(re.findall(r"^\| `([a-z]+)` \|", table, re.M))
    assert rows == set(lifecycle.STATUSES), sorted(rows ^ set(lifecycle.STATUSES))


def test_the_docs_say_where_the_database_lives() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "`.tether/tether.db` in the folder you run `tether` from" in readme
    assert "the folder you run `tether` from, not" in _operations()


# ---------------------------------------------------------------------------------------
# The runner


def _page(tmp_path: Path, text: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(text, encoding="utf-8")
    return page


VENV = Path(sys.prefix)


def test_the_runner_carries_the_folder_and_the_exports(tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        "```bash\nmkdir -p /tmp/here && cd /tmp/here\nexport GREETING=hello\n```\n\n"
        "<!-- doc-test: file hi.py -->\n"
        "```python\nimport os\nprint(os.environ['GREETING'])\n```\n\n"
        "```bash\npwd\npython hi.py\n```\n\n"
        "<!-- doc-test: output -->\n```text\n.../tmp/here\nhello\n```\n\n"
        "<!-- doc-test: skip — a block a reader cannot run here -->\n```bash\nexit 1\n```\n\n"
        "<!-- doc-test: exit 3 -->\n```bash\nexit 3\n```\n",
    )
    run_page(page, VENV, ROOT, tmp_path / "scratch")
    assert (tmp_path / "scratch" / "tmp" / "here" / "hi.py").is_file()


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("```bash\nfalse\necho never\n```\n", "exit 1, the page expects 0"),
        ("```python\nraise SystemExit(2)\n```\n", "exit 2, the page expects 0"),
        ("```bash\necho hello\n```\n<!-- doc-test: output -->\n```\ngoodbye\n```\n", "lacks"),
        ("<!-- doc-test: skip -->\n```bash\ntrue\n```\n", "without a reason"),
        ("<!-- doc-test: runs fine -->\n```bash\ntrue\n```\n", "unknown doc-test directive"),
    ],
)
def test_the_runner_fails_when_the_page_is_wrong(tmp_path: Path, text: str, why: str) -> None:
    with pytest.raises(BlockFailed, match=why):
        run_page(_page(tmp_path, text), VENV, ROOT, tmp_path / "scratch")


# ---------------------------------------------------------------------------------------
# Stated outputs that belong to another page's program

CAPTURE = """
import asyncio
import tether

_stores = []
_open_store = tether.open_store


async def _capture(*args, **kwargs):
    store = await _open_store(*args, **kwargs)
    _stores.append(store)
    return store


tether.open_store = _capture
"""

DUMP = """

async def _dump():
    (store,) = _stores
    (task,) = await store.list_tasks()
    for e in await store.read_events(task.task_id):
        print("EVENT", e.seq, e.type, e.data.get("step", ""))


asyncio.run(_dump())
"""


def test_the_events_operations_lists_are_what_the_complete_example_writes(
    tmp_path: Path,
) -> None:
    """docs/operations.md lists the events of the complete example of writing-tools.md,
    one line each: the example, run, writes exactly those, in that order."""
    import subprocess

    (example,) = [
        b
        for b in parse_page(ROOT / "docs" / "writing-tools.md")
        if b.lang == "python" and "def send_invoice" in b.text
    ]
    (listing,) = [
        b
        for b in parse_page(ROOT / "docs" / "operations.md")
        if b.lang == "" and re.match(r"\s*1 task\.created", b.text)
    ]
    shown: list[tuple[int, str]] = []
    for line in listing.text.splitlines():
        m = re.match(r"\s*(\d+) ([a-z_.]+)\s*(.*)", line)
        assert m, f"{listing.where}: {line!r}"
        shown.append((int(m[1]), m[2]))
        # `24 recovery.step  version   (25 artifacts, 26 ops)`: one line, three events
        inner = m[3].split("(", 1)[1] if m[2] == "recovery.step" and "(" in m[3] else ""
        shown += [(int(n), m[2]) for n in re.findall(r"(\d+) [a-z]+", inner)]
    script = tmp_path / "example.py"
    script.write_text(CAPTURE + example.text + DUMP, encoding="utf-8")
    res = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stdout + res.stderr
    written = [
        (int(seq), kind)
        for _tag, seq, kind, *_step in (
            ln.split() for ln in res.stdout.splitlines() if ln.startswith("EVENT ")
        )
    ]
    assert sorted(shown) == written, f"{listing.where} lists\n{sorted(shown)}\n{res.stdout}"


def test_every_fail_point_is_in_the_operations_table() -> None:
    from tether import failpoints

    text = _operations()
    table = text[text.index("## Fail points") : text.index("## Environment variables")]
    rows = set(re.findall(r"^\| `([a-z_]+)` \|", table, re.M))
    assert rows == set(failpoints.KNOWN), sorted(rows ^ set(failpoints.KNOWN))

"""A command that needs an extra says so in one line, with the install command spelled
one way (`pip install 'tether[web]'`), exit 2 and no traceback; every import of an
optional package goes through that one helper (`tether._extras.needs`), so the core
install runs everything else."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tether import errors
from tether._extras import EXTRAS, MissingExtra, install_hint, needs

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "tether"

#: Modules that are themselves the optional part: only `needs` blocks import them.
OPTIONAL_MODULES = (
    "tether.web",
    "tether.metrics",
    "tether.models.openai",
    "tether.models.anthropic",
)
#: Optional packages tether imports; what the core install does not have.
OPTIONAL_PACKAGES = frozenset().union(*EXTRAS.values())
DONE = "scripted:tests.e2e.policies:done_policy"


def test_the_hint_is_spelled_one_way() -> None:
    assert install_hint("web") == "pip install 'tether[web]'"
    with pytest.raises(ValueError, match="no extra named 'dev'"):
        install_hint("dev")


def test_the_extras_are_the_published_ones() -> None:
    published = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert set(published) == set(EXTRAS)


def test_a_missing_module_is_one_line_with_the_command() -> None:
    with pytest.raises(MissingExtra) as info, needs("web", "tether serve"):
        raise ModuleNotFoundError("No module named 'fastapi'", name="fastapi")
    assert str(info.value) == (
        "tether serve needs the web extra (fastapi is not installed): pip install 'tether[web]'"
    )
    assert isinstance(info.value, errors.UserError) and info.value.exit_code == 2
    assert info.value.__suppress_context__  # no chained traceback to print


def test_a_too_old_package_says_so() -> None:
    with pytest.raises(MissingExtra) as info, needs("mcp", "a contract with mcp_servers"):
        raise ImportError("cannot import name 'Client' from 'mcp.client'", name="mcp.client")
    assert "(mcp is installed but not in the version tether needs)" in str(info.value)
    assert str(info.value).endswith(": pip install 'tether[mcp]'")


def test_other_import_errors_are_not_hidden() -> None:
    # A bug (or a package outside the extra) is not reported as a missing extra.
    with pytest.raises(ModuleNotFoundError), needs("web", "tether serve"):
        raise ModuleNotFoundError("No module named 'tether.nope'", name="tether.nope")
    with pytest.raises(ValueError, match="no extra named"), needs("webb", "x"):
        pass


def _guarded_lines(tree: ast.Module) -> set[int]:
    """Lines inside a `with needs(...)` block."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.With) and any(
            isinstance(item.context_expr, ast.Call)
            and getattr(item.context_expr.func, "id", None) == "needs"
            for item in node.items
        ):
            for child in node.body:
                for sub in ast.walk(child):
                    if hasattr(sub, "lineno"):
                        lines.add(sub.lineno)
    return lines


def _imports(tree: ast.Module) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
    return found


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def test_every_optional_import_goes_through_needs() -> None:
    """Outside the optional modules themselves, an optional package or module is
    imported only inside `with needs(...)` (or for type checking), or again in a module
    that imported it so first (psycopg after the store opened); `telemetry` probes
    OpenTelemetry and stays quiet without it, by design."""
    bad: list[str] = []
    seen = 0
    for path in sorted(SRC.rglob("*.py")):
        module = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
        if module.startswith(OPTIONAL_MODULES) or module == "tether.telemetry":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        guarded, typing_only = _guarded_lines(tree), _type_checking_lines(tree)
        first = {name.split(".")[0] for line, name in _imports(tree) if line in guarded}
        for line, name in _imports(tree):
            optional = name.split(".")[0] in OPTIONAL_PACKAGES or name.startswith(OPTIONAL_MODULES)
            if not optional:
                continue
            seen += 1
            if line not in guarded | typing_only and name.split(".")[0] not in first:
                bad.append(f"{path.relative_to(SRC)}:{line} imports {name}")
    assert seen >= 5  # the check sees the optional imports (serve, worker, models, ...)
    assert bad == []


def test_the_hint_is_not_spelled_another_way() -> None:
    # "pip install "tether[web]"", "pip install -e '.[web]'": one spelling in the code.
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        for needle in ('"tether[', "-e '.[", '-e ".['):
            if needle in text:
                bad.append(f"{path.relative_to(SRC)}: {needle}")
    assert bad == []


_BLOCKED = """
import sys
for name in {blocked!r}:
    sys.modules[name] = None  # `import name` fails as if it were not installed
sys.argv = ["tether", *{args!r}]
from tether.cli import main
main()
"""


@pytest.mark.parametrize(
    ("blocked", "args", "extra"),
    [
        (["fastapi", "uvicorn"], ["serve"], "web"),
        (["prometheus_client"], ["worker", "--once", "--metrics-port", "0"], "metrics"),
        (["openai"], ["run", "spec.yaml", "--model", "openai:gpt-4.1-mini"], "openai"),
        (["anthropic"], ["run", "spec.yaml", "--model", "anthropic:claude-x"], "anthropic"),
        (["jsonschema", "mcp"], ["run", "mcp-spec.yaml", "--model", DONE], "mcp"),
        (["psycopg", "psycopg_pool"], ["list", "--db", "postgresql://u@127.0.0.1:1/x"], "postgres"),
    ],
)
def test_a_command_without_its_extra(
    tmp_path: Path, blocked: list[str], args: list[str], extra: str
) -> None:
    (tmp_path / ".tether").mkdir()
    (tmp_path / "spec.yaml").write_text("objective: x\nitems: [{id: a, title: A}]\n")
    (tmp_path / "mcp-spec.yaml").write_text(
        "objective: x\nitems: [{id: a, title: A}]\n"
        "mcp_servers: [{name: fs, command: mcp-server-filesystem, args: ['.']}]\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "OPENAI_API_KEY": "k",
           "ANTHROPIC_API_KEY": "k"}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", _BLOCKED.format(blocked=blocked, args=args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("tether: ") and f"needs the {extra} extra" in lines[0]
    assert lines[0].endswith(f"pip install 'tether[{extra}]'")
    assert not list(tmp_path.joinpath(".tether").iterdir())  # nothing written

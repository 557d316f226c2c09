"""The docs are tests: the fenced blocks of README.md and docs/*.md, parsed and run.

A page is read top to bottom as a reader would follow it. Its fenced blocks:

- ```` ```bash ```` (or `sh`, `shell`) runs in one bash session per page: the working
  folder (`cd`) and exported variables carry over from block to block, `PATH` starts
  with the venv's `bin` (the venv the docs told the reader to make), and `set -e` stops
  the block at the first command that fails;
- ```` ```python ```` is a complete program, run by the venv's Python in the page's
  working folder;
- ```` ```py ```` is a fragment (a signature, a few lines of a larger program): not
  run, but it must parse and every `tether.NAME` it uses must exist;
- ```` ```yaml ```` and ```` ```json ```` must parse (a YAML block made of contract
  fields must also be a valid contract, see tests/docs/test_doc_blocks.py);
- a block without a language (or `text`) is shown output or a diagram.

An HTML comment on the line(s) just before a block says more (invisible on GitHub, so
whatever the reader must know is said in the text as well):

- `<!-- doc-test: skip — REASON -->`: the block is not run, for REASON (a real model
  key, a real remote host, ...). The paragraph before it says so to the reader.
- `<!-- doc-test: file NAME -->`: the block's text is written to the file NAME in the
  page's working folder (a spec or a module the next block uses) instead of being run.
- `<!-- doc-test: exit N -->`: the block's last command exits N (default 0).
- `<!-- doc-test: output -->`: this block (no language, or `text`) is the output of the
  last block run: each of its lines must appear in that output, in order (runs of
  spaces count as one; `...` in a line matches anything).

What the reader fills in, the runner fills in from the session, as the reader would:
`<task-id>` and `TASK` become the newest task of the session's database
(`tether list --json`, read when the command runs), `<request-id>` and `REQUEST` its
first pending approval request (`tether approvals TASK --json`). Folders under `/tmp/`
become folders of the run's scratch space, and `pip install 'tether[EXTRAS]'` installs
from the checkout under test (as the README says it reads from a checkout). `tether
serve` runs in the background until it answers on `/api/tasks` and `/metrics`, then
stops; `tether worker` runs with `--once`, or, given `--metrics-port`, in the background
until its `/healthz`, `/readyz` and `/metrics` answered (what they said is the block's
output), then stops.

Run it with `.ci/doc-tests` (a fresh venv, then every page); `python -m
tests.docs.doc_blocks --help` for the options. Standard library only: it runs beside
the venv it tests, not inside it.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN_LANGS = {"bash": "bash", "sh": "bash", "shell": "bash", "python": "python"}
FRAGMENT_LANGS = {"py"}
DATA_LANGS = {"yaml", "json"}
SHOWN_LANGS = {"", "text", "console"}
ALL_LANGS = set(RUN_LANGS) | FRAGMENT_LANGS | DATA_LANGS | SHOWN_LANGS

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+)(?P<lang>[^\s`]*)\s*$")
MARKER = re.compile(r"^\s*<!--\s*doc-test:\s*(?P<body>.*?)\s*-->\s*$")
SKIP = re.compile(r"^skip\s*(?:—|--|-|:)\s*(?P<reason>.+)$")
#: Placeholders the runner fills from the session, and how.
TASK_HOLDERS = re.compile(r"<task-id>|\bTASK\b")
REQUEST_HOLDER = re.compile(r"<request-id>|\bREQUEST\b")
INSTALL = re.compile(r"""(?P<q>['"])tether\[(?P<extras>[a-z0-9,_-]+)\](?P=q)""")
#: Seconds one block may take before the run calls it stuck.
BLOCK_TIMEOUT = 300


@dataclass
class Block:
    """One fenced block of a page, with what its marker says."""

    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    skip: str | None = None  # the reason, when it is not run
    file: str | None = None
    exit: int = 0
    output: bool = False
    directives: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        """`page:line`, relative to the repository when it is inside it."""
        try:
            name = self.page.resolve().relative_to(ROOT)
        except ValueError:
            name = self.page
        return f"{name}:{self.line}"

    @property
    def runs(self) -> bool:
        """True when the runner executes this block."""
        return self.lang in RUN_LANGS and self.skip is None and self.file is None


def parse_page(page: Path) -> list[Block]:
    """Every fenced block of a Markdown page, in order, with its markers applied."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m["indent"], m["fence"], m["lang"].lower()
        j = i + 1
        while j < len(lines) and lines[j].strip() != fence:
            j += 1
        body = [
            ln[len(indent) :] if ln.startswith(indent) else ln.lstrip() for ln in lines[i + 1 : j]
        ]
        block = Block(page, i + 1, lang, "\n".join(body) + "\n")
        _apply_markers(block, _markers_before(lines, i))
        blocks.append(block)
        i = j + 1
    return blocks


def _markers_before(lines: list[str], i: int) -> list[str]:
    """The `doc-test:` comments on the lines right before line `i` (blank lines between
    allowed), nearest last."""
    found: list[str] = []
    k = i - 1
    while k >= 0 and (not lines[k].strip() or MARKER.match(lines[k])):
        m = MARKER.match(lines[k])
        if m:
            found.insert(0, m["body"])
        k -= 1
    return found


def _apply_markers(block: Block, bodies: list[str]) -> None:
    for body in bodies:
        # A skip's reason is the rest of the comment, `;` and all.
        parts = [body.strip()] if SKIP.match(body.strip()) else body.split(";")
        for part in (p.strip() for p in parts):
            if not part:
                continue
            block.directives.append(part)
            skip = SKIP.match(part)
            if skip:
                block.skip = skip["reason"].strip()
            elif part == "skip":
                block.problems.append("a skip without a reason (write `skip — why`)")
            elif part.startswith("file "):
                block.file = part[5:].strip()
            elif part.startswith("exit "):
                try:
                    block.exit = int(part[5:])
                except ValueError:
                    block.problems.append(f"bad exit code in {part!r}")
            elif part == "output":
                block.output = True
            else:
                block.problems.append(f"unknown doc-test directive {part!r}")
    if block.lang not in ALL_LANGS:
        block.problems.append(f"unknown block language {block.lang!r}")
    if block.output and block.lang not in SHOWN_LANGS:
        block.problems.append("`output` marks a block of shown output (no language, or text)")
    if block.file and block.lang in RUN_LANGS and block.lang != "python":
        block.problems.append("`file` writes a python, yaml or shown block, not a shell one")


def pages(root: Path = ROOT) -> list[Path]:
    """The pages the doc tests read: README.md, then docs/*.md by name."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


# ---------------------------------------------------------------------------------------
# Running


class BlockFailed(Exception):
    """A block did not do what its page says."""


@dataclass
class Session:
    """What a reader's terminal holds while they follow one page."""

    venv: Path
    checkout: Path
    scratch: Path
    cwd: Path
    env: dict[str, str]
    last_output: str = ""

    @property
    def state(self) -> Path:
        return self.scratch / ".session"

    @property
    def here(self) -> Path:
        """The folder the reader is in now (where the last shell block left them)."""
        saved = self.state / "cwd"
        return Path(saved.read_text().strip()) if saved.is_file() else self.cwd


def new_session(venv: Path, checkout: Path, scratch: Path, start: Path) -> Session:
    """A terminal with the venv first on PATH and nothing of tether's set."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TETHER_") and not k.endswith("_API_KEY") and k != "VIRTUAL_ENV"
    }
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    env["TERM"] = "dumb"
    env["COLUMNS"] = "100"
    env.pop("PYTHONPATH", None)
    if os.environ.get("TETHER_MCP_SERVERS"):
        servers = Path(os.environ["TETHER_MCP_SERVERS"])
        extra = [servers / "npm" / "node_modules" / ".bin", servers / "py" / "bin"]
        # Installed as the README says (npm install -g / pip install): on the PATH.
        env["PATH"] += "".join(f"{os.pathsep}{p}" for p in extra if p.is_dir())
    session = Session(venv, checkout, scratch, start, env)
    session.state.mkdir(parents=True, exist_ok=True)
    return session


def _fill(text: str, s: Session) -> str:
    """The block as the reader types it: /tmp/ in the scratch space, `tether[X]` from the
    checkout, and in a shell block each placeholder read from the session at the moment
    its command runs (as the reader copies the id from what they just saw)."""
    text = text.replace("/tmp/", f"{s.scratch}/tmp/")
    text = INSTALL.sub(lambda m: shlex.quote(f"{s.checkout}[{m['extras']}]"), text)
    text = TASK_HOLDERS.sub('"$(_doc_task)"', text)
    return REQUEST_HOLDER.sub('"$(_doc_request)"', text)


#: Bash around each shell block: the session's folder and exports in, and out again on
#: exit; `tether serve` and `tether worker` kept bounded.
PRELUDE = r"""
cd "$DOC_CWD"
[ -f "$DOC_STATE/env" ] && . "$DOC_STATE/env"
cd "$(cat "$DOC_STATE/cwd" 2>/dev/null || echo "$DOC_CWD")"
trap 'pwd > "$DOC_STATE/cwd"; export -p | grep -v " DOC_" > "$DOC_STATE/env"' EXIT
set -eo pipefail
tether() {
    case "$1" in
        serve) _doc_serve "$@" ;;
        worker)
            case " $* " in
                *" --once "*) command tether "$@" ;;
                *" --metrics-port "*) _doc_worker_metrics "$@" ;;
                *) command tether "$@" --once ;;
            esac ;;
        *) command tether "$@" ;;
    esac
}
_doc_task() {  # the newest task of the session's database, as `tether list` shows it
    command tether list --json | python3 -c 'import json, sys
tasks = json.load(sys.stdin)
print(tasks[0]["task_id"] if tasks else sys.exit("doc tests: tether list shows no task"))'
}
_doc_request() {  # that task's first pending approval request
    command tether approvals "$(_doc_task)" --json | python3 -c 'import json, sys
pending = [r["request_id"] for r in json.load(sys.stdin) if r.get("status") == "pending"]
print(pending[0] if pending else sys.exit("doc tests: no pending approval request"))'
}
_doc_await() {  # LOG PID PATTERN: until the background PID logs PATTERN (in DOC_LINE)
    local deadline=$((SECONDS + 60))
    until DOC_LINE=$(grep -m1 -o "$3" "$1"); do
        if ! kill -0 "$2" 2>/dev/null; then cat "$1"; wait "$2"; return $?; fi
        [ $SECONDS -lt $deadline ] || { cat "$1"; kill "$2"; return 1; }
        sleep 0.1
    done
}
_doc_serve() {
    local log="$DOC_STATE/serve.log" port=() pid url
    case " $* " in *" --port "*) ;; *) port=(--port 0) ;; esac
    # Emptied here, not by the background job's redirection: that runs in the job, so
    # the wait below could read an earlier server's line (its port long closed).
    : > "$log"
    command tether "$@" "${port[@]}" > "$log" 2>&1 &
    pid=$!
    _doc_await "$log" "$pid" 'http://[^ ]*' || return $?
    cat "$log"
    url="${DOC_LINE%%/\?*}"
    python3 - "$url" <<'EOF'
import json, sys, urllib.request
base = sys.argv[1]
tasks = json.load(urllib.request.urlopen(base + "/api/tasks", timeout=30))
assert isinstance(tasks, list), tasks
metrics = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
assert "tether_tasks" in metrics, metrics[:400]
print(f"(doc tests: the dashboard answered: {len(tasks)} task(s) on /api/tasks, /metrics)")
EOF
    kill "$pid"; wait "$pid" 2>/dev/null || true
}
_doc_worker_metrics() {  # a worker with a metrics port: until it answered, then stopped
    local log="$DOC_STATE/worker.log" pid
    : > "$log"  # emptied before the job starts (see _doc_serve)
    command tether "$@" > "$log" 2>&1 &
    pid=$!
    _doc_await "$log" "$pid" 'http://[^ ]*/metrics' || return $?
    python3 - "${DOC_LINE%/metrics}" <<'EOF'
import sys, time, urllib.request
base = sys.argv[1]
def get(path):
    return urllib.request.urlopen(base + path, timeout=30).read().decode()
# Until its first claim: the worker's loop runs, and stops cleanly on SIGINT.
deadline = time.monotonic() + 60
while not any(line.startswith("tether_worker_claim_seconds_count") and float(line.split()[-1])
              for line in get("/metrics").splitlines()):
    assert time.monotonic() < deadline, "doc tests: the worker never claimed"
    time.sleep(0.1)
for path in ("/healthz", "/readyz", "/metrics"):
    print(f"$ curl {base}{path}")
    print(get(path).rstrip())
EOF
    kill -INT "$pid"; wait "$pid" || { cat "$log"; return 1; }
    cat "$log"
}
"""


def run_block(block: Block, s: Session) -> str:
    """Run one block in the session; its output, or `BlockFailed`."""
    if block.file is not None:
        target = s.here / block.file
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.text, encoding="utf-8")
        return ""
    if RUN_LANGS[block.lang] == "bash":
        text = _fill(block.text, s)
        script = s.state / "block.sh"
        script.write_text(PRELUDE + "\n" + text, encoding="utf-8")
        env = {**s.env, "DOC_CWD": str(s.cwd), "DOC_STATE": str(s.state)}
        cmd = ["bash", str(script)]
        cwd = s.cwd
    else:
        text = block.text
        script = s.state / "block.py"
        script.write_text(text, encoding="utf-8")
        env = dict(s.env)
        cmd = [str(s.venv / "bin" / "python"), str(script)]
        cwd = s.here
    t0 = time.monotonic()
    try:
        res = subprocess.run(
            cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT
        )
    except subprocess.TimeoutExpired as exc:
        raise BlockFailed(f"{block.where}: still running after {BLOCK_TIMEOUT} s") from exc
    output = res.stdout + res.stderr
    entry = (
        f"--- {block.where} ({block.lang}, exit {res.returncode}, {time.monotonic() - t0:.1f} s)"
    )
    with (s.scratch / "blocks.log").open("a", encoding="utf-8") as log:
        log.write(f"{entry}\n{text}\n--- output ---\n{output}\n")
    if res.returncode != block.exit:
        raise BlockFailed(
            f"{block.where}: exit {res.returncode}, the page expects {block.exit}\n"
            f"--- block as run ---\n{text}--- output ---\n{output[-6000:]}"
        )
    return output


def check_output(block: Block, s: Session) -> None:
    """Each line of a shown-output block appears, in order, in the last output."""
    got = [_squash(ln) for ln in s.last_output.splitlines()]
    at = 0
    for want in (ln for ln in block.text.splitlines() if ln.strip()):
        pattern = re.compile(
            ".*".join(re.escape(part) for part in _squash(want).split("...")), re.S
        )
        while at < len(got) and not pattern.search(got[at]):
            at += 1
        if at == len(got):
            raise BlockFailed(
                f"{block.where}: the page shows {want.strip()!r}, which the output lacks "
                f"(in order)\n--- output ---\n{s.last_output[-6000:]}"
            )
        at += 1


def _squash(line: str) -> str:
    return re.sub(r"\s+", " ", line).strip()


def run_page(page: Path, venv: Path, checkout: Path, scratch: Path) -> Session:
    """Follow one page top to bottom; raises `BlockFailed` at the first block that fails.
    README.md starts in the checkout (where `make demo` leaves the reader), every other
    page in an empty folder of its own."""
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "tmp").mkdir(exist_ok=True)
    start = checkout if page.name == "README.md" and page.parent == checkout else scratch / "work"
    start.mkdir(exist_ok=True)
    s = new_session(venv, checkout, scratch, start)
    for block in parse_page(page):
        if block.problems:
            raise BlockFailed(f"{block.where}: " + "; ".join(block.problems))
        if block.output:
            check_output(block, s)
        elif block.file is not None or block.runs:
            s.last_output = run_block(block, s)
    return s


def main(argv: list[str] | None = None) -> int:
    """`python -m tests.docs.doc_blocks --venv V --checkout C [PAGE ...]`."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--venv", type=Path, required=True, help="the venv the docs run in")
    ap.add_argument("--checkout", type=Path, default=ROOT, help="the checkout under test")
    ap.add_argument("--scratch", type=Path, help="where pages run (default: a temp folder)")
    ap.add_argument("--list", action="store_true", help="list the blocks and what runs")
    ap.add_argument("pages", nargs="*", type=Path, help="pages (default: README.md, docs/*.md)")
    args = ap.parse_args(argv)
    checkout = args.checkout.resolve()
    chosen = [p if p.is_absolute() else checkout / p for p in args.pages] or pages(checkout)
    if args.list:
        for page in chosen:
            for b in parse_page(page):
                what = "skip: " + b.skip if b.skip else ("run" if b.runs else b.file or "-")
                print(f"{b.where:32} {b.lang or '(none)':8} {what}")
        return 0
    scratch = (args.scratch or Path(tempfile.mkdtemp(prefix="tether-doc-tests-"))).resolve()
    failed = 0
    for page in chosen:
        t0 = time.monotonic()
        try:  # docs/README.md and README.md each get a folder of their own
            where = scratch / page.relative_to(checkout).with_suffix("").as_posix().replace(
                "/", "-"
            )
        except ValueError:
            where = scratch / page.stem
        shutil.rmtree(where, ignore_errors=True)
        try:
            run_page(page, args.venv.resolve(), checkout, where)
        except BlockFailed as exc:
            failed += 1
            print(f"FAILED {page.name} ({time.monotonic() - t0:.0f} s)\n{exc}\n", flush=True)
        else:
            print(f"ok     {page.name} ({time.monotonic() - t0:.0f} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

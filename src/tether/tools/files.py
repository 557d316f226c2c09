"""Built-in file tools, confined to a task's workspace folder.

Four tools: `list_files`, `read_file`, `write_file` and `append_file`. Every path the
model gives is resolved against the workspace root with all symlinks followed; a path
that ends up outside the root (`..`, an absolute path, a symlink anywhere along the
way that points out, a symlink loop) or inside a `.tether/` folder (tether's own state,
where its default database lives) or onto the store's own database file wherever the
workspace holds it (`--db sqlite:///state.db`, with its `-wal`/`-shm`/`-journal`
companions, by real path and hard link: the runtime passes them as `private`) is
refused with a deterministic "not permitted" `errors.ToolFailed`, before anything is
read or written.

Writes are atomic: the new content goes to a temporary file in the same folder, is
flushed to disk, then moved over the target with `os.replace`, so a crash leaves
either the old file or the new one, never half of it.

`write_file` and `append_file` say in their output whether they created the file: it
begins with `created ` (see `says_created`) exactly when the file did not exist before.
The runtime reads that back from the op journal to tell a file the task made from one
that was there before it started (changing the latter is an `overwrite`).

This module is the blocking implementation (`Workspace`). The tools the model sees are
declared in `tether.tools.builtin.files` with the public `@tool`, like any user tool: their
signatures give the schemas and the argument checks, and `@tool` runs the IO in a
thread.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path, PurePath
from typing import Final

from tether import errors

#: Default and largest number of characters `read_file` returns in one call.
DEFAULT_READ_LIMIT: Final[int] = 20_000
MAX_READ_LIMIT: Final[int] = 200_000
_READ_BLOCK: Final[int] = 1 << 20
#: How the output of `write_file` and `append_file` begins when they made a new file.
CREATED_PREFIX: Final[str] = "created "
#: tether's own state folder (the default SQLite database lives in `./.tether`, and the
#: default workspace is `.` too): no file tool reaches into one.
STATE_DIR: Final[str] = ".tether"


def _not_permitted(path: str, why: str = "is outside the workspace") -> errors.ToolFailed:
    return errors.ToolFailed(f"not permitted: {path} {why}")


class Workspace:
    """A task's workspace folder; every file tool path is resolved inside it.

    The root is resolved once (symlinks followed) when the workspace is made, and
    `resolve` refuses any path whose real location is not under that resolved root.
    """

    def __init__(
        self, root: str | os.PathLike[str], private: Iterable[str | os.PathLike[str]] = ()
    ) -> None:
        self.root = Path(os.path.realpath(os.fspath(root)))
        #: Files no tool may reach even inside the root (the store's own database and its
        #: companions, see `database_files`), by real path.
        self.private = frozenset(Path(os.path.realpath(os.fspath(p))) for p in private)

    def __repr__(self) -> str:
        return f"Workspace({str(self.root)!r})"

    def resolve(self, path: str) -> Path:
        """The real path of `path` inside the workspace.

        An absolute path is accepted when it names a place inside the workspace (models
        often answer with the paths a listing showed them). Raises `errors.ToolFailed`
        ("not permitted: ...") for a path that is or leaves the workspace through `..`
        or a symlink (also a symlinked parent of a file that does not exist yet), or a
        symlink loop. The file itself need not exist.
        """
        if not isinstance(path, str) or "\x00" in path:
            raise _not_permitted(repr(path), "is not a usable path")
        shown = path or "."
        if PurePath(path).is_absolute():
            inside = Path(os.path.realpath(path))
            if not inside.is_relative_to(self.root):
                raise _not_permitted(shown)
            path = str(inside.relative_to(self.root)) or "."
        real = Path(os.path.realpath(os.path.join(self.root, path)))
        if not real.is_relative_to(self.root):
            raise _not_permitted(shown)
        if STATE_DIR in real.relative_to(self.root).parts:
            # The store's database (all tasks' journals): a task reading it would see
            # other tasks' data, and one writing there could corrupt every task.
            raise _not_permitted(shown, f"is in {STATE_DIR}/, tether's own state")
        if self._is_private(real):
            # The same reason as `.tether/`, for a database kept elsewhere in the folder.
            raise _not_permitted(shown, "is tether's own database")
        # `realpath` follows every symlink it can; one that is still there on the way
        # means a loop (or a link swapped in meanwhile): refuse rather than guess.
        probe = self.root
        for part in real.relative_to(self.root).parts:
            probe = probe / part
            try:
                mode = os.lstat(probe).st_mode
            except FileNotFoundError:
                break
            except OSError:
                raise _not_permitted(shown, "cannot be resolved inside the workspace") from None
            if stat.S_ISLNK(mode):
                raise _not_permitted(shown, "goes through a symlink loop")
        return real

    def _is_private(self, real: Path) -> bool:
        """True if `real` is one of the private files, by name or as the same file under
        another name (a hard link)."""
        if not self.private:
            return False
        if real in self.private:
            return True
        try:
            mine = os.stat(real)
        except OSError:
            return False  # nothing there yet: no other name for a private file
        for p in self.private:
            try:
                theirs = os.stat(p)
            except OSError:
                continue
            if (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino):
                return True
        return False

    def relative(self, real: Path) -> str:
        """How the model should see a resolved path: relative to the root, `/`-separated."""
        rel = real.relative_to(self.root).as_posix()
        return rel if rel != "." else "."

    # -- the tools, blocking -----------------------------------------------------------

    def list_files(self, path: str = ".") -> str:
        """List a folder: one entry per line, sorted, folders with a trailing `/`."""
        real = self.resolve(path)
        shown = self.relative(real)
        if not real.exists():
            raise errors.ToolFailed(f"no such folder: {shown}")
        if not real.is_dir():
            raise errors.ToolFailed(f"not a folder: {shown} (use read_file to read a file)")
        lines: list[str] = []
        with os.scandir(real) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if self.private and self._is_private(Path(os.path.realpath(entry.path))):
                    continue  # tether's own database is not the model's to see
                if entry.is_symlink():
                    lines.append(f"{entry.name}@")
                elif entry.is_dir(follow_symlinks=False):
                    lines.append(f"{entry.name}/")
                else:
                    size = entry.stat(follow_symlinks=False).st_size
                    lines.append(f"{entry.name} ({size} bytes)")
        if not lines:
            return f"{shown}: empty folder"
        return "\n".join(lines)

    def read_file(self, path: str, offset: int = 0, limit: int = DEFAULT_READ_LIMIT) -> str:
        """Up to `limit` characters from character `offset`; says how many remain."""
        real = self.resolve(path)
        shown = self.relative(real)
        if real.is_dir():
            raise errors.ToolFailed(f"{shown} is a folder (use list_files to list it)")
        try:
            fd = os.open(real, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            raise errors.ToolFailed(f"no such file: {shown}") from None
        except OSError as exc:
            raise errors.ToolFailed(f"cannot read {shown}: {exc.strerror}") from None
        # Stream the file so a huge one costs `limit` characters of memory, not its size.
        parts: list[str] = []
        total = 0
        with open(fd, encoding="utf-8", errors="replace", newline="") as fh:
            while block := fh.read(_READ_BLOCK):
                start, end = total, total + len(block)
                lo, hi = max(offset, start), min(offset + limit, end)
                if lo < hi:
                    parts.append(block[lo - start : hi - start])
                total = end
        if offset > total:
            return f"[offset {offset} is past the end of {shown}, which has {total} characters]"
        chunk = "".join(parts)
        remaining = total - offset - len(chunk)
        if remaining > 0:
            nxt = offset + len(chunk)
            chunk += (
                f"\n[... {remaining} more characters of {total}; "
                f"call read_file with offset={nxt} to continue]"
            )
        return chunk

    def existing_file(self, path: str) -> Path | None:
        """The resolved path if `path` names a file that exists now, else None (also
        for a folder or a path that is not permitted)."""
        try:
            real = self.resolve(path)
        except errors.ToolFailed:
            return None
        return real if real.is_file() else None

    def write_file(self, path: str, content: str) -> str:
        """Replace (or create) a file with `content`, atomically."""
        real = self._writable(path)
        existed = real.exists()
        self._atomic_write(real, content)
        shown = self.relative(real)
        if not existed:
            return f"{CREATED_PREFIX}{shown} with {len(content)} characters"
        return f"wrote {len(content)} characters to {shown} (replacing its previous content)"

    def append_file(self, path: str, content: str) -> str:
        """Append `content` to a file (created if missing), atomically."""
        real = self._writable(path)
        if not real.exists():
            self._atomic_write(real, content)
            return f"{CREATED_PREFIX}{self.relative(real)} with {len(content)} characters"
        try:
            old = real.read_text(encoding="utf-8", errors="strict")
        except UnicodeDecodeError:
            raise errors.ToolFailed(
                f"cannot append to {self.relative(real)}: it is not UTF-8 text"
            ) from None
        self._atomic_write(real, old + content)
        return (
            f"appended {len(content)} characters to {self.relative(real)} "
            f"(now {len(old) + len(content)} characters)"
        )

    # -- helpers -------------------------------------------------------------------------

    def _writable(self, path: str) -> Path:
        real = self.resolve(path)
        shown = self.relative(real)
        if real == self.root or real.is_dir():
            raise errors.ToolFailed(f"{shown} is a folder, not a file")
        return real

    def _atomic_write(self, real: Path, content: str) -> None:
        shown = self.relative(real)
        parent = real.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise errors.ToolFailed(
                f"cannot create the folder for {shown}: {exc.strerror}"
            ) from None
        # The folders just made were resolved inside the root, but check again in
        # case something raced a symlink in: never write outside.
        if not Path(os.path.realpath(parent)).is_relative_to(self.root):
            raise _not_permitted(shown)
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=".tether-", suffix=".tmp")
        try:
            with open(fd, "w", encoding="utf-8", newline="") as fh:
                fh.write(content)
                fh.flush()
                # mkstemp makes 0600 files; give the result the mode a plain open()
                # would (or keep the mode of the file it replaces).
                os.fchmod(fh.fileno(), _target_mode(real))
                os.fsync(fh.fileno())
            os.replace(tmp, real)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if isinstance(exc, OSError):
                raise errors.ToolFailed(f"cannot write {shown}: {exc.strerror}") from None
            raise
        _fsync_dir(parent)


#: The files SQLite keeps next to a database (write-ahead log, shared memory, rollback).
DATABASE_COMPANIONS: Final[tuple[str, ...]] = ("-wal", "-shm", "-journal")


def database_files(db_path: str | None) -> frozenset[Path]:
    """The real paths of a SQLite database file and its companions (`-wal`, `-shm`,
    `-journal`), both as named and next to the file a symlinked name points to; empty
    for no file (None, `:memory:`)."""
    if not db_path or db_path.startswith(":") or db_path.startswith("file:"):
        return frozenset()
    named = os.path.abspath(db_path)
    real = os.path.realpath(db_path)
    out: set[Path] = set()
    for base in {named, real}:
        for suffix in ("", *DATABASE_COMPANIONS):
            out.add(Path(os.path.realpath(base + suffix)))
    return frozenset(out)


def says_created(output: str) -> bool:
    """True if a `write_file` or `append_file` output says the call made a new file."""
    return output.startswith(CREATED_PREFIX)


def _target_mode(path: Path) -> int:
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _fsync_dir(folder: Path) -> None:
    # Make the rename itself durable; not every platform lets a folder be opened.
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

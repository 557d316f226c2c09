"""A task's workspace may not be a system folder, a shared one or one that holds the
home folder, unless the caller says `--allow-broad-workspace` (`allow_broad=True`); the
filesystem root never."""

from __future__ import annotations

from pathlib import Path

import pytest

from tether import errors
from tether.runtime.tasks import workspace_folder


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/usr", "system folder"),
        ("/etc/ssl", "system folder"),
        ("/usr/lib/../bin", "system folder"),
        ("/tmp", "shared folder"),
        ("/home", "shared folder"),
        ("/var", "shared folder"),
    ],
)
def test_broad_workspaces_need_the_flag(path: str, why: str) -> None:
    with pytest.raises(errors.UserError, match=why) as caught:
        workspace_folder(path)
    assert "--allow-broad-workspace" in str(caught.value)
    assert workspace_folder(path, allow_broad=True) == Path(path).resolve()


def test_a_folder_holding_the_home_folder_is_broad(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "users" / "ann"
    (home / "project").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    for broad in (home, tmp_path / "users"):
        with pytest.raises(errors.UserError, match="home folder"):
            workspace_folder(broad)
        assert workspace_folder(broad, allow_broad=True) == broad.resolve()
    assert workspace_folder(home / "project") == (home / "project").resolve()


def test_the_root_is_never_a_workspace() -> None:
    with pytest.raises(errors.UserError, match="filesystem root"):
        workspace_folder("/", allow_broad=True)

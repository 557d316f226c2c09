"""Built-in validators."""

from __future__ import annotations

from pathlib import Path

from tether.tools.validators import all_of, file_nonempty, has_fields, status_is


def test_status_is() -> None:
    check = status_is(200, 201)
    assert check({"status": 201}) is None
    assert "got 500" in (check({"status": 500}) or "")
    assert "got None" in (check({}) or "")

    class Response:
        status_code = 200

    assert check(Response()) is None


def test_has_fields() -> None:
    assert has_fields("id")({"id": 7}) is None
    assert has_fields("id", "title")({"id": 7, "title": ""}) == "the result has no title"
    assert (
        has_fields("id", within="body")({"status": 200, "body": {}})
        == "the result has no id in body"
    )
    assert "not an object" in (has_fields("id")(["id"]) or "")


def test_file_nonempty(tmp_path: Path) -> None:
    check = file_nonempty(base=tmp_path)
    assert "does not exist" in (check({"path": "a.txt"}) or "")
    (tmp_path / "a.txt").write_text("")
    assert "is empty" in (check({"path": "a.txt"}) or "")
    (tmp_path / "a.txt").write_text("x")
    assert check({"path": "a.txt"}) is None
    assert "names no file" in (check({}) or "")


def test_all_of_reports_the_first_failure() -> None:
    check = all_of(status_is(200), has_fields("id", within="body"))
    assert check({"status": 200, "body": {"id": 1}}) is None
    assert "status" in (check({"status": 404, "body": {}}) or "")
    assert "no id" in (check({"status": 200, "body": {}}) or "")

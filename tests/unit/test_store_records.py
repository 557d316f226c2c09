"""The SQL stores read each record from its row by the fields' annotations
(`store._rows._reading`): every field of a stored record must have an annotation whose
reading is known, so a new field cannot be read raw by mistake (a JSON column left as
text, an SQLite 0/1 left as an int)."""

from __future__ import annotations

import dataclasses

import pytest

from tether.store._rows import _reading
from tether.store.base import ApprovalRecord, ArtifactRecord, OpRecord, StoredEvent, TaskRecord

#: Annotations whose values the databases give as they are.
AS_STORED = {"str", "str | None", "float", "float | None", "int | None"}


@pytest.mark.parametrize(
    "record", [TaskRecord, StoredEvent, OpRecord, ArtifactRecord, ApprovalRecord]
)
def test_every_field_of_a_stored_record_has_a_known_reading(record: type) -> None:
    ways = dict(_reading(record))
    assert list(ways) == [f.name for f in dataclasses.fields(record)]
    unknown = {
        f.name: f.type
        for f in dataclasses.fields(record)
        if ways[f.name] == "raw" and str(f.type) not in AS_STORED
    }
    assert unknown == {}


def test_json_and_flag_columns_are_decoded() -> None:
    ways = dict(_reading(ArtifactRecord))
    assert (ways["deps"], ways["valid"], ways["meta"], ways["size"]) == (
        "tuple",
        "bool",
        "json_or_empty",
        "int",
    )
    assert dict(_reading(TaskRecord))["waiting"] == "json"

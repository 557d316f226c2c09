"""The stored events' field table (`store._event_fields.FIELDS`) is what the event
models say: a reader expands rows from the table without importing the models, so a
change to an event type must come with the table regenerated."""

from __future__ import annotations

from tether.store import _event_fields


def test_the_field_table_matches_the_event_models() -> None:
    derived = _event_fields.derived()
    assert set(_event_fields.FIELDS) == set(derived), "regenerate FIELDS from derived()"
    for name, fields in derived.items():
        assert _event_fields.FIELDS[name] == fields, f"{name}: regenerate FIELDS from derived()"
        if fields is not None:  # the same defaults of the same types (0 is not 0.0 here)
            stored = _event_fields.FIELDS[name] or ()
            assert [tuple(map(type, f)) for f in stored] == [tuple(map(type, f)) for f in fields]

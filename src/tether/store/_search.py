"""What the artifact search index holds, and how a query becomes search terms.

Shared by every store so that SQLite (FTS5), PostgreSQL (full-text search) and the
memory store index the same text and read a query the same way:

- the indexed text of an artifact is its name and its blob's text: the string values
  of a JSON blob (an evidence excerpt, a claim, a report section), or the blob as UTF-8
  text (a tool output, a source snapshot); a binary blob (NUL bytes, not UTF-8) adds
  nothing. At most `MAX_INDEXED_BYTES` of a blob are read and `MAX_INDEXED_CHARS` kept,
  so one huge output cannot swell the index;
- a query is only ever a list of plain words (`terms`): whatever a model or a user
  types, nothing of it is read as search syntax (FTS5's `NEAR`, `*`, column filters,
  quotes; tsquery operators), so no query can fail to parse or widen itself.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from tether.jsonwalk import strings_in

#: The most bytes of a blob read for the index.
MAX_INDEXED_BYTES: Final = 256 * 1024
#: The most characters of an artifact's text kept in the index.
MAX_INDEXED_CHARS: Final = 100_000
#: The most words of a query used; the rest are ignored.
MAX_TERMS: Final = 16
#: The most hits one search returns, whatever the caller asks.
MAX_LIMIT: Final = 50
#: Rows per batch when the migration indexes the artifacts already stored.
BACKFILL_BATCH: Final = 200
#: Excerpt length (characters) around the first match.
EXCERPT_CHARS: Final = 240

#: Words, with inner dots kept (`2.0`, `v1.2.3`), as both search engines tokenise them.
_WORD = re.compile(r"\w+(?:\.\w+)*")
#: Words tsquery's websearch syntax reads as operators.
_OPERATORS = frozenset({"or", "and", "not"})


def terms(query: str) -> list[str]:
    """The plain words of `query`, lowercased, deduplicated, at most `MAX_TERMS`."""
    out: list[str] = []
    for word in _WORD.findall(query or ""):
        w = word.lower()
        if w not in _OPERATORS and w not in out:
            out.append(w)
        if len(out) >= MAX_TERMS:
            break
    return out


def fts5_match(words: list[str]) -> str:
    """An FTS5 MATCH expression: each word a quoted string, any of them may match
    (bm25 ranks documents matching more, and rarer, words first)."""
    # A word is \\w and dots only, so it holds no quote; quoting makes FTS5 read it as
    # a string (a phrase of its tokens), never as an operator or a column name.
    return " OR ".join(f'"{w}"' for w in words)


def websearch_query(words: list[str]) -> str:
    """The words as a `websearch_to_tsquery` text: any of them may match."""
    return " or ".join(words)


def _decode(data: bytes) -> str | None:
    """`data` as text, or None if it is binary. A multi-byte character cut by the size
    cap is dropped, not taken as a sign of binary data."""
    if b"\x00" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if len(data) >= MAX_INDEXED_BYTES and exc.start >= len(data) - 3:
            return data[: exc.start].decode("utf-8", "replace")
        return None


def indexed_text(name: str, data: bytes | None) -> str:
    """The text the search index keeps for an artifact named `name` with blob `data`
    (None: the blob is not at hand); empty when there is nothing to index."""
    parts = [name.strip()] if name.strip() else []
    text = _decode(data[:MAX_INDEXED_BYTES]) if data else None
    if text:
        stripped = text.lstrip()
        if stripped[:1] in ("{", "["):
            # Not JSON after all (or cut by the cap): it is indexed as text.
            with contextlib.suppress(ValueError):
                text = "\n".join(s for s in strings_in(json.loads(text)) if s.strip())
        parts.append(text)
    body = "\n".join(parts)[:MAX_INDEXED_CHARS]
    # Neither database takes NUL in text, nor UTF-8 a lone surrogate (both can come
    # out of a JSON document's escapes): such a body must not fail the artifact's commit.
    return body.replace("\x00", " ").encode("utf-8", "replace").decode("utf-8")


def bounded(limit: int) -> int:
    """`limit` clamped to 1..`MAX_LIMIT`."""
    return max(1, min(int(limit), MAX_LIMIT))


def excerpt(text: str, words: list[str], size: int = EXCERPT_CHARS) -> str:
    """A window of `text` around the first of `words` found (case-insensitive), the
    matched words marked `[...]` (the memory store's stand-in for `snippet()` and
    `ts_headline`)."""
    low = text.lower()
    hits = [i for w in words if (i := low.find(w)) >= 0]
    start = max(0, min(hits) - size // 3) if hits else 0
    part = text[start : start + size]
    for w in sorted(words, key=len, reverse=True):
        part = re.sub(rf"(?i)\b({re.escape(w)})\b", r"[\1]", part)
    return ("…" if start else "") + part + ("…" if start + size < len(text) else "")


def score(text: str, words: list[str]) -> float:
    """A simple relevance: occurrences of each word, distinct words weighing most (the
    memory store's stand-in for bm25 and ts_rank)."""
    low = text.lower()
    counts = [len(re.findall(rf"\b{re.escape(w)}\b", low)) for w in words]
    found = sum(1 for c in counts if c)
    return float(found * 10 + sum(min(c, 5) for c in counts))


def backfill(
    query: Callable[[str, Mapping[str, Any]], Any],
    index_rows: Callable[[Any, Sequence[Mapping[str, Any]]], None],
    conn: Any,
) -> None:
    """Index the artifacts stored before the search index existed (schema 4), in the
    migration's transaction (`query` runs a statement on it, `index_rows` adds rows), in
    batches (a blob is read up to the index's cap)."""
    after = ""
    while True:
        rows = query(
            "SELECT a.artifact_id, a.task_id, a.name, substr(b.data, 1, :cap) AS data"
            " FROM artifacts a LEFT JOIN blobs b ON b.hash = a.blob_hash"
            " WHERE a.artifact_id > :after ORDER BY a.artifact_id LIMIT :n",
            {"cap": MAX_INDEXED_BYTES, "after": after, "n": BACKFILL_BATCH},
        ).fetchall()
        if not rows:
            return
        after = rows[-1]["artifact_id"]
        index_rows(
            conn,
            [
                {
                    "artifact_id": r["artifact_id"],
                    "task_id": r["task_id"],
                    "body": indexed_text(
                        r["name"], None if r["data"] is None else bytes(r["data"])
                    ),
                }
                for r in rows
            ],
        )

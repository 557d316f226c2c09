"""Messages with their volatile parts taken out: timings, dates, ids, addresses,
temporary paths, process ids, ports (`normalise`). The same failure said twice
normalises to the same text, a different one does not; progress (`runtime.round.progress`)
and the rule judge compare what calls said through it.
"""

from __future__ import annotations

import re
from typing import Final

#: (pattern, replacement), applied in order: the parts of a message that change from one
#: run of the same call to the next without saying anything new.
_VOLATILE: Final[tuple[tuple[re.Pattern[str], str], ...]] = (
    # the runtime's own retry suffix and "attempt 2 of 5" notes
    (re.compile(r"\(?gave up after \d+ attempts?\)?", re.I), "(gave up)"),
    (re.compile(r"\battempt \d+( of \d+)?\b", re.I), "attempt <n>"),
    # op ids of this runtime (`<task>.r3.c0`, `<task>.r3.c0.out`)
    (re.compile(r"\b[\w-]+\.r\d+\.c\d+(?:\.[A-Za-z]\w*)?\b"), "<op>"),
    # ISO dates and times, clock times, HTTP dates
    (
        re.compile(
            r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?"
            r"(?:Z|[+-]\d{2}:?\d{2})?)?"
        ),
        "<time>",
    ),
    (re.compile(r"\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b"), "<time>"),
    (
        re.compile(r"\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d{1,2} \w{3} \d{4} <time>(?: GMT)?"),
        "<time>",
    ),
    # UUIDs, long hex strings (hashes, request ids), memory addresses
    (
        re.compile(
            r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
        ),
        "<id>",
    ),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<addr>"),
    (_HEX := re.compile(r"\b[0-9a-fA-F]{12,}\b"), "<hex>"),
    # request / trace / correlation ids, whatever their shape
    (
        re.compile(
            r"\b((?:x-)?(?:request|req|trace|correlation|span)[-_ ]?id)\b([\"']?\s*[:=]?\s*)"
            r"[\"']?[\w.:/+-]+",
            re.I,
        ),
        r"\1\2<id>",
    ),
    # temporary paths
    (
        re.compile(
            r"(?:/private)?(?:/tmp|/var/tmp|/var/folders|/dev/shm)/[^\s'\",;:)\]]*"
            r"|[A-Za-z]:\\[^\s'\",;]*\\Temp\\[^\s'\",;:)\]]*"
        ),
        "<tmp>",
    ),
    (re.compile(r"\bpytest-of-[^\s/]+/pytest-\d+"), "<tmp>"),
    # process ids, epoch timestamps, durations
    (re.compile(r"\b(pid|process|thread)([ =:#]+)\d+\b", re.I), r"\1\2<n>"),
    # `\b1\d{9}…` and `\b\d+…` written to start with the digit and look behind it for the
    # word boundary (a digit is a word character: the same matches), so that the scan
    # jumps from digit to digit instead of trying every position.
    (re.compile(r"1(?<!\w1)\d{9}(?:\d{3})?(?:\.\d+)?\b"), "<epoch>"),
    (
        re.compile(
            r"\d(?<!\w\d)\d*(?:\.\d+)?\s?(?:ms|msec|milliseconds?|s|secs?|seconds?|us|µs|"
            r"ns|mins?|minutes?)\b",
            re.I,
        ),
        "<duration>",
    ),
    # an ephemeral port on a local address
    (re.compile(r"\b((?:127\.0\.0\.1|localhost|0\.0\.0\.0|\[::1\])):\d{2,5}\b"), r"\1:<port>"),
)
#: `_HEX` can match only where 12 hex digits follow each other: in the UTF-8 bytes with
#: every hex digit made `h` (no byte of a non-ASCII character is one), a bytes search.
_HEX_DIGITS: Final = bytes.maketrans(b"0123456789abcdefABCDEF", b"h" * 22)
_HEX_RUN: Final = b"h" * 12
#: The shape of a lower-cased ASCII text: every digit made `d`, a space, `:` and `-`
#: kept, every other character `\s` matches made a tab, every letter a unit of
#: `<duration>` can start with (`ms`, `s`, `us`, `ns`, `min`…) made `u`, anything else `.`.
_SHAPE: Final = bytes(
    b"d"[0]
    if chr(i) in "0123456789"
    else i
    if chr(i) in " :-"
    else b"\t"[0]
    if chr(i) in "\t\n\v\f\r\x1c\x1d\x1e\x1f"
    else b"u"[0]
    if chr(i) in "msun"
    else b"."[0]
    for i in range(256)
)

#: How much of a message or result is compared (the rest rarely tells a new failure).
_MAX_CHARS: Final = 20_000


#: Per `_VOLATILE` pattern: clauses of lower-case strings, where an ASCII text holds
#: at least one string of each clause whenever the pattern can match it (no clause: no
#: such test; `_HEX` has a test of its own). A round normalises every successful call's
#: output (up to `_MAX_CHARS`): most patterns are ruled out by substring tests far
#: cheaper than the regex scan. A clause of single characters comes first where one
#: rules out the longer strings (a character is found by `memchr`, a string of several
#: costs a scan of its own).
_NEEDLES: Final[tuple[tuple[tuple[str, ...], ...], ...]] = (
    (("gave up after ",),),
    (("attempt ",),),
    ((".r",),),
    (("-",),),
    ((":",),),
    (("<",), ("<time>",)),
    (("-",),),
    (("0x",),),
    (),
    (("req", "trace", "correlation", "span"),),
    (("/", "\\"), ("/tmp/", "/var/folders/", "/dev/shm/", "\\temp\\")),
    (("-",), ("pytest-of-",)),
    (("pid", "process", "thread"),),
    (),  # `<epoch>` and `<duration>`: `_SHAPES`
    (),
    # the port pattern needs its ":" whatever the host
    ((":",), ("127.0.0.1", "localhost", "0.0.0.0", "[::1]")),
)

#: Per `_VOLATILE` pattern: strings of which the `_SHAPE` of an ASCII text holds one
#: whenever the pattern can match it (empty: no such test). An ISO date needs
#: `dddd-dd-dd`, a clock time `d:dd:dd`, `<epoch>` ten digits in a row, `<duration>` a
#: digit, then at most one whitespace character, then its unit. Ordinary output has
#: digits, dashes and colons (JSON, logs) but rarely these: the regex scans are saved.
_SHAPES: Final[tuple[tuple[bytes, ...], ...]] = (
    *((),) * 3,
    (b"dddd-dd-dd",),
    (b"d:dd:dd",),
    *((),) * 8,
    (b"d" * 10,),
    (b"du", b"d u", b"d\tu"),
    (),
)


#: Per `_VOLATILE` pattern, in order: (pattern, replacement, its `_NEEDLES`, its
#: `_SHAPES`), one tuple walked per message (no `zip` of three tables each time).
_PLAN: Final = tuple(
    (pattern, repl, clauses, shapes)
    for (pattern, repl), clauses, shapes in zip(_VOLATILE, _NEEDLES, _SHAPES, strict=True)
)


def normalise(text: str) -> str:
    """A message with its volatile parts replaced by placeholders and its whitespace
    collapsed: the same failure said twice normalises to the same text, a different
    one (another count of failing tests, another error) does not."""
    out = text[:_MAX_CHARS]
    # Case-insensitive patterns match a few non-ASCII letters to ASCII ones (the Kelvin
    # sign to `k`): the substring test is exact for ASCII text only.
    lower = out.lower() if out.isascii() else None
    shape = None  # `lower`'s `_SHAPE`, made when first needed
    for pattern, repl, clauses, shapes in _PLAN:
        if lower is not None:
            # Whether `lower` holds a string of each clause, tested inline: a round
            # normalises every successful call's output, and a call per pattern cost
            # more than its substring tests.
            ruled_out = False
            for clause in clauses:
                for needle in clause:
                    if needle in lower:
                        break
                else:
                    ruled_out = True
                    break
            if ruled_out:
                continue
            if shapes:
                if shape is None:
                    shape = lower.encode().translate(_SHAPE)
                for run in shapes:
                    if run in shape:
                        break
                else:
                    continue
        if pattern is _HEX and _HEX_RUN not in out.encode().translate(_HEX_DIGITS):
            continue
        out, count = pattern.subn(repl, out)
        if count and lower is not None:
            lower = out.lower()
            shape = None
    return _collapsed(out, lower, shape)


def _collapsed(out: str, lower: str | None, shape: bytes | None) -> str:
    """`out` with its whitespace collapsed (`lower`: its lower case if it is ASCII,
    `shape`: `lower`'s `_SHAPE` if made)."""
    # `str.split` knows the whitespace `\s` does, and is far cheaper than
    # `re.sub(r"\s+", " ", out).strip()`, which it equals. Most output has nothing to
    # collapse (single spaces, none at the ends), which its shape tells faster still.
    if lower is not None:
        if shape is None:
            shape = lower.encode().translate(_SHAPE)
        if not (b"\t" in shape or b"  " in shape or shape.startswith(b" ") or shape.endswith(b" ")):
            return out
    return " ".join(out.split())


__all__ = ["normalise"]

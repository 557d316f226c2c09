"""Circuit breakers and concurrency limits per service, shared by all workers.

Two layers, as for retries:

- **Pure decisions** over a small JSON-able state (one document per service): `admit`,
  `record`, `acquire_slot`, `release_slot` and `admit_call` (breaker and slot together)
  take a state and the time and return a new state and a decision value. No I/O, no
  sleeping; the unit tests drive hours of cooldowns in microseconds.
- **`ServiceGuard`**, a thin async shell that applies those functions to the document
  `service:<name>` with `Store.update_shared`, so every read-modify-write is atomic
  across asyncio tasks, processes and machines sharing the database.

Written by hand rather than taken from a breaker library because the state must be
durable and shared: breaker libraries keep their counters in process memory (some in
Redis), which would give each worker its own breaker and its own concurrency count,
and lose both at a restart. Here the state lives in tether's own store, next to the
tasks it protects, and its transitions are values the runtime turns into events.

The state document:

```
{"state": "closed" | "open" | "half_open",
 "calls": [[ts, ok], ...],          # closed: the sliding window, oldest first
 "opened_at": float | None, "until": float | None,      # open: cooling down
 "probe": {"holder": str, "expires": float} | None,     # half_open: the one probe
 "slots": {holder: expires, ...}}   # concurrency slots in use
```

After the call, `record(ok)` gives the breaker its verdict and `release` frees the
concurrency slot; the two are independent, in either order. A holder that never does
either (its worker died) loses its slot after the slot ttl and its half-open probe
after `probe_timeout_seconds`. What counts as a failure is the caller's choice;
it should be the service's fault (a timeout, a reset connection, 429, 5xx), not a
deterministic error such as a rejected argument.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from tether.clock import Clock, SystemClock

if TYPE_CHECKING:
    from tether.spec import Limits, ServicePolicy
    from tether.store.base import Store

BreakerStateName = Literal["closed", "open", "half_open"]
#: Why a call was admitted or refused: `closed` (normal), `probe` (the half-open probe),
#: `open` (cooling down), `probing` (another caller's probe is outstanding), `busy`
#: (the concurrency limit is reached).
AdmissionCause = Literal["closed", "probe", "open", "probing", "busy"]

#: The window keeps at most this many of the most recent calls, so that a busy service's
#: document stays small; the failure rate is that of these calls.
MAX_WINDOW_CALLS = 200
#: A caller refused while another's probe is outstanding may try again this soon.
PROBE_RETRY_SECONDS = 1.0


@dataclass(frozen=True)
class BreakerPolicy:
    """When a service's breaker opens, and for how long.

    It opens when at least `failure_rate` of the calls of the last `window_seconds`
    failed, once there are at least `min_calls` of them; it stays open
    `cooldown_seconds`, then lets one probe through (half-open). A probe that neither
    succeeds nor fails within `probe_timeout_seconds` (its worker died) is given to the
    next caller.
    """

    failure_rate: float = 0.3
    min_calls: int = 10
    window_seconds: float = 60.0
    cooldown_seconds: float = 60.0
    probe_timeout_seconds: float = 60.0

    def __post_init__(self) -> None:
        if not 0 < self.failure_rate <= 1:
            raise ValueError(f"failure_rate must be in (0, 1], not {self.failure_rate}")
        if self.min_calls < 1:
            raise ValueError(f"min_calls must be at least 1, not {self.min_calls}")
        for name in ("window_seconds", "cooldown_seconds", "probe_timeout_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, not {getattr(self, name)}")


@dataclass(frozen=True)
class Transition:
    """A breaker changed state (the runtime records it as an event)."""

    service: str
    src: BreakerStateName
    dst: BreakerStateName
    reason: str
    at: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, for event data."""
        return {
            "service": self.service,
            "src": self.src,
            "dst": self.dst,
            "reason": self.reason,
            "at": self.at,
        }


@dataclass(frozen=True)
class Admission:
    """May a call go to the service now? If not, `retry_at` says when to try again.

    The one answer of a service guard (`Guard.admit`); a custom guard returns one too.
    `transitions` are the breaker changes the admission caused (the runtime journals
    them).
    """

    allowed: bool
    retry_at: float | None
    reason: str
    cause: AdmissionCause = "closed"
    transitions: tuple[Transition, ...] = ()


def new_state() -> dict[str, Any]:
    """The state of a service never seen: closed, no calls, no slots in use."""
    return {
        "state": "closed",
        "calls": [],
        "opened_at": None,
        "until": None,
        "probe": None,
        "slots": {},
    }


def normalize(state: Mapping[str, Any] | None) -> dict[str, Any]:
    """A fresh copy of `state` with every field present (None: a new state)."""
    out = new_state()
    if state is not None:
        out.update(copy.deepcopy(dict(state)))
    return out


def _window(calls: list[Any], now: float, policy: BreakerPolicy) -> list[Any]:
    start = now - policy.window_seconds
    kept = [c for c in calls if c[0] > start]
    return kept[-MAX_WINDOW_CALLS:]


def _close(s: dict[str, Any]) -> None:
    s.update(state="closed", calls=[], opened_at=None, until=None, probe=None)


def _open(s: dict[str, Any], now: float, policy: BreakerPolicy) -> None:
    s.update(state="open", calls=[], opened_at=now, until=now + policy.cooldown_seconds, probe=None)


# --- the breaker -------------------------------------------------------------------------


def admit(
    state: Mapping[str, Any] | None,
    now: float,
    policy: BreakerPolicy,
    holder: str,
    *,
    service: str = "",
) -> tuple[dict[str, Any], Admission]:
    """May `holder` call the service now, as far as the breaker is concerned?

    Closed: yes. Open before `until`: no, retry at `until`. Open after `until`: the
    breaker goes half-open and `holder` becomes its one probe. Half-open: yes for the
    probe's holder (again) or when the probe expired (the holder takes it over); no for
    anyone else while the probe is outstanding.
    """
    s = normalize(state)
    st = s["state"]
    if st == "closed":
        return s, Admission(True, None, "breaker closed", "closed")
    if st == "open":
        until = float(s["until"])
        if now < until:
            return s, Admission(
                False, until, f"breaker open, cooling down until {until:.3f}", "open"
            )
        s["state"] = "half_open"
        s["probe"] = {"holder": holder, "expires": now + policy.probe_timeout_seconds}
        t = Transition(service, "open", "half_open", "cooldown over: one probe", now)
        return s, Admission(True, None, "half-open: this call is the probe", "probe", (t,))
    probe = s["probe"]
    if probe is None or probe["holder"] == holder or now >= float(probe["expires"]):
        s["probe"] = {"holder": holder, "expires": now + policy.probe_timeout_seconds}
        return s, Admission(True, None, "half-open: this call is the probe", "probe")
    retry = min(float(probe["expires"]), now + PROBE_RETRY_SECONDS)
    return s, Admission(False, retry, "half-open: another call is probing", "probing")


def record(
    state: Mapping[str, Any] | None,
    now: float,
    policy: BreakerPolicy,
    ok: bool,
    holder: str,
    *,
    service: str = "",
) -> tuple[dict[str, Any], list[Transition]]:
    """Record a call's outcome; returns the new state and the transitions it caused.

    Closed: the call joins the sliding window, and the breaker opens when the window
    holds at least `min_calls` calls of which at least `failure_rate` failed. Half-open:
    the probe's outcome closes the breaker (the window starts empty) or opens it for a
    new cooldown; outcomes of other calls (admitted before it opened) change nothing,
    nor do they while it is open.
    """
    s = normalize(state)
    st = s["state"]
    if st == "closed":
        calls = _window([*s["calls"], [now, bool(ok)]], now, policy)
        s["calls"] = calls
        failed = sum(1 for c in calls if not c[1])
        # (A hair of tolerance: 3 of 10 is 30 % even where 0.3 * 10 is not exactly 3.)
        if len(calls) >= policy.min_calls and failed >= policy.failure_rate * len(calls) - 1e-9:
            _open(s, now, policy)
            reason = (
                f"{failed} of {len(calls)} calls failed in {policy.window_seconds:g} s"
                f" (threshold {policy.failure_rate:.0%} of at least {policy.min_calls})"
            )
            return s, [Transition(service, "closed", "open", reason, now)]
        return s, []
    if st == "half_open":
        probe = s["probe"]
        if probe is None or probe["holder"] != holder:
            return s, []
        if ok:
            _close(s)
            return s, [Transition(service, "half_open", "closed", "probe succeeded", now)]
        _open(s, now, policy)
        return s, [Transition(service, "half_open", "open", "probe failed", now)]
    return s, []


# --- concurrency slots -------------------------------------------------------------------


def live_slots(state: Mapping[str, Any] | None, now: float) -> dict[str, float]:
    """Slots in use at `now` (holder → expiry); expired ones are not."""
    slots = normalize(state)["slots"]
    return {h: float(exp) for h, exp in slots.items() if float(exp) > now}


def acquire_slot(
    state: Mapping[str, Any] | None, now: float, limit: int | None, holder: str, ttl: float
) -> tuple[dict[str, Any], bool]:
    """Take one of the service's `limit` slots for `holder` until `now + ttl`.

    Expired slots (their holder died without releasing) are dropped first, so a crash
    cannot hold the limit for longer than `ttl`. A holder that has a slot keeps it (its
    expiry is renewed). `limit=None` means no limit: always granted, nothing recorded.
    """
    s = normalize(state)
    slots = live_slots(s, now)
    s["slots"] = slots
    if limit is None:
        return s, True
    if holder in slots or len(slots) < limit:
        slots[holder] = now + ttl
        return s, True
    return s, False


def release_slot(state: Mapping[str, Any] | None, holder: str) -> dict[str, Any]:
    """Give `holder`'s slot back (nothing happens if it has none)."""
    s = normalize(state)
    s["slots"].pop(holder, None)
    return s


def admit_call(
    state: Mapping[str, Any] | None,
    now: float,
    policy: BreakerPolicy,
    limit: int | None,
    holder: str,
    ttl: float,
    *,
    service: str = "",
    retry_delay: float = 1.0,
) -> tuple[dict[str, Any], Admission]:
    """The breaker's `admit`, then a concurrency slot: both or neither.

    A caller refused a slot leaves the state as it was (with expired slots dropped): it
    does not take the half-open probe, which would block others while it waits.
    """
    after, adm = admit(state, now, policy, holder, service=service)
    if not adm.allowed:
        return after, adm
    taken, ok = acquire_slot(after, now, limit, holder, ttl)
    if ok:
        return taken, adm
    unchanged, _ = acquire_slot(state, now, None, holder, ttl)
    return unchanged, Admission(
        False, now + retry_delay, f"concurrency limit of {limit} calls reached", "busy"
    )


def _stored(state: dict[str, Any]) -> dict[str, Any] | None:
    # A service back to the pristine state needs no row.
    return None if state == new_state() else state


# --- the shared guard --------------------------------------------------------------------


@dataclass(frozen=True)
class ServiceConfig:
    """A service's breaker policy and concurrency limit (`None`: unlimited).

    `slot_ttl` bounds how long a slot stays taken when its holder dies without
    releasing it; it should exceed the longest call to the service.
    """

    breaker: BreakerPolicy = field(default_factory=BreakerPolicy)
    max_concurrency: int | None = None
    slot_ttl: float = 300.0

    def __post_init__(self) -> None:
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, not {self.max_concurrency}")
        if self.slot_ttl <= 0:
            raise ValueError(f"slot_ttl must be positive, not {self.slot_ttl}")

    @classmethod
    def from_spec(
        cls,
        policy: ServicePolicy | None,
        limits: Limits | None = None,
        *,
        slot_ttl: float = 300.0,
    ) -> ServiceConfig:
        """From a contract's `services.<name>` entry; unset thresholds come from `limits`
        (`breaker_failure_rate`, `breaker_min_calls`, `breaker_cooldown_seconds`)."""
        base = BreakerPolicy()
        rate = limits.breaker_failure_rate if limits else base.failure_rate
        calls = limits.breaker_min_calls if limits else base.min_calls
        cooldown = limits.breaker_cooldown_seconds if limits else base.cooldown_seconds
        window = base.window_seconds
        conc = None
        if policy is not None:
            rate = policy.failure_rate if policy.failure_rate is not None else rate
            calls = policy.min_calls if policy.min_calls is not None else calls
            cooldown = policy.cooldown_seconds if policy.cooldown_seconds is not None else cooldown
            window = policy.window_seconds
            conc = policy.max_concurrency
        return cls(
            BreakerPolicy(rate, calls, window, cooldown),
            max_concurrency=conc,
            slot_ttl=slot_ttl,
        )


class Guard(Protocol):
    """A service guard: shared breakers and concurrency limits, as the runtime uses them
    (`ServiceGuard` is the store-backed one; a custom guard may stand in, e.g. in tests
    or benchmarks). The one protocol of it: the runtime's `ops` types against this.

    After a call the runtime gives the slot back and the verdict in one step
    (`finish`); `release` alone when the verdict waits (a lost response being
    reconciled), then `record` once it is known."""

    async def admit(self, service: str, holder: str) -> Admission:
        """May a call to `service` go now? (takes a concurrency slot if so)"""
        ...

    async def release(self, service: str, holder: str) -> None:
        """Give the concurrency slot back."""
        ...

    async def record(self, service: str, ok: bool, holder: str) -> list[Transition]:
        """Count an outcome; returns the breaker transitions it caused."""
        ...

    async def finish(self, service: str, ok: bool, holder: str) -> list[Transition]:
        """`release` and `record` together; returns the breaker transitions."""
        ...


def service_key(service: str) -> str:
    """The shared-state key of a service's breaker and slots."""
    return f"service:{service}"


class ServiceGuard:
    """Breakers and concurrency limits of services, kept in the store for all workers.

    `admit` before calling a service (it may wait up to `max_wait` seconds for a
    concurrency slot, polling every `poll_interval`; a breaker that is open refuses at
    once), then `record` the outcome and `release` the slot:

    ```python
    adm = await guard.admit("tickets", op_id)
    if not adm.allowed:
        ...  # transient, try again at adm.retry_at
    try:
        ok = await call()
    finally:
        await guard.release("tickets", op_id)
    transitions = await guard.record("tickets", ok, op_id)  # -> events
    ```

    `holder` names one call (an op id, say): the same holder admitted again keeps its
    slot and its probe.
    """

    def __init__(
        self,
        store: Store,
        services: Mapping[str, ServiceConfig] | None = None,
        *,
        default: ServiceConfig | None = None,
        clock: Clock | None = None,
        max_wait: float = 30.0,
        poll_interval: float = 0.05,
        retry_delay: float = 1.0,
    ) -> None:
        self.store = store
        self.services = dict(services or {})
        self.default = default or ServiceConfig()
        self.clock: Clock = clock or SystemClock()
        self.max_wait = max_wait
        self.poll_interval = poll_interval
        self.retry_delay = retry_delay

    def config(self, service: str) -> ServiceConfig:
        """The configuration `service` runs under."""
        return self.services.get(service, self.default)

    async def admit(self, service: str, holder: str) -> Admission:
        """Ask the breaker and take a concurrency slot, atomically for all workers.

        Waits (on the injected clock) while only the concurrency limit stands in the
        way, up to `max_wait`; then refuses with `cause="busy"`.
        """
        cfg = self.config(service)
        if cfg.max_concurrency is None:
            # No slot to take: a closed breaker needs no write, so the common case costs
            # one read instead of a write transaction that every worker would queue on.
            doc = await self.store.get_shared(service_key(service))
            if doc is None or doc.get("state", "closed") == "closed":
                return Admission(True, None, "breaker closed", "closed")

        def step(doc: dict[str, Any] | None, now: float) -> tuple[dict[str, Any] | None, Admission]:
            new, adm = admit_call(
                doc,
                now,
                cfg.breaker,
                cfg.max_concurrency,
                holder,
                cfg.slot_ttl,
                service=service,
                retry_delay=self.retry_delay,
            )
            return _stored(new), adm

        deadline: float | None = None
        while True:
            adm = await self.store.update_shared(service_key(service), step)
            if adm.allowed or adm.cause != "busy":
                return adm
            now = self.clock.now()
            if deadline is None:
                deadline = now + self.max_wait
            if now >= deadline:
                return adm
            await self.clock.sleep(min(self.poll_interval, deadline - now))

    async def record(self, service: str, ok: bool, holder: str) -> list[Transition]:
        """Give the breaker a call's outcome; returns the transitions it caused."""
        policy = self.config(service).breaker

        def step(
            doc: dict[str, Any] | None, now: float
        ) -> tuple[dict[str, Any] | None, list[Transition]]:
            new, transitions = record(doc, now, policy, ok, holder, service=service)
            return _stored(new), transitions

        return await self.store.update_shared(service_key(service), step)

    async def finish(self, service: str, ok: bool, holder: str) -> list[Transition]:
        """`release` and `record` in one transaction (the engine's path after a call)."""
        cfg = self.config(service)

        def step(
            doc: dict[str, Any] | None, now: float
        ) -> tuple[dict[str, Any] | None, list[Transition]]:
            base = release_slot(doc, holder) if cfg.max_concurrency is not None and doc else doc
            new, transitions = record(base, now, cfg.breaker, ok, holder, service=service)
            return _stored(new), transitions

        return await self.store.update_shared(service_key(service), step)

    async def release(self, service: str, holder: str) -> None:
        """Free `holder`'s concurrency slot."""

        def step(doc: dict[str, Any] | None, now: float) -> tuple[dict[str, Any] | None, None]:
            if doc is None:
                return None, None
            return _stored(release_slot(doc, holder)), None

        await self.store.update_shared(service_key(service), step)

    async def state(self, service: str) -> dict[str, Any]:
        """The service's breaker and slots as stored (a copy)."""
        return normalize(await self.store.get_shared(service_key(service)))


if TYPE_CHECKING:

    def _is_a_guard(guard: ServiceGuard) -> Guard:  # mypy checks the protocol here
        return guard

"""Fake OpenTelemetry instruments for the telemetry tests."""

from __future__ import annotations

from typing import Any


class Histogram:
    """An instrument that keeps what it records."""

    def __init__(self) -> None:
        self.records: list[tuple[float, dict[str, Any]]] = []

    def record(self, amount: float, attributes: Any = None, context: Any = None) -> None:
        self.records.append((amount, dict(attributes or {})))


class Proxy(Histogram):
    """Like OpenTelemetry's proxy instruments: recording goes to the real instrument a
    meter provider gives it, and nowhere before."""

    def __init__(self) -> None:
        super().__init__()
        self._real_instrument: Histogram | None = None

    def record(self, amount: float, attributes: Any = None, context: Any = None) -> None:
        super().record(amount, attributes)
        if self._real_instrument is not None:
            self._real_instrument.record(amount, attributes, context)

"""The doctor's keys on the c10d store: what a rank publishes, waits for and counts.

Every doctor run of a job shares one prefix (:func:`exporter.storekeys.doctor_prefix`): a
restart's doctor never reads an earlier attempt's keys. Every wait is bounded: a rank that
never publishes is reported as missing, never waited for past the deadline.
"""

from __future__ import annotations

import time
from typing import Any

from .checks import POLL_S, Report

__all__ = ["Board"]


class Board:
    """One doctor run's keys on ``store``, under ``prefix``."""

    def __init__(self, store: Any, prefix: str) -> None:
        self.store = store
        self.prefix = prefix

    def publish(self, key: str, value: str) -> None:
        self.store.set(self.prefix + key, value)

    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the counter ``key``; return its value (0 reads it)."""
        return int(self.store.add(self.prefix + key, amount))

    def wait(self, key: str, until: float) -> str | None:
        """Poll for ``key`` until the monotonic time ``until``; never block past it."""
        full = self.prefix + key
        while True:
            try:
                if self.store.check([full]):
                    return str(self.store.get(full).decode())
            except Exception:  # noqa: BLE001 - the store host left: the key will not come
                return None
            if time.monotonic() >= until:
                return None
            time.sleep(POLL_S)

    def gather(self, world: int, until: float) -> list[Report]:
        """Read the reports published so far until every rank of ``world`` is in, or ``until``."""
        reports: dict[int, Report] = {}
        while True:
            count = self.add("arrived", 0)
            for i in range(1, count + 1):
                key = self.prefix + f"report/{i}"
                if i not in reports and self.store.check([key]):
                    reports[i] = Report.from_json(self.store.get(key))
            ranks = {r.rank for r in reports.values()}
            if len(reports) >= world and ranks >= set(range(world)):
                break
            if time.monotonic() >= until:
                break
            time.sleep(POLL_S)
        return list(reports.values())

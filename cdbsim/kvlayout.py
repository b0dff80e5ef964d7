"""Depth-aware KV-cache layouts: how many KV slots a looped core layer keeps, and which slot a loop step uses.

A looped core runs the same physical layers ``r_max`` times per token, so each core layer can keep one KV
entry per loop step ("depth-indexed", the layout Ouro is trained with), a single entry overwritten by
every loop ("shared"), or the first loop in its own slot and all later loops sharing a second one
("first-shared", first-then-shared). Prelude and coda layers always keep one slot.

The depth-indexed layout here always includes the "last-exited" fill of the CDB paper: when a token
exits after loop step ``e``, its KV from slot ``e`` is copied into the deeper slots it skipped, so later
tokens that loop deeper find an entry at that position (see ``reference/cdb-engine-spec.md`` section 4).
"""

from __future__ import annotations

from traces.choice import Choice


class KVLayout(Choice):
    """Which KV slot each loop step of a core layer reads and writes."""

    DEPTH = "depth"
    SHARED = "shared"
    FIRST_SHARED = "first-shared"

    @classmethod
    def aliases(cls) -> dict[str, str]:
        return {"depth-indexed": "depth", "first-then-shared": "first-shared", "single": "shared"}

    @classmethod
    def what(cls) -> str:
        return "KV layout"

    def slots(self, r_max: int) -> int:
        """KV slots per core layer for a core looped up to ``r_max`` times."""
        if self is KVLayout.DEPTH:
            return r_max
        if self is KVLayout.SHARED:
            return 1
        return min(2, r_max)

    def slot_of_step(self, step: int, r_max: int) -> int:
        """The slot that 0-based loop ``step`` reads and writes."""
        return min(step, self.slots(r_max) - 1)

    def fill_copies(self, last_step: int, r_max: int) -> int:
        """Slots a token exiting after 0-based ``last_step`` must copy its KV into (per core layer)."""
        slots = self.slots(r_max)
        return slots - 1 - min(last_step, slots - 1)

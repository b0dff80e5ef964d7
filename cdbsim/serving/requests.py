"""Per-request serving state, kept as flat lists indexed by request (the scheduler's hot loops read it per token)."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from enum import IntEnum

import numpy as np

from traces.request import Request


class Status(IntEnum):
    """A request's life: not yet arrived, waiting for (re-)admission, prefilling, decoding, done."""

    NEW = 0
    WAITING = 1
    PREFILLING = 2
    DECODING = 3
    FINISHED = 4


class RequestTable:
    """Flat per-request state of one run. ``final``: position of the last token; ``exit_steps``: each decoded token's
    0-based exit step (requested depth clamped to ``[r_min, r_max]``, minus one), request ``i``'s token at
    position ``p`` at ``exit_base[i] + p`` (empty without ``loops``); ``prefill_target``/``prefilled``: tokens the
    current prefill covers and has launched; ``position``: the latest output token's; ``last``: its exit step."""

    def __init__(self, requests: Sequence[Request], r_min: int, r_max: int, loops: bool = True) -> None:
        n = len(requests)
        self.prompt = [r.prompt_len for r in requests]
        self.output = [r.output_len for r in requests]
        self.final = [r.prompt_len + r.output_len - 1 for r in requests]
        self.exit_steps: array
        self.exit_steps, starts = clipped_depths(requests, r_min, r_max, offset=-1) if loops else (array("h"), [0] * n)
        self.exit_base = [start - p for start, p in zip(starts, self.prompt, strict=True)]
        self.status = [Status.NEW] * n
        self.prefill_target = list(self.prompt)
        self.prefilled = [0] * n
        self.position = [p - 1 for p in self.prompt]
        self.last = [0] * n

    def start_token(self, i: int, loops: bool) -> None:
        """Request ``i``'s next token enters the loop (with its exit step when ``loops``)."""
        if loops:
            self.last[i] = self.exit_steps[self.exit_base[i] + self.position[i]]

    def restart(self, i: int) -> None:
        """Request ``i`` lost its KV cache: it waits to prefill its prompt and every token it generated."""
        self.status[i] = Status.WAITING
        self.prefilled[i] = 0
        self.prefill_target[i] = self.position[i] + 1

    def held_tokens(self, i: int) -> int:
        """How far request ``i`` got: tokens prefilled (while prefilling) or prompt + generated."""
        return self.prefilled[i] if self.status[i] == Status.PREFILLING else self.position[i] + 1


def clipped_depths(requests: Sequence[Request], r_min: int, r_max: int, offset: int = 0) -> tuple[array, list[int]]:
    """Every request's depths clamped to ``[r_min, r_max]`` (plus ``offset``), end to end in one int16 array, and
    where each request's depths start in it."""
    starts = np.cumsum([0] + [len(r.depths) for r in requests]).tolist()
    if not requests:
        return array("h"), []
    flat = array("h", [0]) * starts[-1]
    view = np.frombuffer(flat, dtype=np.int16)
    np.clip(np.concatenate([np.asarray(r.depths) for r in requests]), r_min, r_max, out=view, casting="unsafe")
    view += np.int16(offset)
    return flat, starts[:-1]

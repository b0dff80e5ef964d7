"""Per-request serving state: where each request is in its life and where its next token stands.

The scheduler's hot loops index this state millions of times per simulated run, so it is kept as flat
lists (one entry per request, indexed by the request's position in the run) rather than one object per
request; :class:`RequestTable` is the one place that owns them.
"""

from __future__ import annotations

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
    """Flat per-request state of one run.

    ``prompt``/``output``: prompt and output lengths; ``depths``: each decoded token's executed depth (the
    trace's requested depth clamped to ``[r_min, r_max]``); ``prefill_target``: tokens the current
    prefill episode covers (the prompt, or prompt + generated tokens when recomputed after preemption);
    ``prefilled``: of those, tokens already launched; ``generated``: output tokens produced;
    ``position``: position of the latest output token (the next input); ``step``/``target``: the loop
    step the request's current token runs next and the depth it exits at.
    """

    def __init__(self, requests: Sequence[Request], r_min: int, r_max: int) -> None:
        n = len(requests)
        self.prompt = [r.prompt_len for r in requests]
        self.output = [r.output_len for r in requests]
        self.depths = [np.clip(r.depths, r_min, r_max).tolist() for r in requests]
        self.status = [Status.NEW] * n
        self.prefill_target = list(self.prompt)
        self.prefilled = [0] * n
        self.generated = [0] * n
        self.position = [p - 1 for p in self.prompt]
        self.step = [0] * n
        self.target = [0] * n

    def __len__(self) -> int:
        return len(self.prompt)

    def positions(self, batch: list[int]) -> list[int]:
        """Position of each request's current input token (its latest output token)."""
        pos = self.position
        return [pos[i] for i in batch]

    def start_token(self, i: int, loops: bool) -> None:
        """Request ``i``'s next token enters the loop at step 0 (with its exit depth when ``loops``)."""
        self.step[i] = 0
        if loops:
            self.target[i] = self.depths[i][self.generated[i] - 1]

    def restart(self, i: int) -> None:
        """Request ``i`` lost its KV cache: it waits to prefill its prompt and every token it generated."""
        self.status[i] = Status.WAITING
        self.prefilled[i] = 0
        self.prefill_target[i] = self.prompt[i] + self.generated[i]

    def held_tokens(self, i: int) -> int:
        """How far request ``i`` got: tokens prefilled (while prefilling) or prompt + generated."""
        return self.prefilled[i] if self.status[i] == Status.PREFILLING else self.prompt[i] + self.generated[i]

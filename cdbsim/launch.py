"""The record the scheduler hands to a backend: one stage over one batch.

A :class:`Launch` is everything a latency model or a GPU runner needs to execute one step, and nothing
else. Items are kept as parallel lists of plain ints rather than one object per item, because the
simulator creates millions of them and the lists are what both backends index anyway.

Stages:

``prefill``  chunked prompt processing at full depth; produces each finished prompt's first token.
``prelude``  embedding (+ prelude layers) of freshly produced tokens, entering the loop at step 0.
``core``     one application of the looped core; items may sit at different loop steps.
``coda``     coda layers + final norm + LM head + greedy sampling for tokens that left the loop.
``decode``   token-level continuous batching (CB): one fused full-depth step per token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Stage(str, Enum):
    PREFILL = "prefill"
    PRELUDE = "prelude"
    CORE = "core"
    CODA = "coda"
    DECODE = "decode"


STAGES: tuple[Stage, ...] = tuple(Stage)


@dataclass(slots=True)
class Launch:
    """One stage over one batch, as planned by the scheduler.

    Per item (decode-type stages: prelude, core, coda, decode):
      ``requests[i]``  request id
      ``positions[i]`` position of the item's input token (prompt_len + index of the previous output
                       token); it attends ``positions[i] + 1`` tokens
      ``steps[i]``     core only: the 0-based loop step this launch applies
      ``exits[i]``     core only: True if the token leaves the loop after this step
    Per chunk (prefill): ``requests[i]``, ``positions[i]`` = first prompt position of the chunk,
    ``chunk_lens[i]`` tokens; ``finishes[i]`` True if the chunk completes the prompt.

    ``size`` is the real batch size (items, or prompt tokens for prefill); ``padded`` the size the
    executor's CUDA graph for this stage runs at. ``context`` is the number of (query, key) pairs
    attended per layer: sum of ``positions + 1`` for decode-type stages, the causal triangle of each
    chunk plus its prefix for prefill; ``longest`` the most tokens one item of a decode-type stage
    attends (0 when unknown). ``kv_copies`` counts (token, slot) KV copies per core layer the
    depth-indexed layout's last-exited fill makes after this launch.
    """

    index: int
    stage: Stage
    requests: list[int]
    positions: list[int]
    steps: list[int] = field(default_factory=list)
    exits: list[bool] = field(default_factory=list)
    chunk_lens: list[int] = field(default_factory=list)
    finishes: list[bool] = field(default_factory=list)
    size: int = 0
    padded: int = 0
    context: int = 0
    longest: int = 0
    kv_copies: int = 0
    queue_waiting: int = 0
    queue_core: int = 0
    queue_coda: int = 0
    queue_prelude: int = 0
    active: int = 0

    def step_mix(self) -> dict[int, int]:
        """How many items sit at each 0-based loop step (core launches)."""
        mix: dict[int, int] = {}
        for s in self.steps:
            mix[s] = mix.get(s, 0) + 1
        return dict(sorted(mix.items()))

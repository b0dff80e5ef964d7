"""The record the scheduler hands to a backend: one stage over one batch, as parallel lists of plain ints.

Stages:

``prefill``  chunked prompt processing at full depth; produces each finished prompt's first token.
``prelude``  embedding (+ prelude layers) of freshly produced tokens, entering the loop at step 0.
``core``     one application of the looped core; items may sit at different loop steps.
``coda``     coda layers + final norm + LM head + greedy sampling for tokens that left the loop.
``decode``   token-level continuous batching (CB): one fused full-depth step per token.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from traces.choice import Choice


class Stage(Choice):
    PREFILL = "prefill"
    PRELUDE = "prelude"
    CORE = "core"
    CODA = "coda"
    DECODE = "decode"


STAGES: tuple[Stage, ...] = tuple(Stage)


@dataclass(slots=True, init=False)  # the __init__ below is written out: compiled, it costs a third as much
class Launch:
    """One stage over one batch, as planned by the scheduler.

    Per item of a decode-type stage: ``requests[i]``, ``positions[i]`` (the input token's position; it attends
    ``positions[i] + 1`` tokens) and, for core only, ``steps[i]`` (the 0-based loop step applied) and ``exits[i]``
    (the token leaves the loop after it). Per prefill chunk: ``requests[i]``, ``positions[i]`` (its first prompt
    position), ``chunk_lens[i]`` and ``finishes[i]`` (it completes the prompt). Unused lists are empty tuples.

    ``size`` is the real batch (items, or prompt tokens for prefill), ``padded`` the CUDA-graph size it runs at;
    ``context`` the (query, key) pairs attended per layer (sum of ``positions + 1``, or each chunk's causal
    triangle plus its prefix); ``longest`` the most tokens one decode-type item attends (0 when unknown);
    ``kv_copies`` the (token, slot) KV copies per core layer the depth-indexed layout's fill makes after it.
    """

    index: int
    stage: Stage
    requests: list[int]
    positions: list[int]
    steps: Sequence[int] = ()
    exits: Sequence[bool] = ()
    chunk_lens: Sequence[int] = ()
    finishes: Sequence[bool] = ()
    size: int = 0
    padded: int = 0
    context: int = 0
    longest: int = 0
    kv_copies: int = 0
    blocks: list[list[int]] | None = None
    recomputed: Sequence[int] = ()
    dropped: Sequence[int] = ()

    def __init__(self, index: int, stage: Stage, requests: list[int], positions: list[int], steps: Sequence[int] = (),
                 exits: Sequence[bool] = (), chunk_lens: Sequence[int] = (), finishes: Sequence[bool] = (),
                 size: int = 0, padded: int = 0, context: int = 0, longest: int = 0, kv_copies: int = 0,
                 blocks: list[list[int]] | None = None, recomputed: Sequence[int] = (),
                 dropped: Sequence[int] = ()) -> None:
        self.index, self.stage, self.requests, self.positions = index, stage, requests, positions
        self.steps, self.exits, self.chunk_lens, self.finishes = steps, exits, chunk_lens, finishes
        self.size, self.padded, self.context, self.longest, self.kv_copies = size, padded, context, longest, kv_copies
        self.blocks, self.recomputed, self.dropped = blocks, recomputed, dropped

    def detail(self) -> str:
        """``r1:30 r2:12, 5 exit`` for a core launch, ``1,024 tok, 3 chunk(s), 2 done`` for prefill."""
        if self.stage is Stage.PREFILL:
            return f"{self.size:,} tok, {len(self.chunk_lens)} chunk(s), {sum(self.finishes)} done"
        if self.stage is Stage.CORE:
            mix = " ".join(f"r{s + 1}:{c}" for s, c in self.step_mix().items())
            return f"{mix}, {sum(self.exits)} exit"
        return f"{self.size} token(s)"

    def step_mix(self) -> dict[int, int]:
        """How many items sit at each 0-based loop step (core launches)."""
        return dict(sorted(Counter(self.steps).items()))


@dataclass(slots=True)
class SchedulerState:
    """The scheduler as a launch left it, for the launch log (not the work order): tokens or requests
    in each queue, resident requests, and KV blocks held including the launch's new ones."""

    waiting: int = 0
    core: int = 0
    coda: int = 0
    active: int = 0
    kv_used: int = 0


def causal_pairs(length: int, prefix: int = 0) -> int:
    """(query, key) pairs a causal chunk of ``length`` tokens attends after ``prefix`` cached positions;
    attention's flops are 4 x heads x head_dim per pair."""
    return length * prefix + length * (length + 1) // 2


def decode_launch(stage: Stage, requests: list[int], positions: list[int], blocks: list[list[int]],
                  padded: int, steps: list[int] | None = None, exits: list[bool] | None = None,
                  index: int = 0) -> Launch:
    """A decode-type launch built outside a scheduler, to time one stage at a chosen batch and context."""
    n = len(requests)
    launch = Launch(index=index, stage=stage, requests=list(requests), positions=list(positions), size=n,
                    padded=padded, context=sum(positions) + n, longest=max(positions) + 1 if n else 0,
                    blocks=list(blocks))
    if stage is Stage.CORE:
        launch.steps = list(steps) if steps is not None else [0] * n
        launch.exits = list(exits) if exits is not None else [False] * n
    return launch


def prefill_launch(requests: list[int], starts: list[int], chunk_lens: list[int], blocks: list[list[int]],
                   padded: int) -> Launch:
    """A prefill launch of one chunk per request, each finishing its prompt, built outside a scheduler:
    chunk i covers positions ``starts[i] .. starts[i] + chunk_lens[i] - 1`` of its request."""
    tokens = sum(chunk_lens)
    pairs = sum(causal_pairs(c, s) for s, c in zip(starts, chunk_lens, strict=True))
    return Launch(index=0, stage=Stage.PREFILL, requests=list(requests), positions=list(starts),
                  chunk_lens=list(chunk_lens), finishes=[True] * len(requests), size=tokens, padded=padded,
                  context=pairs, blocks=list(blocks), recomputed=[0] * len(requests))


FIELDS = ("tok", "pos", "bank", "row0", "layer_base", "fill", "out", "seq_len")  # per padded row
ENTRY_BYTES = 4  # every field and block id is an int32


def table_width(requests: Sequence, block_size: int) -> int:
    """Blocks in a block-table row: enough for the longest request's prompt and output."""
    longest = max((r.prompt_len + r.output_len for r in requests), default=0)
    return -(-longest // block_size)


def metadata_bytes(padded: int, width: int) -> int:
    """Bytes a decode-type launch of ``padded`` rows copies with a block table ``width`` blocks wide."""
    return ENTRY_BYTES * padded * (len(FIELDS) + width)

"""Synthetic prompt token ids: deterministic per request, so every backend and the reference agree.

Timing does not depend on which ids a prompt holds, but correctness tests do: the executor, the reference
decoder and the gate recorder must all see the same prompt for a request. The ids come from a numpy
generator seeded with ``(seed, request_id)``, so they do not depend on the order requests are processed.
"""

from __future__ import annotations

import numpy as np


def prompt_ids(request_id: int, prompt_len: int, vocab: int, seed: int = 0) -> np.ndarray:
    """``prompt_len`` token ids in ``[0, vocab)`` for request ``request_id`` (int64)."""
    rng = np.random.default_rng([int(seed), int(request_id)])
    return rng.integers(0, vocab, size=int(prompt_len), dtype=np.int64)

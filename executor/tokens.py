"""Synthetic prompt token ids, deterministic per ``(seed, request_id)`` whatever the order requests are processed
in, so the executor, the reference decoder and the gate recorder see the same prompts.
"""

from __future__ import annotations

import numpy as np


def prompt_ids(request_id: int, prompt_len: int, vocab: int, seed: int = 0) -> np.ndarray:
    """``prompt_len`` token ids in ``[0, vocab)`` for request ``request_id`` (int64)."""
    rng = np.random.default_rng([int(seed), int(request_id)])
    return rng.integers(0, vocab, size=int(prompt_len), dtype=np.int64)

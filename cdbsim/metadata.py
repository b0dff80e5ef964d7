"""What the host copies to the device before each decode-type launch, and how many bytes that is.

The executor replays one CUDA graph per (stage, padded batch); a launch first copies its metadata into
the graph's input buffer: :data:`FIELDS` (one int32 per padded row each) and a block-table row per
padded row, as wide as the run's longest request needs (``table_width`` blocks). That copy runs on the
device's stream before the replay, so it is part of every launch's device time and grows with the
padded batch times the run's longest request: a W = 256 run over 8k-token requests copies about 1 MB per
launch. The latency model adds it per launch from the profile's ``meta_copy`` fit (:mod:`cdbsim.latency`).
Prefill launches carry metadata of their own layout, small next to their milliseconds; it is not modelled.
"""

from __future__ import annotations

from collections.abc import Sequence

FIELDS = ("tok", "pos", "bank", "row0", "layer_base", "fill", "out", "seq_len")  # per padded row
ENTRY_BYTES = 4  # every field and block id is an int32


def table_width(requests: Sequence, block_size: int) -> int:
    """Blocks in a block-table row: enough for the longest request's prompt and output."""
    longest = max((r.prompt_len + r.output_len for r in requests), default=0)
    return -(-longest // block_size)


def metadata_bytes(padded: int, width: int) -> int:
    """Bytes a decode-type launch of ``padded`` rows copies with a block table ``width`` blocks wide."""
    return ENTRY_BYTES * padded * (len(FIELDS) + width)

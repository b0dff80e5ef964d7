"""Which kernels a launch of a given number of rows runs on the executor's GPU path, shared by the executor
(:mod:`executor.model`) and the latency model's kernel composition (:mod:`cdbsim.kernels`), so both agree
without the simulator importing torch.

Three paths, by rows per launch:

* ``chained``: launches of at most :data:`CHAINED_ROWS` rows of models no wider than
  :data:`~cdbsim.attention.CHAINED_MAX_HIDDEN` run each layer as four skinny matmuls with the norms fused into
  them and one fused attention kernel (``executor.chain``); wider models do not gain on the H200. At two rows
  it took Ouro-1.4B's core step at L = 512 from 1.317 to 1.096 ms; at four it was slower than the few-row
  matmul (2.14 against 1.35 ms; ``benchmarks/results/chain-rows``).
* ``few``: other launches of at most :data:`FEW_ROWS_MAX` rows of models no wider than
  :data:`FEW_ROWS_MAX_HIDDEN` run their projections on the few-row matmul (``executor.few_rows``), the
  gate/up projection with its SwiGLU in the epilogue. On the H200 it took Ouro-1.4B's core step at 2-16 rows
  3-7% below cuBLAS (B = 2, L = 512: 1.319 against 1.413 ms), and Huginn-3.5B's (hidden 5,280, where cuBLAS
  reads its larger matrices well) 1-3% above (``benchmarks/results/few-row-matmul``).
* ``many``: cuBLAS projections and a separate SwiGLU kernel.
"""

from __future__ import annotations

from cdbsim.attention import CHAINED_MAX_HIDDEN

FEW_ROWS_MAX = 16  # most rows a launch runs on the few-row matmul (measured; the kernel takes up to 64)
FEW_ROWS_MAX_HIDDEN = CHAINED_MAX_HIDDEN  # widest model whose few-row launches take it (2,048 wins; 5,280 not)


CHAINED_ROWS = 2  # most rows a launch runs on the chained kernels (measured: at 4 the few-row matmul wins)


def chained_rows(hidden: int) -> int:
    """Rows up to which a model ``hidden`` wide runs a layer on the chained kernels."""
    return CHAINED_ROWS if hidden <= CHAINED_MAX_HIDDEN else 0


def few_rows(hidden: int) -> int:
    """Rows up to which a model ``hidden`` wide runs its projections on the few-row matmul (0: never)."""
    return FEW_ROWS_MAX if hidden <= FEW_ROWS_MAX_HIDDEN else 0

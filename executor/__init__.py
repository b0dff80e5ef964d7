"""The real engine: runs the shared scheduler's launches on a GPU (or, for tests, a CPU) and logs them.

Modules, in the order a launch meets them:

``driver``         :func:`run_executor` / :func:`execute`: scheduler + engine + clock (sync, async,
                   lookahead) + the simulator's log schema.
``engine``         runs one Launch: token store, hidden-state bank, per-row metadata, stage runners.
``graphs``         CUDA graphs per (stage, padded batch size or padded prefill tokens).
``prefill``        fixed-shape metadata of packed prefill chunks, and their attention context.
``attention``      paged decode attention (per-row slots).
``kv_cache``       paged, depth-aware KV cache (depth-indexed + last-exited fill, shared, first-shared).
``ops``            primitives in torch; ``triton_kernels`` the same primitives fused for the GPU;
                   ``chain`` PDL-chained skinny matmuls for single-row launches (the chained path);
                   ``few_rows`` the tensor-core matmul of launches of 2-16 rows; ``few_rows_direct`` the same
                   with weights loaded straight into MMA registers (CUDA C++ in ``csrc/``, opt-in:
                   ``CDBSIM_FEW_ROWS_KERNEL=direct``), ``few_rows_tma`` on the tensor copy engine (opt-in);
                   ``cuda_driver`` builds and launches the CUDA C++ kernels.
``model``          the looped transformer (Ouro and Huginn block styles, any prelude-core-coda split).
``reference``      a plain per-request decoder with the same KV semantics (what the tests compare to).
``loader``         real Ouro / Huginn safetensors checkpoints by their public parameter names.
``gates``          live exit gates (Ouro cumulative hazard, Huginn latent difference) to record traces.
``tokens``         deterministic synthetic prompt ids.

Needs torch (``pip install -e ".[gpu]"``); :mod:`cdbsim` and :mod:`traces` never import this package.
"""

from __future__ import annotations

__all__ = ["ExecutorRun", "build_model", "execute", "run_executor"]


def __getattr__(name: str):  # lazy, so ``import executor`` alone does not import torch
    if name in __all__:
        from executor import driver

        return getattr(driver, name)
    raise AttributeError(f"module 'executor' has no attribute {name!r}")

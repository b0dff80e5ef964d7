"""The real engine: runs the shared scheduler's launches on a GPU (or, for tests, a CPU) and logs them.

Entry points: :func:`run_executor` / :func:`execute` (:mod:`executor.driver`), :func:`build_model`. A launch goes
driver -> engine -> graphs (CUDA graphs) -> model -> ops (torch primitives, or Triton kernels: ``triton_pointwise``,
``triton_decode``, ``triton_prefill``; ``chain`` for one or two rows, ``few_rows`` for a few) over the paged
``kv_cache``. ``reference`` is the decoder the tests compare to, ``loader`` reads real checkpoints, ``gates`` computes
exit depths (``live_gates`` inside a served run), ``record`` writes a checkpoint's exit trace. Needs torch;
:mod:`cdbsim` and :mod:`traces` never import it.
"""

from __future__ import annotations

__all__ = ["ExecutorRun", "build_model", "execute", "run_executor"]


def __getattr__(name: str):  # lazy, so ``import executor`` alone does not import torch
    if name in __all__:
        from executor import driver

        return getattr(driver, name)
    raise AttributeError(f"module 'executor' has no attribute {name!r}")

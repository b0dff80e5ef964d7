"""Prompt and output lengths of the Alpaca, ShareGPT and ArXiv-summarization workloads.

Percentiles 0..100 of each length (Llama-2 tokens) are package data (``data/workload-lengths.json``), from
microsoft/sarathi-serve's ShareGPT trace stats, microsoft/vidur's arXiv-summarization stats and a 5,000-record sample
of tatsu-lab/stanford_alpaca. Prompt and output lengths are drawn jointly through a Gaussian copula with the recorded
Spearman correlation, each through its piecewise-linear quantile function.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources

import numpy as np

from traces.errors import unknown

_DATA_KEYS = {"alpaca": "alpaca", "sharegpt": "sharegpt", "arxiv": "arxiv_summarization"}


@dataclass(frozen=True)
class LengthModel:
    """Quantile functions of prompt and output length plus their rank correlation."""

    name: str
    prompt_quantiles: np.ndarray
    output_quantiles: np.ndarray
    spearman: float
    source: str

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``n`` (prompt_len, output_len) pairs, each at least 1 token."""
        from scipy.special import ndtr  # the standard normal CDF; scipy is imported where it is used

        rho = 2.0 * np.sin(np.pi * self.spearman / 6.0)  # Spearman -> Pearson for a Gaussian copula
        z1 = rng.standard_normal(n)
        z2 = rho * z1 + np.sqrt(1.0 - rho * rho) * rng.standard_normal(n)
        u1, u2 = ndtr(z1), ndtr(z2)  # the standard normal CDF
        grid = np.linspace(0.0, 1.0, len(self.prompt_quantiles))
        prompt = np.interp(u1, grid, self.prompt_quantiles)
        output = np.interp(u2, grid, self.output_quantiles)
        return (np.maximum(1, np.rint(prompt)).astype(np.int64),
                np.maximum(1, np.rint(output)).astype(np.int64))

    @property
    def mean_output(self) -> float:
        return float(np.mean(self.output_quantiles))


WORKLOADS = tuple(_DATA_KEYS)


@cache
def _raw() -> dict:
    return json.loads(resources.files("traces").joinpath("data/workload-lengths.json").read_text())


def length_model(name: str) -> LengthModel:
    """The length model of preset ``name`` (``alpaca``, ``sharegpt``, ``arxiv``)."""
    if name not in _DATA_KEYS:
        raise unknown("workload", name, WORKLOADS)
    entry = _raw()[_DATA_KEYS[name]]
    return LengthModel(name=name, prompt_quantiles=np.asarray(entry["prompt"]["quantiles"], dtype=float),
                       output_quantiles=np.asarray(entry["output"]["quantiles"], dtype=float),
                       spearman=float(entry["spearman"]), source=entry["source"])

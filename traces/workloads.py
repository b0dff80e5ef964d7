"""Prompt and output lengths of the Alpaca, ShareGPT and ArXiv-summarization workloads.

The percentiles (0, 1, ..., 100) of prompt and output length, in Llama-2 tokens, are embedded as
package data in ``data/workload-lengths.json`` together with where each came from:

* ``sharegpt``: microsoft/sarathi-serve ``data/processed_traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv``
  (30,731 conversations; prompts include multi-turn history; outputs capped at 1,024).
* ``arxiv``: microsoft/vidur ``data/processed_traces/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv``
  (28,257 papers, total <= 4,096 tokens).
* ``alpaca``: a uniform 5,000-record sample of tatsu-lab/stanford_alpaca, tokenized with the Llama-2 tokenizer
  (+1 for BOS), prompts without the instruction template.

Sampling draws prompt and output length jointly through a Gaussian copula whose rank correlation is the
recorded Spearman coefficient, then maps each margin through its piecewise-linear quantile function.
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
    def mean_prompt(self) -> float:
        return float(np.mean(self.prompt_quantiles))

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
    return LengthModel(
        name=name,
        prompt_quantiles=np.asarray(entry["prompt"]["quantiles"], dtype=float),
        output_quantiles=np.asarray(entry["output"]["quantiles"], dtype=float),
        spearman=float(entry["spearman"]),
        source=entry["source"],
    )

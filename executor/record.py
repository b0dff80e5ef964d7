"""Record an exit trace from a checkpoint: real prompts, the model's greedy outputs and its own exit rule.

A checkpoint is a Hugging Face model folder: ``config.json`` (the architecture, :mod:`cdbsim.model.hf_config`),
safetensors in the authors' tensor names (:mod:`executor.loader`) and, for text prompts, ``tokenizer.json`` (read
with the ``tokenizers`` library). The prompts are decoded greedily at full depth in one batched executor run, up to
``max_new_tokens`` each or the end-of-sequence token; every output token after the first gets the depth at which
the model's exit rule fires (:mod:`executor.gates`: Ouro's learned gate, the cumulative exit probability reaching
``q``; Huginn's relative change between consecutive loop states falling below ``q``). The result is a trace file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from cdbsim.errors import ConfigError, read_json, require
from cdbsim.model.arch import ArchSpec, LayerStyle
from cdbsim.model.hf_config import arch_from_hf_config
from executor.gates import CRITERIA, default_criterion, depths_from_values, greedy_outputs, teacher_forced_values
from executor.loader import load_model
from executor.model import STATE_INITS, STATE_SEEDS, LoopedLM
from traces.request import Request

PROMPT_KEYS = ("text", "prompt", "token_ids")


@dataclass(frozen=True)
class Vocabulary:
    """What reading prompts needs of a checkpoint: its vocabulary size and tokenizer (None without
    ``tokenizer.json``)."""

    size: int
    tokenizer: object | None

    @classmethod
    def of(cls, folder: str | Path, size: int) -> Vocabulary:
        return cls(size, _tokenizer(Path(folder)))

    def encode(self, text: str, where: str) -> list[int]:
        require(self.tokenizer is not None, f"{where}: a text prompt needs the checkpoint's tokenizer.json "
                                            f"(or give token_ids)")
        return list(self.tokenizer.encode(text).ids)

    def decode(self, ids: list[int]) -> str | None:
        return None if self.tokenizer is None else self.tokenizer.decode(ids)


@dataclass
class Checkpoint:
    """A checkpoint folder opened: its architecture, model, vocabulary and the end-of-sequence token ids its
    ``config.json`` names."""

    folder: Path
    arch: ArchSpec
    model: LoopedLM
    vocabulary: Vocabulary
    eos: frozenset[int]

    @classmethod
    def open(cls, folder: str | Path, *, device: str = "cpu", dtype: torch.dtype | None = None,
             r_max: int | None = None, state_init: str = "zeros", state_seed: int = 0) -> Checkpoint:
        """The folder's architecture and weights; Huginn's loop starts as ``state_init`` says, seeded by
        ``state_seed`` (:class:`executor.model.ModelConfig`)."""
        folder = Path(folder)
        require(folder.is_dir(), f"--checkpoint {folder}: not a directory (a Hugging Face model folder)")
        config = folder / "config.json"
        require(config.is_file(), f"--checkpoint {folder}: no config.json")
        arch = arch_from_hf_config(config)
        if r_max is not None:
            arch = arch.with_loops(r_max, None)
        check_start_state(arch, state_init, state_seed)
        try:
            model = load_model(arch, folder, device=device, dtype=dtype, state_init=state_init,
                               state_seed=state_seed)
        except (ValueError, OSError, KeyError) as exc:
            raise ConfigError(f"--checkpoint {folder}: {str(exc).splitlines()[0]}") from None
        eos = read_json(config, "checkpoint config").get("eos_token_id")
        eos_ids = frozenset(eos if isinstance(eos, list) else [] if eos is None else [eos])
        return cls(folder, arch, model, Vocabulary.of(folder, arch.vocab), frozenset(int(t) for t in eos_ids))


def check_start_state(arch: ArchSpec, state_init: str, state_seed: int) -> None:
    """Refuse a start state the model cannot take, in one line (Ouro's loop starts from its prelude output)."""
    require(state_init in STATE_INITS, f"--state-init must be one of {', '.join(STATE_INITS)}, got {state_init!r}")
    require(state_init == "zeros" or arch.style is LayerStyle.HUGINN,
            f"--state-init {state_init}: {arch.name}'s loop starts from its prelude output (only Huginn draws a "
            f"start state)")
    require(state_seed in STATE_SEEDS, f"--state-seed must be in [0, 2**32), got {state_seed}")


def _tokenizer(folder: Path) -> object | None:
    path = folder / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the library raises its own exception types
        raise ConfigError(f"{path}: not a readable tokenizer ({str(exc).splitlines()[0]})") from None


def read_prompts(path: str | Path, vocabulary: Vocabulary) -> list[list[int]]:
    """Prompt token ids from a JSONL file (one object a line with ``text``, ``prompt`` or ``token_ids``) or a CSV
    file (a ``text`` or ``token_ids`` column, ids separated by spaces); a bad line names the file and the line."""
    path = Path(path)
    require(path.is_file(), f"--prompts {path}: no such file")
    if path.suffix == ".csv":
        import pandas as pd

        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
        column = next((c for c in ("text", "token_ids") if c in frame.columns), None)
        require(column is not None, f"{path}: a prompts CSV needs a text or token_ids column")
        rows = [({"token_ids": value.split()} if column == "token_ids" else {"text": value}, f"{path}:{i + 2}")
                for i, value in enumerate(frame[column])]
    else:
        rows = []
        for i, line in enumerate(path.read_text().splitlines()):
            if line.strip():
                try:
                    rows.append((json.loads(line), f"{path}:{i + 1}"))
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"{path}:{i + 1}: not JSON ({exc.msg})") from None
    prompts = [_prompt(row, where, vocabulary) for row, where in rows]
    require(bool(prompts), f"{path}: no prompts")
    return prompts


def _prompt(row: object, where: str, vocabulary: Vocabulary) -> list[int]:
    require(isinstance(row, dict) and any(k in row for k in PROMPT_KEYS),
            f"{where}: expected an object with one of {', '.join(PROMPT_KEYS)}")
    if "token_ids" in row:
        try:
            ids = [int(t) for t in row["token_ids"]]
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: token_ids must be a list of integers") from None
    else:
        text = row.get("text", row.get("prompt"))
        require(isinstance(text, str), f"{where}: the prompt text must be a string")
        ids = vocabulary.encode(text, where)
    vocab = vocabulary.size
    require(bool(ids), f"{where}: an empty prompt")
    require(all(0 <= t < vocab for t in ids), f"{where}: token ids must lie in [0, {vocab}) of the checkpoint")
    return ids


@dataclass(frozen=True)
class Recorded:
    """The trace's requests and, per request, its output token ids and text."""

    requests: list[Request]
    outputs: list[list[int]]
    texts: list[str | None]


def record(checkpoint: Checkpoint, prompts: list[list[int]], q: float, *, max_new_tokens: int = 256,
           criterion: str | None = None, progress: Callable[[int], None] | None = None) -> Recorded:
    """Greedy full-depth outputs of every prompt, each output token's exit depth at threshold ``q`` (offline)."""
    model = checkpoint.model
    criterion = criterion or default_criterion(model)
    require(criterion in CRITERIA, f"unknown exit criterion {criterion!r}; choose one of: {', '.join(CRITERIA)}")
    require(criterion != "hazard" or model.gate_w is not None, "the hazard criterion needs Ouro's exit gate")
    require(max_new_tokens >= 1, f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    asked = [Request(i, len(p), max_new_tokens, 0.0) for i, p in enumerate(prompts)]
    generated = greedy_outputs(model, checkpoint.arch, asked, prompts=prompts)  # one batched full-depth run
    requests, outputs, texts = [], [], []
    with torch.inference_mode():
        for i, (prompt, tokens) in enumerate(zip(prompts, generated, strict=True)):
            tokens = tokens.tolist()
            end = next((j + 1 for j, t in enumerate(tokens) if t in checkpoint.eos), len(tokens))
            tokens = [int(t) for t in tokens[:end]]
            values = teacher_forced_values(model, prompt, tokens, criterion, request_id=i)
            depths = depths_from_values(values, q, criterion)
            requests.append(Request(i, len(prompt), len(tokens), 0.0, np.asarray(depths, dtype=np.int16)))
            outputs.append(tokens)
            texts.append(checkpoint.vocabulary.decode(tokens))
            if progress is not None:
                progress(1)
    return Recorded(requests, outputs, texts)

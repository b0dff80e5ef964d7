"""Architectures read from the Hugging Face ``config.json`` of a looped checkpoint (the shape only, no weights).

Ouro (``model_type`` "ouro"): every layer loops (split 0-L-0), ``total_ut_steps`` is r_max. Huginn (``model_type``
"huginn_raven", RavenConfig): prelude, recurrent block and coda; r_max is 16 as the CDB paper serves it (``--r-max``
sets another; the config's own ``mean_recurrence``, 32 upstream, is kept in ``extras``); RoPE base 50,000 where the
config gives none, as upstream. :func:`hf_config_of` writes the config of an architecture, read back unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdbsim.errors import ConfigError, read_json, require, unknown
from cdbsim.model.arch import ArchSpec, LayerShape

HUGINN_R_MAX = 16
HUGINN_ROPE_BASE = 50_000.0  # RavenConfig's default where a config names none
_MISSING = object()


@dataclass(frozen=True)
class _Fields:
    """The keys of one config.json, read with a one-line error that names the file and the key."""

    data: dict
    path: Path
    family: str

    def get(self, *keys: str, default: Any = _MISSING, kind: type | tuple[type, ...] = int) -> Any:
        """The value of the first of ``keys`` present (the spellings a family's configs use)."""
        for key in keys:
            if key in self.data:
                value = self.data[key]
                if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
                    raise ConfigError(f"{self.path}: {key} must be {_KIND_NAMES[kind]}, got {value!r}")
                return value
        require(default is not _MISSING, f"{self.path}: no {' or '.join(keys)} (an {self.family} config.json has it)")
        return default

    def head_dim(self, hidden: int, heads: int) -> int:
        """``head_dim`` if given, else hidden / heads (how both families size their heads)."""
        if "head_dim" in self.data:
            return self.get("head_dim")
        require(heads >= 1 and not hidden % heads, f"{self.path}: no head_dim, and the hidden size {hidden} is not a "
                                                   f"multiple of the {heads} attention heads")
        return hidden // heads


_NUMBER = (int, float)
_KIND_NAMES = {int: "an integer", bool: "true or false", _NUMBER: "a number"}


def _name(data: dict, path: Path) -> str:
    """The checkpoint's name: ``_name_or_path``'s last part, else the directory holding the file."""
    given = data.get("_name_or_path") or data.get("name")
    if isinstance(given, str) and given.strip("/"):
        return given.rstrip("/").rsplit("/", 1)[-1]
    return path.resolve().parent.name or path.stem


def _ouro(config: _Fields, name: str) -> ArchSpec:
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    layer = LayerShape(hidden=hidden, intermediate=config.get("intermediate_size"), heads=heads,
                       kv_heads=config.get("num_key_value_heads", default=heads),
                       head_dim=config.head_dim(hidden, heads), style="ouro")
    return ArchSpec(name=name, layer=layer, vocab=config.get("vocab_size"), prelude=0,
                    core=config.get("num_hidden_layers"), coda=0, r_max=config.get("total_ut_steps"),
                    tied_head=config.get("tie_word_embeddings", default=True, kind=bool),
                    rope_theta=float(config.get("rope_theta", kind=_NUMBER)),
                    norm_eps=float(config.get("rms_norm_eps", default=1e-6, kind=_NUMBER)))


def _huginn(config: _Fields, name: str) -> ArchSpec:
    hidden, heads = config.get("n_embd"), config.get("n_heads", "num_attention_heads")
    mean_recurrence = config.get("mean_recurrence", default=None)
    layer = LayerShape(hidden=hidden, intermediate=config.get("intermediate_size"), heads=heads,
                       kv_heads=config.get("num_key_value_heads", default=heads),
                       head_dim=config.head_dim(hidden, heads), style="huginn")
    return ArchSpec(name=name, layer=layer, vocab=config.get("padded_vocab_size", "vocab_size"),
                    prelude=config.get("n_layers_in_prelude"), core=config.get("n_layers_in_recurrent_block"),
                    coda=config.get("n_layers_in_coda"), r_max=HUGINN_R_MAX,
                    tied_head=config.get("tie_embeddings", "tie_word_embeddings", default=True, kind=bool),
                    rope_theta=float(config.get("rope_base", "rope_theta", default=HUGINN_ROPE_BASE, kind=_NUMBER)),
                    norm_eps=float(config.get("norm_eps", default=1e-6, kind=_NUMBER)),
                    extras={} if mean_recurrence is None else {"mean_recurrence": mean_recurrence})


FAMILIES: dict[str, tuple[str, Callable[[_Fields, str], ArchSpec]]] = {
    "ouro": ("Ouro", _ouro),
    "huginn_raven": ("Huginn", _huginn),
}


def arch_from_hf_config(path: str | Path) -> ArchSpec:
    """The :class:`ArchSpec` of the checkpoint whose ``config.json`` is ``path``."""
    path = Path(path)
    data = read_json(path, "Hugging Face config")
    require(isinstance(data, dict), f"{path}: not a Hugging Face config (expected a JSON object)")
    model_type = data.get("model_type")
    if model_type not in FAMILIES:
        raise ConfigError(f"{path}: {unknown('model_type', str(model_type), FAMILIES)}")
    family, read = FAMILIES[model_type]
    try:
        return read(_Fields(data, path, family), _name(data, path))
    except ConfigError as exc:
        message = str(exc)
        raise ConfigError(message if message.startswith(str(path)) else f"{path}: {message}") from None


def hf_config_of(arch: ArchSpec) -> dict[str, Any]:
    """The ``config.json`` fields of ``arch`` in its family's names (what :func:`arch_from_hf_config` reads back)."""
    layer = arch.layer
    if layer.style.value == "ouro":
        require(arch.prelude == 0 and arch.coda == 0, f"{arch.name}: an Ouro config.json loops every layer (split "
                                                      f"0-L-0), not {arch.split}")
        return {"model_type": "ouro", "_name_or_path": arch.name, "hidden_size": layer.hidden,
                "intermediate_size": layer.intermediate, "num_attention_heads": layer.heads,
                "num_key_value_heads": layer.kv_heads, "head_dim": layer.head_dim, "vocab_size": arch.vocab,
                "num_hidden_layers": arch.core, "total_ut_steps": arch.r_max, "tie_word_embeddings": arch.tied_head,
                "rope_theta": arch.rope_theta, "rms_norm_eps": arch.norm_eps}
    config = {"model_type": "huginn_raven", "_name_or_path": arch.name, "n_embd": layer.hidden,
              "intermediate_size": layer.intermediate, "n_heads": layer.heads, "num_key_value_heads": layer.kv_heads,
              "head_dim": layer.head_dim, "padded_vocab_size": arch.vocab, "n_layers_in_prelude": arch.prelude,
              "n_layers_in_recurrent_block": arch.core, "n_layers_in_coda": arch.coda,
              "tie_embeddings": arch.tied_head, "rope_base": arch.rope_theta, "norm_eps": arch.norm_eps}
    if arch.extras.get("mean_recurrence") is not None:
        config["mean_recurrence"] = arch.extras["mean_recurrence"]
    return config

"""Load real Ouro and Huginn checkpoints (one ``.safetensors`` file, or a directory of them, sharded with an
index or not) into :class:`LoopedLM`, one tensor at a time, into the model's fused weights and dtype.

Public names (HF ``modeling_ouro.py``; ``raven_modeling_minimal.py``) are known here only: Ouro's
``model.layers.{i}.*`` count prelude, core and coda layers in order (q/k/v -> ``wqkv``, gate/up -> ``w_gate_up``,
``input_layernorm``/``_2`` -> norm1/norm2, ``post_attention_layernorm``/``_2`` -> norm3/norm4); Huginn's
``transformer.{prelude,core_block,coda}.{i}.*`` (``attn.qk_bias`` -> ``q_bias``, ``k_bias``), tied to ``wte``.
:func:`save_checkpoint` writes a model as such a folder (``config.json`` and safetensors), which loads back unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from cdbsim.model.arch import ArchSpec, LayerStyle
from executor.model import Layer, LoopedLM, ModelConfig, default_ops
from executor.ops import default_backend

# buffers some checkpoints carry that the model recomputes
IGNORED = ("freqs_cis", "rotary_emb.inv_freq")


@dataclass(frozen=True)
class Slot:
    """Where one public tensor goes: parameter ``attr`` of ``owner``, rows ``rows`` of it (None: all)."""

    owner: str            # "" for the model itself, else "prelude_layers.0" etc.
    attr: str
    rows: tuple[int, int] | None = None
    qk_bias: bool = False


def _layer_slots(config: ModelConfig) -> dict[str, Slot]:
    """Public name suffix -> slot inside one layer (owner filled in by the caller)."""
    d, i = config.head_dim, config.intermediate
    q, kv = config.heads * d, config.kv_heads * d
    if config.style is LayerStyle.OURO:
        return {
            "self_attn.q_proj.weight": Slot("", "wqkv", (0, q)),
            "self_attn.k_proj.weight": Slot("", "wqkv", (q, q + kv)),
            "self_attn.v_proj.weight": Slot("", "wqkv", (q + kv, q + 2 * kv)),
            "self_attn.o_proj.weight": Slot("", "wo"),
            "mlp.gate_proj.weight": Slot("", "w_gate_up", (0, i)),
            "mlp.up_proj.weight": Slot("", "w_gate_up", (i, 2 * i)),
            "mlp.down_proj.weight": Slot("", "w_down"),
            "input_layernorm.weight": Slot("", "norm1"),
            "input_layernorm_2.weight": Slot("", "norm2"),
            "post_attention_layernorm.weight": Slot("", "norm3"),
            "post_attention_layernorm_2.weight": Slot("", "norm4"),
        }
    return {
        "attn.Wqkv.weight": Slot("", "wqkv"),
        "attn.qk_bias": Slot("", "q_bias", qk_bias=True),
        "attn.proj.weight": Slot("", "wo"),
        "mlp.fc.weight": Slot("", "w_gate_up"),
        "mlp.proj.weight": Slot("", "w_down"),
        **{f"norm_{i}.weight": Slot("", f"norm{i}") for i in range(1, 5)},
    }


def public_names(config: ModelConfig) -> dict[str, Slot]:
    """Every public parameter name of a checkpoint of this shape, and where it goes in the model."""
    names: dict[str, Slot] = {}
    ouro = config.style is LayerStyle.OURO
    per_layer = _layer_slots(config)
    index = 0  # Ouro numbers prelude, core and coda layers in one sequence
    for group, count, huginn_group in (("prelude_layers", config.prelude, "prelude"),
                                       ("core_layers", config.core, "core_block"),
                                       ("coda_layers", config.coda, "coda")):
        for j in range(count):
            prefix = f"model.layers.{index}" if ouro else f"transformer.{huginn_group}.{j}"
            for suffix, slot in per_layer.items():
                names[f"{prefix}.{suffix}"] = Slot(f"{group}.{j}", slot.attr, slot.rows, slot.qk_bias)
            index += 1
    if ouro:
        names["model.embed_tokens.weight"] = Slot("", "embed")
        names["model.norm.weight"] = Slot("", "final_norm")
        names["model.early_exit_gate.weight"] = Slot("", "gate_w")
        names["model.early_exit_gate.bias"] = Slot("", "gate_b")
    else:
        names["transformer.wte.weight"] = Slot("", "embed")
        names["transformer.ln_f.weight"] = Slot("", "final_norm")
        names["transformer.adapter.weight"] = Slot("", "adapter")
    if not config.tied_head:
        names["lm_head.weight"] = Slot("", "head")
    return names


def _owner(model: LoopedLM, slot: Slot) -> LoopedLM | Layer:
    return model.get_submodule(slot.owner) if slot.owner else model


def _assign(model: LoopedLM, name: str, slot: Slot, tensor: torch.Tensor) -> None:
    owner = _owner(model, slot)
    with torch.no_grad():
        if slot.qk_bias:
            cfg = model.config
            if cfg.heads != cfg.kv_heads:
                raise ValueError(f"{name}: a qk_bias checkpoint needs heads == kv_heads")
            want = (2, 1, cfg.heads, cfg.head_dim)
            if tuple(tensor.shape) != want:
                raise ValueError(f"{name}: shape {tuple(tensor.shape)}, expected {want}")
            owner.q_bias.copy_(tensor[0].reshape(-1))
            owner.k_bias.copy_(tensor[1].reshape(-1))
            return
        target = getattr(owner, slot.attr)
        if slot.rows is not None:
            target = target[slot.rows[0]: slot.rows[1]]
        if tuple(tensor.shape) != tuple(target.shape):
            raise ValueError(f"{name}: shape {tuple(tensor.shape)}, expected {tuple(target.shape)}")
        target.copy_(tensor)


def to_public(model: LoopedLM) -> dict[str, torch.Tensor]:
    """The model's weights under their public names (unfused copies): the inverse of loading."""
    out: dict[str, torch.Tensor] = {}
    for name, slot in public_names(model.config).items():
        owner = _owner(model, slot)
        if slot.qk_bias:
            cfg = model.config
            if cfg.heads != cfg.kv_heads:
                raise ValueError(f"{name}: a qk_bias checkpoint needs heads == kv_heads")
            out[name] = torch.stack((owner.q_bias, owner.k_bias)).reshape(2, 1, cfg.heads, cfg.head_dim).clone()
            continue
        t = getattr(owner, slot.attr)
        out[name] = (t[slot.rows[0]: slot.rows[1]] if slot.rows else t).detach().clone()
    return out


def checkpoint_files(path: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint (one file, an index's shards, or a directory's files)."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [path / f for f in sorted(set(weight_map.values()))]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {path}")
    return files


def iter_tensors(path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every tensor in the checkpoint, one at a time."""
    from safetensors import safe_open

    for file in checkpoint_files(path):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open handles are not mappings
                yield name, f.get_tensor(name)


@dataclass
class LoadReport:
    loaded: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)


def load_state(model: LoopedLM, tensors: Mapping[str, torch.Tensor] | Iterator[tuple[str, torch.Tensor]], *,
               strict: bool = True) -> LoadReport:
    """Copy public-named tensors into ``model``; with ``strict`` every expected name must be present."""
    expected = public_names(model.config)
    report = LoadReport()
    tied_extra = {"lm_head.weight"} if model.config.tied_head else set()
    for name, tensor in tensors.items() if isinstance(tensors, Mapping) else tensors:
        slot = expected.get(name)
        if slot is None:
            if not (name in tied_extra or any(name.endswith(s) for s in IGNORED)):
                report.unexpected.append(name)
            continue
        _assign(model, name, slot, tensor)
        report.loaded.append(name)
    missing = sorted(set(expected) - set(report.loaded))
    if strict and (missing or report.unexpected):
        raise ValueError(f"checkpoint does not match the model: missing {missing[:5]}"
                         f"{' ...' if len(missing) > 5 else ''}, unexpected {report.unexpected[:5]}")
    return report


def load_model(arch: ArchSpec, path: str | Path, *, device: torch.device | str = "cpu",
               dtype: torch.dtype | None = None, backend: str | None = None, strict: bool = True,
               **config_overrides: object) -> LoopedLM:
    """A model of ``arch``'s shapes with the weights of the checkpoint at ``path``."""
    config = ModelConfig.from_arch(arch, **config_overrides)
    ops = default_ops(config, backend or default_backend(device))
    model = LoopedLM.empty(config, ops, device=device, dtype=dtype)
    load_state(model, iter_tensors(path), strict=strict)
    return model


def save_checkpoint(model: LoopedLM, arch: ArchSpec, folder: str | Path) -> Path:
    """Write ``model`` as a checkpoint folder in its family's public layout: ``config.json`` (from ``arch``) and
    ``model.safetensors``; :func:`load_model` and ``--checkpoint`` read it back."""
    from safetensors.torch import save_file

    from cdbsim.model.hf_config import hf_config_of

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf_config_of(arch), indent=1) + "\n")
    tensors = {name: t.contiguous().cpu() for name, t in to_public(model).items()}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder

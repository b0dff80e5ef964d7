"""Checkpoints with the public Ouro / Huginn parameter names load into the fused model exactly.

The test writes random tensors under the public names (one file, and sharded with an index), loads them,
and checks that (1) unfusing gives back every tensor, and (2) the loaded model's logits equal those of a
plain forward written here directly from the named tensors, following the public modeling code.
"""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from safetensors.torch import save_file  # noqa: E402

from cdbsim.model.arch import KVLayout  # noqa: E402
from executor.loader import load_model, save_checkpoint, to_public  # noqa: E402
from executor.reference import ReferenceDecoder  # noqa: E402

from .helpers import tiny_arch  # noqa: E402

H, HEADS, D, INTER, VOCAB = 64, 4, 16, 96, 101


def ouro_tensors(kv_heads: int, layers: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    def r(*shape: int, scale: float = 0.1) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale

    t = {"model.embed_tokens.weight": r(VOCAB, H), "model.norm.weight": 1 + r(H),
         "lm_head.weight": r(VOCAB, H), "model.early_exit_gate.weight": r(1, H), "model.early_exit_gate.bias": r(1)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t |= {p + "self_attn.q_proj.weight": r(HEADS * D, H), p + "self_attn.k_proj.weight": r(kv_heads * D, H),
              p + "self_attn.v_proj.weight": r(kv_heads * D, H), p + "self_attn.o_proj.weight": r(H, HEADS * D),
              p + "mlp.gate_proj.weight": r(INTER, H), p + "mlp.up_proj.weight": r(INTER, H),
              p + "mlp.down_proj.weight": r(H, INTER)}
        for n in ("input_layernorm", "input_layernorm_2", "post_attention_layernorm", "post_attention_layernorm_2"):
            t[p + n + ".weight"] = 1 + r(H)
    return t


def huginn_tensors(prelude: int, core: int, coda: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    def r(*shape: int, scale: float = 0.1) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale

    t = {"transformer.wte.weight": r(VOCAB, H), "transformer.ln_f.weight": 1 + r(H),
         "transformer.adapter.weight": r(H, 2 * H), "freqs_cis": r(1, 8, 1, D // 2, 2)}
    for group, count in (("prelude", prelude), ("core_block", core), ("coda", coda)):
        for i in range(count):
            p = f"transformer.{group}.{i}."
            t |= {p + "attn.Wqkv.weight": r(3 * HEADS * D, H), p + "attn.qk_bias": r(2, 1, HEADS, D),
                  p + "attn.proj.weight": r(H, HEADS * D), p + "mlp.fc.weight": r(2 * INTER, H),
                  p + "mlp.proj.weight": r(H, INTER)}
            for n in ("norm_1", "norm_2", "norm_3", "norm_4"):
                t[p + n + ".weight"] = 1 + r(H)
    return t


# ----- plain forwards from the named tensors (full sequence, every loop) -----------------------------
def rms(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq * D]."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
    n = q.shape[0]
    scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, -1)


def ouro_forward(t: dict[str, torch.Tensor], ids: list[int], layers: int, loops: int, kv_heads: int) -> torch.Tensor:
    n = len(ids)
    inv = 1.0 / (1e6 ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    freqs = torch.outer(torch.arange(n, dtype=torch.float64), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().float()[:, None], emb.sin().float()[:, None]

    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        return torch.cat((-x[..., D // 2:], x[..., : D // 2]), dim=-1)

    x = t["model.embed_tokens.weight"][ids]
    for _ in range(loops):
        for i in range(layers):
            p = f"model.layers.{i}."
            h = rms(x, t[p + "input_layernorm.weight"])
            q = (h @ t[p + "self_attn.q_proj.weight"].T).view(n, HEADS, D)
            k = (h @ t[p + "self_attn.k_proj.weight"].T).view(n, kv_heads, D)
            v = (h @ t[p + "self_attn.v_proj.weight"].T).view(n, kv_heads, D)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            o = causal_attention(q, k, v) @ t[p + "self_attn.o_proj.weight"].T
            x = x + rms(o, t[p + "input_layernorm_2.weight"])
            h = rms(x, t[p + "post_attention_layernorm.weight"])
            m = (torch.nn.functional.silu(h @ t[p + "mlp.gate_proj.weight"].T) * (h @ t[p + "mlp.up_proj.weight"].T))
            x = x + rms(m @ t[p + "mlp.down_proj.weight"].T, t[p + "post_attention_layernorm_2.weight"])
        x = rms(x, t["model.norm.weight"])
    return x @ t["lm_head.weight"].T


def huginn_forward(t: dict[str, torch.Tensor], ids: list[int], split: tuple[int, int, int], loops: int,
                   theta: float) -> torch.Tensor:
    n = len(ids)
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    freqs = torch.outer(torch.arange(n, dtype=torch.float64), inv)
    cos, sin = freqs.cos().float()[:, None], freqs.sin().float()[:, None]

    def rope(x: torch.Tensor) -> torch.Tensor:  # complex-like: pairs (2i, 2i + 1)
        pairs = x.unflatten(-1, (-1, 2))
        a, b = pairs[..., 0], pairs[..., 1]
        return torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)

    def block(x: torch.Tensor, p: str) -> torch.Tensor:
        q, k, v = (rms(x, t[p + "norm_1.weight"]) @ t[p + "attn.Wqkv.weight"].T).split(HEADS * D, dim=-1)
        bias = t[p + "attn.qk_bias"]
        q = q.view(n, HEADS, D) + bias[0, 0]
        k = k.view(n, HEADS, D) + bias[1, 0]
        y = causal_attention(rope(q), rope(k), v.view(n, HEADS, D)) @ t[p + "attn.proj.weight"].T
        x = rms(y + x, t[p + "norm_2.weight"])
        a, b = (rms(x, t[p + "norm_3.weight"]) @ t[p + "mlp.fc.weight"].T).chunk(2, dim=-1)
        return rms((torch.nn.functional.silu(a) * b) @ t[p + "mlp.proj.weight"].T + x, t[p + "norm_4.weight"])

    e = t["transformer.wte.weight"][ids] * math.sqrt(H)
    for i in range(split[0]):
        e = block(e, f"transformer.prelude.{i}.")
    s = torch.zeros_like(e)
    for _ in range(loops):
        s = torch.cat((s, e), dim=-1) @ t["transformer.adapter.weight"].T
        for i in range(split[1]):
            s = block(s, f"transformer.core_block.{i}.")
    s = rms(s, t["transformer.ln_f.weight"])
    for i in range(split[2]):
        s = block(s, f"transformer.coda.{i}.")
    return rms(s, t["transformer.ln_f.weight"]) @ t["transformer.wte.weight"].T


def check_generation(model, forward, prompt: list[int]) -> None:
    """Greedy full-depth tokens and logits of the loaded model equal the plain forward's."""
    out = ReferenceDecoder(model, KVLayout.DEPTH).generate(prompt, 4, [model.config.r_max] * 3)
    seq = list(prompt)
    for j, token in enumerate(out.tokens):
        want = forward(seq)[-1]
        torch.testing.assert_close(out.logits[j], want, atol=1e-4, rtol=1e-4)
        assert token == int(want.argmax())
        seq.append(token)


def write_sharded(tensors: dict[str, torch.Tensor], directory) -> None:
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for file, keys in shards.items():
        save_file({k: tensors[k].contiguous() for k in keys}, str(directory / file))
    weight_map = {k: f for f, keys in shards.items() for k in keys}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def write_tensors(tensors: dict[str, torch.Tensor], directory, sharded: bool):
    """Write ``tensors`` as one safetensors file or as shards with an index; returns what to load."""
    if sharded:
        write_sharded(tensors, directory)
        return directory
    path = directory / "model.safetensors"
    save_file(tensors, str(path))
    return path


@pytest.mark.parametrize("sharded", [False, True])
def test_ouro_checkpoint_round_trip(tmp_path, sharded: bool) -> None:
    arch = tiny_arch("ouro", r_max=3)
    tensors = ouro_tensors(arch.layer.kv_heads, arch.core, torch.Generator().manual_seed(0))
    model = load_model(arch, write_tensors(tensors, tmp_path, sharded))
    public = to_public(model)
    assert set(public) == set(tensors)
    for name, tensor in tensors.items():
        torch.testing.assert_close(public[name], tensor, atol=0, rtol=0, msg=name)
    check_generation(model, lambda ids: ouro_forward(tensors, ids, arch.core, arch.r_max, arch.layer.kv_heads),
                     [5, 17, 3, 99, 42, 8, 1])


@pytest.mark.parametrize("sharded", [False, True])
def test_huginn_checkpoint_round_trip(tmp_path, sharded: bool) -> None:
    arch = tiny_arch("huginn", r_max=3, kv_heads=4)
    tensors = huginn_tensors(arch.prelude, arch.core, arch.coda, torch.Generator().manual_seed(1))
    model = load_model(arch, write_tensors(tensors, tmp_path, sharded))
    public = to_public(model)
    assert set(public) == set(tensors) - {"freqs_cis"}
    for name, tensor in public.items():
        torch.testing.assert_close(tensor, tensors[name], atol=0, rtol=0, msg=name)
    split = (arch.prelude, arch.core, arch.coda)
    check_generation(model, lambda ids: huginn_forward(tensors, ids, split, arch.r_max, arch.rope_theta),
                     [5, 17, 3, 99, 42, 8, 1])


def test_loader_refuses_a_mismatched_checkpoint(tmp_path) -> None:
    arch = tiny_arch("ouro", r_max=3)
    tensors = ouro_tensors(arch.layer.kv_heads, arch.core, torch.Generator().manual_seed(0))
    del tensors["model.norm.weight"]
    tensors["model.extra.weight"] = torch.zeros(3)
    save_file(tensors, str(tmp_path / "m.safetensors"))
    with pytest.raises(ValueError, match="missing"):
        load_model(arch, tmp_path / "m.safetensors")
    tensors = ouro_tensors(arch.layer.kv_heads, arch.core, torch.Generator().manual_seed(0))
    tensors["lm_head.weight"] = torch.zeros(VOCAB + 1, H)
    save_file(tensors, str(tmp_path / "n.safetensors"))
    with pytest.raises(ValueError, match=r"lm_head\.weight: shape"):
        load_model(arch, tmp_path / "n.safetensors")


@pytest.mark.parametrize("style", ["ouro", "huginn"])
def test_a_saved_checkpoint_opens_with_the_same_shape_and_weights(tmp_path, style) -> None:
    from executor.record import Checkpoint

    from .helpers import tiny_model

    arch = tiny_arch(style, r_max=3, kv_heads=2 if style == "ouro" else 4)  # Huginn's layout has no GQA
    model = tiny_model(arch, seed=7)
    opened = Checkpoint.open(save_checkpoint(model, arch, tmp_path / "ckpt"), r_max=3)
    assert opened.arch == arch
    saved, loaded = model.state_dict(), opened.model.state_dict()
    assert saved.keys() == loaded.keys() and all(torch.equal(saved[k], loaded[k]) for k in saved)

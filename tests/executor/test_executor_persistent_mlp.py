"""The persistent MLP kernel of :mod:`executor.persistent_mlp` computes what the layer's three MLP launches compute.

Under Triton's CPU interpreter in a fresh process (float32, IEEE products), against the torch composition
``residual_norm(linear(silu_mul(linear(h, w_gate_up)), w_down), x, ...)`` on shapes that are not multiples of the
tiles; on a GPU the same checks run in bfloat16, eagerly and replayed from a CUDA graph. Each check also asserts the
queue and counters are zero again afterwards (the next launch, or the next replay, starts from them).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from .helpers import replayed  # noqa: E402
from .triton_interpreter import report_checks, run_interpreted  # noqa: E402


def check_mlp(m: int, hidden: int, inter: int, sandwich: bool, has_next: bool, config, programs: int | None,
              device: str, dtype, atol: float, rtol: float, graph: bool = False) -> None:
    import torch.nn.functional as F

    from executor import ops as torch_ops
    from executor import persistent_mlp as pm

    gen = torch.Generator(device=device).manual_seed(m * 1000 + hidden + inter)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device=device) * scale).to(dtype)

    h, x = randn(m, hidden), randn(m, hidden)
    w_gu, w_down = randn(2 * inter, hidden, scale=hidden**-0.5), randn(hidden, inter, scale=inter**-0.5)
    w_post, w_next = 1 + randn(hidden, scale=0.1), (1 + randn(hidden, scale=0.1)) if has_next else None

    def call() -> tuple[torch.Tensor, torch.Tensor | None]:
        return pm.mlp(h, x, w_gu, w_down, w_post, w_next, 1e-6, sandwich, config, programs)

    got = call()
    if graph:
        def change() -> None:
            h.mul_(-0.5)
            x.add_(0.25)

        got = replayed(call, change)
    branch = F.linear(torch_ops.silu_mul(F.linear(h, w_gu)), w_down)
    want = torch_ops.residual_norm(branch, x, w_post, w_next, 1e-6, sandwich)
    what = f"M={m} H={hidden} I={inter} sandwich={sandwich} next={has_next} {config} programs={programs}"
    for name, g, w in (("residual", got[0], want[0]), ("next norm", got[1], want[1])):
        if w is None:
            if g is not None:
                raise AssertionError(f"{what}: a next norm without its weight")
            continue
        diff = (g.float() - w.float()).abs()
        if not bool((diff <= atol + rtol * w.float().abs()).all()):
            raise AssertionError(f"{what}: {name} differs by up to {float(diff.max()):.3e}")
    left = pm.sync_buffer(torch.device(device))
    if int(left.abs().sum()):
        raise AssertionError(f"{what}: queue and counters left at {left.tolist()}")


def check_layers(device: str, dtype, atol: float, rtol: float) -> None:
    """A tiny Ouro core's layers on the few-row path agree with and without the persistent MLP (the dispatch in
    :meth:`executor.ops.Ops.mlp`, the norms between layers and the last layer's missing next norm)."""
    from executor.ops import Ops

    from .helpers import tiny_arch, tiny_model

    model = tiny_model(tiny_arch("ouro"), device=device, dtype=dtype, backend="torch")
    config = model.config
    attn = lambda qkv, layer, qb, kb: qkv[:, : config.heads * config.head_dim].contiguous()  # noqa: E731
    x = torch.randn(3, config.hidden, device=device, dtype=dtype)
    model.ops = Ops("triton", few_rows=4)
    want = model.run_layers(model.core_layers, x, attn, 0, model.final_norm)
    model.ops.persistent_mlp = True
    got = model.run_layers(model.core_layers, x, attn, 0, model.final_norm)
    for g, w in zip(got, want, strict=True):
        diff = (g.float() - w.float()).abs()
        if not bool((diff <= atol + rtol * w.float().abs()).all()):
            raise AssertionError(f"layers with the persistent MLP differ by up to {float(diff.max()):.3e}")


def checks(device: str = "cpu", dtype=None, atol: float = 1e-4, rtol: float = 1e-4,
           graph: bool = False) -> dict[str, Callable]:
    """Both norm styles, with and without the next norm; one, a few and the most rows (row tiles of 16 to 64);
    ragged tiles and K chunks; one program doing every item, and more programs than items."""
    from executor import persistent_mlp as pm
    from executor.few_rows import MAX_ROWS

    dtype = dtype or torch.float32
    small = pm.MlpConfig(bn_a=16, bk_a=32, bn_b=16, bk_b=32, num_warps=4, stages_a=2, stages_b=2)
    cases = {
        "ouro": [(m, 40, 72, True, True, small, None) for m in (1, 3, 17, MAX_ROWS)],
        "huginn": [(4, 48, 80, False, True, small, 1), (2, 40, 56, False, False, small, 64)],
        "default": [(5, 64, 96, True, False, None, None)],
    }
    out = {name: lambda cs=cs: [check_mlp(*c, device, dtype, atol, rtol, graph) for c in cs]
           for name, cs in cases.items()}
    out["layers"] = lambda: check_layers(device, dtype, atol, rtol)
    return out


def _main() -> int:
    return report_checks(checks())


@pytest.fixture(scope="module")
def interpreted() -> dict[str, str]:
    return run_interpreted("tests.executor.test_executor_persistent_mlp")


@pytest.mark.parametrize("name", ["ouro", "huginn", "default", "layers"])
def test_kernel_under_the_interpreter(interpreted: dict[str, str], name: str) -> None:
    assert interpreted.get(name) == "ok", interpreted.get(name, "not run")


def test_every_check_is_collected() -> None:
    assert sorted(checks()) == ["default", "huginn", "layers", "ouro"]


def test_bad_shapes_are_refused_before_any_launch() -> None:
    from executor import persistent_mlp as pm
    from executor.few_rows import MAX_ROWS

    h = torch.zeros(2, 8)
    with pytest.raises(ValueError, match="do not fit"):
        pm.mlp(h, h, torch.zeros(12, 8), torch.zeros(8, 5), torch.ones(8), None, 1e-6, True)
    with pytest.raises(ValueError, match=f"1..{MAX_ROWS}"):
        big = torch.zeros(MAX_ROWS + 1, 8)
        pm.mlp(big, big, torch.zeros(12, 8), torch.zeros(8, 6), torch.ones(8), None, 1e-6, True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_kernel_on_the_gpu_in_bfloat16(graph: bool) -> None:
    for fn in checks("cuda", torch.bfloat16, atol=3e-2, rtol=3e-2, graph=graph).values():
        fn()


if __name__ == "__main__":
    import sys

    sys.exit(_main())

"""The L2 prefetch kernel (:mod:`executor.l2_prefetch`): its setting, its CPU no-op, and its sm_90 compile."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from executor import l2_prefetch, sm90  # noqa: E402
from executor.ops import Ops  # noqa: E402

SIGNATURE = {"A": "*bf16", "A_ROWS": "i32", "A_ROW_BYTES": "i32", "A_BYTES": "i32", "B": "*bf16", "B_ROWS": "i32",
             "B_ROW_BYTES": "i32", "B_BYTES": "i32", "A_PROGRAMS": "i32"}


@pytest.mark.parametrize("env,expected", [("", None), ("0", None), ("off", None), ("4096,1024", (4096, 1024)),
                                          (" 0,512 ", (0, 512))])
def test_setting_reads_bytes_per_row(monkeypatch: pytest.MonkeyPatch, env: str, expected) -> None:
    monkeypatch.setenv("CDBSIM_L2_PREFETCH", env)
    assert l2_prefetch.setting() == expected


@pytest.mark.parametrize("env", ["4096", "a,b", "1,2,3", "-16,0"])
def test_a_malformed_setting_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch, env: str) -> None:
    monkeypatch.setenv("CDBSIM_L2_PREFETCH", env)
    with pytest.raises(ValueError, match="CDBSIM_L2_PREFETCH") as err:
        l2_prefetch.setting()
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("fused", [False, True])
def test_layers_prefetch_o_and_gate_up_on_their_own_paths_only(fused: bool) -> None:
    """Every layer of a launch on the chained or few-row path asks for its O and gate/up weights; a launch on
    the plain path does not, and the layers compute the same either way."""
    from tests.executor.helpers import tiny_arch, tiny_model

    model = tiny_model(tiny_arch("ouro"))
    model.ops = Ops("torch", fuse_rows=1 if fused else 0, few_rows=0 if fused else 4)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    rows = 1 if fused else 3
    x = torch.randn(rows, model.config.hidden)
    attn = lambda qkv, layer, qb, kb: qkv[:, : model.config.heads * model.config.head_dim]  # noqa: E731
    plain, _ = model.run_layers(model.core_layers, x, attn, 0, None)
    model.ops._prefetch = lambda wo, gu: seen.append((wo, gu))
    got, _ = model.run_layers(model.core_layers, x, attn, 0, None)
    assert torch.equal(got, plain)
    assert [(wo.data_ptr(), gu.data_ptr()) for wo, gu in seen] == [
        (layer.wo.data_ptr(), layer.w_gate_up.data_ptr()) for layer in model.core_layers]
    seen.clear()
    model.run_layers(model.core_layers, torch.randn(5, model.config.hidden), attn, 0, None)  # past both cuts
    assert not seen


def test_prefetch_is_a_no_op_off_cuda() -> None:
    w = torch.randn(8, 32, dtype=torch.bfloat16)
    assert l2_prefetch.prefetch(w, 64, w, 32) is None and Ops("torch")._prefetch is None


def test_the_kernel_compiles_for_sm90_with_the_bulk_prefetch() -> None:
    if not sm90.available():
        pytest.skip("this Triton has no NVIDIA compiler")
    kernel = sm90.compile_sm90(l2_prefetch._l2_prefetch_kernel, SIGNATURE,
                               {"ROWS": l2_prefetch.ROWS_PER_PROGRAM, "PDL": True}, num_warps=2)
    ptx = kernel.asm["ptx"]
    assert ptx.count("cp.async.bulk.prefetch.L2.global") == 2  # one per weight's branch
    assert ptx.index("griddepcontrol.launch_dependents") < ptx.index("griddepcontrol.wait")
    assert sm90.resources(kernel).stack == 0

"""The prefill benchmarks' saved tables re-read on a CPU: the rates their summaries print, and that the
shipped launch shapes are among the ones the committed sweep measured."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def _script(name: str):
    """A benchmark script imported as a module (benchmarks/ is not a package)."""
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prefill_profile_rates_add_attention_flops_to_the_weights() -> None:
    profile = _script("profile_prefill")
    saved = pd.read_csv(RESULTS / "prefill-profile" / "prefill-profile.csv")
    table = profile.with_rates(saved)
    # the weight-only rates are the ones the GPU run wrote
    assert table.weight_tflops_launch.to_numpy() == pytest.approx(saved.weight_tflops_launch.to_numpy(), rel=1e-9)
    assert table.weight_tflops_gemm.to_numpy() == pytest.approx(saved.weight_tflops_gemm.to_numpy(), rel=1e-9)
    for (model, tokens), rows in table.groupby(["model", "tokens"]):
        extra = profile.attention_flops(model, tokens) / profile.weight_flops(model, tokens)
        assert rows.model_tflops_launch.iloc[0] == pytest.approx(rows.weight_tflops_launch.iloc[0] * (1 + extra))
    # causal work grows with the square of the chunk: twice the tokens, four times the attention
    assert profile.attention_flops("ouro-1.4b", 4096) / profile.attention_flops("ouro-1.4b", 2048) == \
        pytest.approx(4, rel=1e-3)


def test_prefill_rates_of_a_stage_table_hold_replayed_launches_against_the_fastest_gemm() -> None:
    profile = _script("profile_prefill")
    peak = profile.gemm_peak_tflops(ROOT / "calibration" / "profiles" / "h200-kernels.json")
    assert 500 < peak < 1000  # an H200's bf16 dense matmul, TFLOP/s
    stages = pd.read_csv(RESULTS / "executor-table" / "stages" / "stages.csv")
    rates = profile.stage_rates(stages, peak)
    assert len(rates) == (stages.stage == "prefill").sum() > 0
    for row in rates.itertuples():
        assert row.weight_tflops == pytest.approx(profile.weight_flops(row.model, row.tokens) / row.ms / 1e9)
        assert row.of_peak == pytest.approx(row.weight_tflops / peak)
        assert row.model_tflops > row.weight_tflops  # causal attention adds flops


def test_prefill_rates_refuse_a_missing_file_or_a_table_without_prefill_rows(tmp_path, capsys) -> None:
    profile = _script("profile_prefill")
    assert profile.main(["--stages", str(tmp_path / "none.csv")]) == 2
    assert "is not a file" in capsys.readouterr().err
    other = RESULTS / "prefill-profile" / "prefill-profile.csv"  # a profile table, not a stage table
    assert profile.main(["--stages", str(other)]) == 2
    assert "has no prefill rows" in capsys.readouterr().err


def test_prefill_attention_sweep_measured_every_shipped_launch_shape(capsys) -> None:
    bench = _script("bench_prefill_attention")
    table = pd.read_csv(RESULTS / "prefill-attention" / "prefill-attention.csv")
    bench.summarize(table)
    blocks = capsys.readouterr().out.strip().split("\n\n")
    assert len(blocks) == table["shape"].nunique()
    for block in blocks:
        assert sum(line.startswith("*") for line in block.splitlines()) == 1, block

"""``cdbsim record``: tiny checkpoints in the authors' layout, real prompts, the model's own exit rule, a trace that
``predict --trace`` replays."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
tokenizers = pytest.importorskip("tokenizers")

from safetensors.torch import save_file  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from cli import app  # noqa: E402
from executor.gates import hazard_depth, latent_diff_depth  # noqa: E402
from executor.record import Checkpoint, read_prompts, record  # noqa: E402
from traces import read_trace  # noqa: E402

from .test_executor_loader import HEADS, INTER, VOCAB, H, huginn_tensors, ouro_tensors  # noqa: E402

WORDS = [f"w{i}" for i in range(VOCAB - 1)]  # id 0 is the unknown word


def write_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(WORDS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(folder / "tokenizer.json"))


def ouro_checkpoint(folder: Path, eos: int | None = None, tokenizer: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file(ouro_tensors(2, 2, torch.Generator().manual_seed(0)), str(folder / "model.safetensors"))
    config = {"model_type": "ouro", "hidden_size": H, "num_attention_heads": HEADS, "num_key_value_heads": 2,
              "intermediate_size": INTER, "vocab_size": VOCAB, "num_hidden_layers": 2, "total_ut_steps": 3,
              "tie_word_embeddings": False, "rope_theta": 1e6, "rms_norm_eps": 1e-6, "eos_token_id": eos}
    (folder / "config.json").write_text(json.dumps(config))
    if tokenizer:
        write_tokenizer(folder)
    return folder


def huginn_checkpoint(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file(huginn_tensors(1, 2, 1, torch.Generator().manual_seed(1)), str(folder / "model.safetensors"))
    config = {"model_type": "huginn_raven", "n_embd": H, "n_heads": HEADS, "intermediate_size": INTER,
              "padded_vocab_size": VOCAB, "n_layers_in_prelude": 1, "n_layers_in_recurrent_block": 2,
              "n_layers_in_coda": 1, "tie_embeddings": True, "rope_base": 10000.0, "norm_eps": 1e-6}
    (folder / "config.json").write_text(json.dumps(config))
    write_tokenizer(folder)
    return folder


def prompts_file(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


PROMPTS = [{"text": "w5 w17 w3 w42"}, {"token_ids": [9, 8, 7, 6, 5, 4]}, {"prompt": "w1 w2"}]


def test_record_writes_a_trace_that_predict_replays(tmp_path: Path) -> None:
    folder = ouro_checkpoint(tmp_path / "ouro")
    prompts = prompts_file(tmp_path / "p.jsonl", PROMPTS)
    trace, outputs = tmp_path / "trace.csv", tmp_path / "out.jsonl"
    runner = CliRunner()
    result = runner.invoke(app, ["record", "--checkpoint", str(folder), "--prompts", str(prompts), "--q", "0.5",
                                 "--out", str(trace), "--outputs", str(outputs), "--max-new-tokens", "6",
                                 "--device", "cpu"])
    assert result.exit_code == 0, result.output
    requests = read_trace(trace, r_max=3)
    assert [r.prompt_len for r in requests] == [4, 6, 2] and all(r.output_len == 6 for r in requests)
    assert all(len(r.depths) == 5 and set(r.depths.tolist()) <= {1, 2, 3} for r in requests)
    lines = [json.loads(line) for line in outputs.read_text().splitlines()]
    assert all(len(line["token_ids"]) == 6 and isinstance(line["text"], str) for line in lines)
    predicted = runner.invoke(app, ["predict", "--hf-config", str(folder / "config.json"), "--trace", str(trace),
                                    "--no-baseline", "--kv-tokens", "4096", "--timing", "sync", "--json"])
    assert predicted.exit_code == 0, predicted.output
    assert json.loads(predicted.stdout)["refill K=1"]["requests"] == 3


def test_depths_follow_the_exit_rules_and_the_threshold(tmp_path: Path) -> None:
    ouro = Checkpoint.open(ouro_checkpoint(tmp_path / "ouro"))
    ids = read_prompts(prompts_file(tmp_path / "p.jsonl", PROMPTS), ouro.vocabulary)
    assert ids[0] == [6, 18, 4, 43] and ids[2] == [2, 3]  # the tokenizer's ids
    early = record(ouro, ids, 1e-9, max_new_tokens=5)
    late = record(ouro, ids, 1.0, max_new_tokens=5)
    assert all((r.depths == 1).all() for r in early.requests)  # any exit probability reaches q ~ 0 at loop 1
    assert all((r.depths == 3).all() for r in late.requests)  # q = 1 is reached only by the last loop
    assert [r.depths.tolist() for r in early.requests] != [r.depths.tolist() for r in late.requests]
    assert hazard_depth([0.0, 0.0, 0.0], 0.5) == 1 and hazard_depth([0.0, 0.0, 0.0], 0.75) == 2  # 1/2, then 3/4
    assert latent_diff_depth([0.9, 0.2, 0.05], 0.1) == 3 and latent_diff_depth([0.9, 0.2, 0.05], 0.5) == 2
    huginn = Checkpoint.open(huginn_checkpoint(tmp_path / "huginn"), r_max=3)
    assert huginn.arch.r_max == 3 and huginn.arch.prelude == 1
    stays = record(huginn, ids, 0.0, max_new_tokens=4)  # a relative change is never below 0: every loop runs
    assert all((r.depths == 3).all() for r in stays.requests)
    leaves = record(huginn, ids, 1e9, max_new_tokens=4)
    assert all((r.depths == 1).all() for r in leaves.requests)


def test_end_of_sequence_ends_a_request(tmp_path: Path) -> None:
    ids = [[5, 17, 3, 42]]
    full = record(Checkpoint.open(ouro_checkpoint(tmp_path / "a")), ids, 0.5, max_new_tokens=6)
    eos = full.outputs[0][2]
    stopped = record(Checkpoint.open(ouro_checkpoint(tmp_path / "b", eos=eos)), ids, 0.5, max_new_tokens=6)
    first = full.outputs[0].index(eos) + 1
    assert stopped.outputs[0] == full.outputs[0][:first] and stopped.requests[0].output_len == first
    np.testing.assert_array_equal(stopped.requests[0].depths, full.requests[0].depths[: first - 1])


@pytest.mark.parametrize("rows,message", [
    (["{not json"], "p.jsonl:1: not JSON"),
    ([json.dumps({"words": "w1"})], "p.jsonl:1: expected an object with one of text, prompt, token_ids"),
    ([json.dumps({"token_ids": [1, 500]})], "p.jsonl:1: token ids must lie in [0, 101)"),
    ([json.dumps({"token_ids": "abc"})], "p.jsonl:1: token_ids must be a list of integers"),
    ([json.dumps({"text": "w1"}), json.dumps({"text": ""})], "p.jsonl:2: an empty prompt"),
])
def test_bad_prompts_are_one_line_naming_file_and_line(tmp_path: Path, rows: list[str], message: str) -> None:
    folder = ouro_checkpoint(tmp_path / "ouro")
    (tmp_path / "p.jsonl").write_text("\n".join(rows) + "\n")
    result = CliRunner().invoke(app, ["record", "--checkpoint", str(folder), "--prompts", str(tmp_path / "p.jsonl"),
                                      "--q", "0.5", "--out", str(tmp_path / "t.csv"), "--device", "cpu"])
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.output
    assert not (tmp_path / "t.csv").exists()


def test_text_needs_the_tokenizer_and_a_folder_needs_its_config(tmp_path: Path) -> None:
    folder = ouro_checkpoint(tmp_path / "ouro", tokenizer=False)
    opened = Checkpoint.open(folder)
    with pytest.raises(ValueError, match=r"needs the checkpoint's tokenizer\.json"):
        read_prompts(prompts_file(tmp_path / "p.jsonl", [{"text": "w1"}]), opened.vocabulary)
    assert read_prompts(prompts_file(tmp_path / "q.jsonl", [{"token_ids": [3, 4]}]), opened.vocabulary) == [[3, 4]]
    (folder / "config.json").unlink()
    with pytest.raises(ValueError, match=r"no config\.json"):
        Checkpoint.open(folder)
    csv = tmp_path / "p.csv"
    csv.write_text("token_ids\n3 4 5\n")
    assert read_prompts(csv, opened.vocabulary) == [[3, 4, 5]]


def test_the_batched_outputs_are_the_reference_decoders_on_the_given_prompts(tmp_path: Path) -> None:
    from cdbsim.model.arch import KVLayout
    from executor.reference import ReferenceDecoder

    ouro = Checkpoint.open(ouro_checkpoint(tmp_path / "ouro"))
    prompts = [[5, 17, 3, 42], [9, 8, 7, 6, 5, 4, 3, 2, 1]]
    got = record(ouro, prompts, 0.5, max_new_tokens=5).outputs
    for prompt, tokens in zip(prompts, got, strict=True):
        want = ReferenceDecoder(ouro.model, KVLayout.DEPTH).generate(prompt, 5, [3] * 4).tokens
        assert tokens == [int(t) for t in want]


def test_validate_and_calibrate_take_a_checkpoint_folder(tmp_path: Path) -> None:
    from calibration.validation import CheckpointRun, OneModel
    from executor.loader import to_public

    folder = ouro_checkpoint(tmp_path / "ouro")
    model = OneModel(CheckpointRun(folder), device="cpu")(Checkpoint.open(folder).arch)  # the folder's weights
    saved = ouro_tensors(2, 2, torch.Generator().manual_seed(0))
    assert all(torch.equal(to_public(model)[name], tensor) for name, tensor in saved.items())
    assert OneModel(CheckpointRun(folder)).weights == f"checkpoint {folder}" and OneModel().weights == "random (seed 0)"
    runner = CliRunner()
    for args, message in [
        (["validate", "--checkpoint", str(folder), "--arch", "ouro-1.4b"], "its config.json is the architecture; "
                                                                          "drop --arch"),
        (["validate", "--checkpoint", str(tmp_path / "none")], "not a model folder with a config.json"),
        (["validate", "--checkpoint", str(folder), "--matrix", "m.json"], "a --matrix entry names its own"),
        (["calibrate", "--checkpoint", str(folder), "--arch", "ouro-1.4b"], "names the architecture; drop --arch"),
        (["calibrate", "--checkpoint", str(folder), "--kernels"], "--kernels measures the kernel-level one"),
    ]:
        result = runner.invoke(app, [*args, "--out", str(tmp_path / "out")])
        assert result.exit_code == 2 and message in result.stderr, result.output


def test_record_takes_the_start_state_and_bad_checkpoint_options_are_refused(tmp_path: Path) -> None:
    from executor.gates import teacher_forced_values

    folder, ouro = huginn_checkpoint(tmp_path / "huginn"), ouro_checkpoint(tmp_path / "ouro")
    prompts = prompts_file(tmp_path / "p.jsonl", PROMPTS)
    trace, outputs = tmp_path / "t.csv", tmp_path / "o.jsonl"
    runner = CliRunner()
    result = runner.invoke(app, ["record", "--checkpoint", str(folder), "--prompts", str(prompts), "--q", "0.8",
                                 "--out", str(trace), "--outputs", str(outputs), "--max-new-tokens", "4", "--r-max",
                                 "4", "--device", "cpu", "--state-init", "random", "--state-seed", "3"])
    assert result.exit_code == 0, result.output
    opened = Checkpoint.open(folder, r_max=4, state_init="random", state_seed=3)
    ids = read_prompts(prompts, opened.vocabulary)
    want = record(opened, ids, 0.8, max_new_tokens=4)
    assert [json.loads(line)["token_ids"] for line in outputs.read_text().splitlines()] == want.outputs
    assert [r.depths.tolist() for r in read_trace(trace, r_max=4)] == [r.depths.tolist() for r in want.requests]
    zeros = Checkpoint.open(folder, r_max=4)
    # from zeros the first loop's relative change is exactly 1; from the random start it is not
    assert (teacher_forced_values(zeros.model, ids[0], want.outputs[0], "latent-diff")[:, 0] == 1.0).all()
    assert (teacher_forced_values(opened.model, ids[0], want.outputs[0], "latent-diff")[:, 0] != 1.0).all()
    base = ["--prompts", str(prompts), "--q", "0.5", "--out", str(tmp_path / "x.csv"), "--device", "cpu"]
    for args, message in [
        (["record", "--checkpoint", str(ouro), *base, "--state-init", "random"], "starts from its prelude output"),
        (["record", "--checkpoint", str(folder), *base, "--state-seed", "3"], "--state-seed goes with --state-init "
                                                                            "random"),
        (["record", "--checkpoint", str(folder), *base, "--state-init", "uniform"], "must be one of zeros, random"),
        (["validate", "--live-q", "0.5"], "--live-q: run a checkpoint; give --checkpoint"),
        (["validate", "--checkpoint", str(ouro), "--criterion", "hazard"], "give --live-q"),
        (["validate", "--checkpoint", str(ouro), "--live-q", "0.5", "--criterion", "exit"], "unknown exit criterion"),
        (["validate", "--checkpoint", str(ouro), "--live-q", "0.5", "--prompts", str(prompts)], "give --trace too"),
        (["validate", "--checkpoint", str(ouro), "--state-init", "random"], "starts from its prelude output"),
    ]:
        result = runner.invoke(app, [*args, "--out", str(tmp_path / "out")] if args[0] == "validate" else args)
        assert result.exit_code == 2 and message in result.stderr, (args, result.output)

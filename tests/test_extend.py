"""`longctx extend` (longctx/extend/): a tiny Qwen3 trained at 2x its length on CPU.

The model is the `tiny` preset with a 1k-vocabulary BPE (the full-vocabulary loss would dominate the
run time), trained at 512 tokens after being "pretrained" at 256, on the built-in synthetic corpus.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from safetensors.torch import load_file

from longctx.cli.main import cli
from longctx.core.errors import InputError
from longctx.extend import loop
from longctx.extend.loop import extend, work_dir
from longctx.extend.loss import IGNORE_INDEX, chunked_cross_entropy
from longctx.extend.model import make_training_module
from longctx.extend.plan import check_parallelism, lr_multiplier, resolve_plan
from longctx.extend.settings import ExtendSettings
from longctx.init.checkpoint import init_checkpoint
from longctx.init.settings import InitSettings

SEQ_LEN = 512  # 2x the checkpoints' max_position_embeddings


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """{"baseline": dir, "headwise": dir}: tiny preset, BPE vocabulary 1024, trained length 256."""
    root = tmp_path_factory.mktemp("extend-ckpt")
    base = root / "baseline"
    init_checkpoint(InitSettings(output=str(base), preset="tiny", attention="baseline", tokenizer="bpe", vocab_size=1024,
                                 config={"max_position_embeddings": 256}))
    gated = root / "headwise"
    init_checkpoint(InitSettings(output=str(gated), preset="tiny", attention="headwise", tokenizer=str(base),
                                 config={"max_position_embeddings": 256}))
    return {"baseline": base, "headwise": gated}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("extend-cache")


def _settings(ckpt: Path, out: Path, cache: Path, **kw) -> ExtendSettings:
    values = dict(checkpoint=str(ckpt), output=str(out), seq_len=SEQ_LEN, data=["synthetic:mixed"], rope_base=1e5,
                  steps=8, tokens_per_step=2 * SEQ_LEN, lr=3e-3, warmup_fraction=0.25, cache_dir=str(cache))
    return ExtendSettings(**{**values, **kw})


def _log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / loop.LOG_FILE).read_text().splitlines()]


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(out / "model.safetensors")


# --- training end to end -------------------------------------------------------------------------


@pytest.mark.slow
def test_extend_trains_and_writes_a_longer_checkpoint(checkpoints, cache, tmp_path):
    from transformers import AutoModelForCausalLM

    from longctx.rope.config import read_rope
    from longctx.yarn.scaling import apply_yarn

    out = tmp_path / "ext"
    r = extend(_settings(checkpoints["baseline"], out, cache), progress=False)
    assert r.output == out and r.steps == 8 and r.tokens == 8 * 2 * SEQ_LEN
    log = _log(out)
    assert [e["step"] for e in log] == list(range(1, 9))
    assert set(log[0]) >= {"step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s", "seconds"}
    first, last = (log[0]["loss"] + log[1]["loss"]) / 2, (log[-2]["loss"] + log[-1]["loss"]) / 2
    assert last < first - 0.3, [e["loss"] for e in log]
    assert math.isclose(r.final_loss, log[-1]["loss"], rel_tol=1e-5)
    # warmup 2 steps, then cosine towards lr x 0.1
    assert [round(e["lr"] / 3e-3, 6) for e in log[:3]] == [0.5, 1.0, 1.0]
    assert log[-1]["lr"] < log[3]["lr"]

    cfg = json.loads((out / "config.json").read_text())
    rope = read_rope(cfg)
    assert (rope.theta, rope.max_position_embeddings, rope.rope_type) == (100000, SEQ_LEN, "default")
    # `longctx yarn` takes the extended length as YaRN's original length
    assert apply_yarn(cfg, 4.0).rope.original_max_position_embeddings == SEQ_LEN
    src = checkpoints["baseline"]
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (out / name).read_bytes() == (src / name).read_bytes()
    prov = json.loads((out / "longctx.json").read_text())
    assert prov["verb"] == "extend" and prov["args"]["plan"]["steps"] == 8 and prov["source_fingerprint"]
    # the weights changed and load back into transformers
    trained, before = _weights(out), _weights(src)
    assert set(trained) == set(before)
    assert not torch.equal(trained["model.layers.0.mlp.up_proj.weight"], before["model.layers.0.mlp.up_proj.weight"])
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.max_position_embeddings == SEQ_LEN
    assert (work_dir(out) / "step-000008" / "state.json").is_file()


class _Interrupted(Exception):
    pass


@pytest.mark.slow
def test_resume_after_interruption_equals_an_uninterrupted_run(checkpoints, cache, tmp_path, monkeypatch):
    s = dict(steps=5, save_every=2, micro_batch_size=1)
    straight = tmp_path / "straight"
    extend(_settings(checkpoints["baseline"], straight, cache, **s), progress=False)

    resumed = tmp_path / "resumed"
    real_save = loop.save_training_state

    def save_then_crash(acc, module, optimizer, scheduler, work, step, plan):
        path = real_save(acc, module, optimizer, scheduler, work, step, plan)
        if step == 4:  # killed right after the second checkpoint, steps 5.. never ran
            raise _Interrupted
        return path

    monkeypatch.setattr(loop, "save_training_state", save_then_crash)
    with pytest.raises(_Interrupted):
        extend(_settings(checkpoints["baseline"], resumed, cache, **s), progress=False)
    monkeypatch.undo()
    assert not resumed.exists() and sorted(p.name for p in work_dir(resumed).glob("step-*")) == ["step-000004"]

    # starting again without --resume is refused; a changed setting is named
    with pytest.raises(InputError, match="--resume to continue"):
        extend(_settings(checkpoints["baseline"], resumed, cache, **s), progress=False)
    with pytest.raises(InputError, match=r"lr 0\.003 -> 0\.002.*seq_len|seq_len.*lr 0\.003 -> 0\.002"):
        extend(_settings(checkpoints["baseline"], resumed, cache, **{**s, "lr": 2e-3, "seq_len": 256}, resume=True),
              progress=False)

    # the resumed run reloads weights, AdamW moments, schedule, RNG and data cursor: same result
    extend(_settings(checkpoints["baseline"], resumed, cache, **s, resume=True), progress=False)
    a, b = _weights(straight), _weights(resumed)
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=1e-6, msg=name)
    la, lb = _log(straight), _log(resumed)
    assert [e["step"] for e in lb] == [1, 2, 3, 4, 5]
    for ea, eb in zip(la, lb):
        assert math.isclose(ea["loss"], eb["loss"], rel_tol=1e-5) and math.isclose(ea["lr"], eb["lr"], rel_tol=1e-9)

    # killed while writing the output: --resume finds the final state and only writes the output again
    shutil.rmtree(resumed)
    r = extend(_settings(checkpoints["baseline"], resumed, cache, **s, resume=True), progress=False)
    assert r.final_loss == lb[-1]["loss"] and _log(resumed) == lb
    assert torch.equal(_weights(resumed)["model.norm.weight"], b["model.norm.weight"])


@pytest.mark.slow
def test_gated_model_trains(checkpoints, cache, tmp_path):
    from transformers import AutoModelForCausalLM

    from longctx.models.gated_qwen3 import GatedQwen3ForCausalLM

    out = tmp_path / "gated"
    extend(_settings(checkpoints["headwise"], out, cache, steps=6), progress=False)
    log = _log(out)
    assert log[-1]["loss"] < log[0]["loss"] - 0.3, [e["loss"] for e in log]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["headwise_attn_output_gate"] is True and cfg["max_position_embeddings"] == SEQ_LEN
    model = AutoModelForCausalLM.from_pretrained(out)
    assert isinstance(model, GatedQwen3ForCausalLM)
    gate = "model.layers.0.self_attn.g_proj.weight"  # the output gate's projection is trained too
    assert not torch.equal(_weights(out)[gate], _weights(checkpoints["headwise"])[gate])


# --- packing, loss -------------------------------------------------------------------------------


def test_attention_does_not_cross_documents_in_a_pack(checkpoints):
    """Document masking as the loop runs the model: position_ids restarting at 0 and attention_mask=None
    make transformers build a block-diagonal mask (masking_utils.find_packed_sequence_indices)."""
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(checkpoints["baseline"], attn_implementation="sdpa").eval()
    module = make_training_module(lm)
    g = torch.Generator().manual_seed(0)
    doc_a, doc_a2 = torch.randint(3, 1000, (2, 40), generator=g)
    doc_b = torch.randint(3, 1000, (60,), generator=g)
    restart = torch.cat([torch.arange(40), torch.arange(60)])[None]
    continuous = torch.arange(100)[None]

    def logits(doc_a, positions):
        with torch.no_grad():
            hidden = module.hidden_states(torch.cat([doc_a, doc_b])[None], positions)
            return lm.get_output_embeddings()(hidden)[0, 40:]

    torch.testing.assert_close(logits(doc_a, restart), logits(doc_a2, restart), rtol=0, atol=1e-5)
    # control: without document boundaries the earlier document does change the later one
    assert (logits(doc_a, continuous) - logits(doc_a2, continuous)).abs().max() > 1e-2


def test_chunked_cross_entropy_equals_full_cross_entropy():
    """Value and gradients equal transformers' ForCausalLMLoss (given shift_labels) times the token count."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 300, 32, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(100, 32, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 100, (2, 300), generator=g)
    labels[0, 17:40] = IGNORE_INDEX
    labels[1, -1] = IGNORE_INDEX
    n = int((labels != IGNORE_INDEX).sum())

    chunked = chunked_cross_entropy(hidden, weight, labels, chunk_tokens=64)
    grads = torch.autograd.grad(chunked, (hidden, weight))
    full = ForCausalLMLoss(hidden @ weight.T, labels=None, vocab_size=100, shift_labels=labels) * n
    full_grads = torch.autograd.grad(full, (hidden, weight))
    torch.testing.assert_close(chunked, full.float(), rtol=1e-6, atol=1e-5)
    direct = F.cross_entropy((hidden @ weight.T).reshape(-1, 100), labels.reshape(-1), reduction="sum")
    torch.testing.assert_close(chunked, direct.float(), rtol=1e-6, atol=1e-5)
    for got, want in zip(grads, full_grads):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def _autograd_cross_entropy(hidden, weight, labels):
    """The loss with autograd's own backward, in the dtypes autocast gives F.linear: the gradients' oracle."""
    logits = F.linear(hidden.reshape(-1, hidden.shape[-1]), weight).float()
    return F.cross_entropy(logits, labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum")


@pytest.mark.parametrize("case", ["bf16-autocast", "frozen-weight", "no-grad", "bf16-model"])
def test_chunked_cross_entropy_gradients_follow_autocast_frozen_weights_and_no_grad(case):
    """The gradients made in the forward are autograd's: under bf16 autocast (a GPU's training step), with the LM
    head frozen, for a bf16 model; without grad the loss is the same and nothing is kept for a backward."""
    g = torch.Generator().manual_seed(1)
    dtype = torch.bfloat16 if case == "bf16-model" else torch.float32
    hidden = torch.randn(3, 50, 16, generator=g).to(dtype).requires_grad_(case != "no-grad")
    weight = torch.randn(70, 16, generator=g).to(dtype).requires_grad_(case not in ("frozen-weight", "no-grad"))
    labels = torch.randint(0, 70, (3, 50), generator=g)
    labels[1, :9] = IGNORE_INDEX
    inputs = [t for t in (hidden, weight) if t.requires_grad]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=case == "bf16-autocast"):
        got = chunked_cross_entropy(hidden, weight, labels, chunk_tokens=32)
        want = _autograd_cross_entropy(hidden, weight, labels)
    tol = {"rtol": 2e-2, "atol": 2e-2} if case.startswith("bf16") else {"rtol": 1e-5, "atol": 1e-4}
    torch.testing.assert_close(got, want, **tol)
    if case == "no-grad":
        assert got.grad_fn is None
        return
    for a, b in zip(torch.autograd.grad(got * 0.5, inputs), torch.autograd.grad(want * 0.5, inputs)):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, **tol)


# --- resolved numbers ------------------------------------------------------------------------------


def test_plan_rounds_tokens_per_step_to_whole_sequences_across_ranks():
    s = ExtendSettings(checkpoint="c", output="o", seq_len=32768, data=["d"], tokens=80 * 10**9)
    p = resolve_plan(s, world_size=8)
    assert (p.accumulation, p.sequences_per_step, p.tokens_per_step) == (16, 128, 4 * 1024 * 1024)
    assert p.steps == math.ceil(80 * 10**9 / (4 * 1024 * 1024)) and p.warmup_steps == round(0.1 * p.steps)
    # a short run: the default tokens per step is capped so that it still has ~20 steps
    short = resolve_plan(ExtendSettings(checkpoint="c", output="o", seq_len=512, data=["d"], tokens=20 * 2048), 1)
    assert (short.sequences_per_step, short.steps) == (4, 20)
    # context parallelism: 2 ranks share each sequence, so 4 ranks are 2 data-parallel ones
    cp = resolve_plan(ExtendSettings(checkpoint="c", output="o", seq_len=1024, data=["d"], steps=3, cp_size=2,
                                    tokens_per_step=8192, micro_batch_size=2), 4)
    assert (cp.dp_size, cp.accumulation, cp.sequences_per_step) == (2, 2, 8)


def test_lr_schedule_warms_up_then_decays_to_min_ratio():
    p = resolve_plan(ExtendSettings(checkpoint="c", output="o", seq_len=8, data=["d"], steps=100), 1)
    lrs = [lr_multiplier(i, p, 0.1) for i in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0) and lrs[10] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:])) and lrs[-1] == pytest.approx(0.1, abs=1e-3)


def test_context_parallel_configuration_errors():
    with pytest.raises(InputError, match="does not divide the world size 2"):
        check_parallelism(3, 2, 4096, cuda=True)
    with pytest.raises(InputError, match="not divisible by 2 x --cp-size"):
        check_parallelism(2, 4, 4098, cuda=True)
    with pytest.raises(InputError, match="needs CUDA GPUs"):
        check_parallelism(2, 2, 4096, cuda=False)
    check_parallelism(2, 4, 4096, cuda=True)
    check_parallelism(1, 3, 4097, cuda=False)


# --- bad inputs through the CLI --------------------------------------------------------------------


@pytest.fixture(scope="module")
def data_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("extend-data")
    (root / "empty.jsonl").write_text("")
    (root / "doc.txt").write_text("river stone lamp garden " * 50)
    return root


@pytest.mark.parametrize("args, message", [
    (["--rope-base", "0"], "must be a finite number > 0"),
    (["--rope-base", "nan"], "must be a finite number > 0"),
    (["--seq-len", "0"], "not a positive length"),
    (["--seq-len", "4k,8k"], "--seq-len takes one length"),
    (["--data", "{data}/missing.txt"], "does not exist"),
    (["--data", "{data}/empty.jsonl"], "no text"),
    (["--cp-size", "2"], "--cp-size 2 does not divide the world size 1"),
    (["--tokens", "1e6"], "exactly one of --tokens"),
    (["--short-fraction", "0.3"], "needs --short-data"),
    (["--tokens-per-step", "4.5"], "whole number"),
    (["--tokenize-workers", "0"], "--tokenize-workers"),
    (["--packing", "tight"], "--packing"),
])
def test_bad_input_is_one_line_exit_2_nothing_written(args, message, checkpoints, data_files, tmp_path):
    base = {"--rope-base": "1e6", "--seq-len": "512", "--data": str(data_files / "doc.txt"), "--steps": "2"}
    argv = ["extend", str(checkpoints["baseline"]), "-o", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "c")]
    given = dict(zip(args[::2], args[1::2]))
    for key, value in {**base, **given}.items():
        argv += [key, value.format(data=data_files)]
    r = CliRunner().invoke(cli, argv)
    assert r.exit_code == 2, (r.output, r.exception)
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.slow
def test_resume_with_other_settings_names_them_on_the_cli(checkpoints, cache, data_files, tmp_path):
    out = tmp_path / "out"
    argv = ["extend", str(checkpoints["baseline"]), "--rope-base", "1e5", "--seq-len", "512", "--data",
            str(data_files / "doc.txt"), "--steps", "1", "--tokens-per-step", "512", "-o", str(out),
            "--cache-dir", str(cache)]
    r = CliRunner().invoke(cli, argv)
    assert r.exit_code == 0, (r.output, r.exception)
    assert (out / "train_log.jsonl").is_file() and "log: " in r.output
    r = CliRunner().invoke(cli, [*argv, "--overwrite", "--resume", "--rope-base", "1e6", "--seed", "3"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "rope_base 100000 -> 1000000" in r.stderr and "seed 0 -> 3" in r.stderr


def test_token_counts_on_the_command_line():
    from longctx.core.units import parse_count

    assert parse_count("80B") == 80 * 10**9 and parse_count("4M") == 128 * 32768 and parse_count("1e9") == 10**9
    assert parse_count("1_000_000") == 10**6 and parse_count("2.5k") == 2560
    for bad in ("0", "-1", "1.5", "nan", "4X"):
        with pytest.raises(ValueError):
            parse_count(bad)

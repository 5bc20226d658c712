"""`longctx extend --attention`: which kernel trains (longctx.extend.model.attention_implementation), the
refusals, and FlexAttention's document mask giving SDPA's loss on a packed batch.

torch has no FlexAttention backward on CPU (torch.nn.attention.flex_attention._validate_device), so on CPU
the loss is compared in a forward pass; the gradient comparison runs on CUDA only.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from click.testing import CliRunner

from longctx.checkpoint.directory import read_config
from longctx.cli.main import cli
from longctx.core.errors import SettingError
from longctx.extend import loop, model
from longctx.extend.model import attention_implementation, load_training_model, make_training_module
from longctx.extend.plan import resolve_plan
from longctx.extend.settings import ExtendSettings


def _choose(monkeypatch, choice, cuda, cp_size=1, flash=False, flex=True):
    monkeypatch.setattr(model, "flash_attn_installed", lambda: flash)
    monkeypatch.setattr(model, "flex_attention_available", lambda: flex)
    return attention_implementation(choice, cuda, cp_size)


# --- the choice ------------------------------------------------------------------------------------


@pytest.mark.parametrize("choice, cuda, cp_size, flash, flex, want, words", [
    ("auto", True, 1, True, True, "flash_attention_2", "flash_attn is installed"),
    ("auto", True, 1, False, True, "flex_attention", "flash_attn is not installed; FlexAttention masks documents"),
    ("auto", True, 1, False, False, "sdpa", "dense seq_len x seq_len document mask is materialised"),
    ("auto", True, 2, True, True, "sdpa", "context parallelism needs SDPA"),
    ("auto", False, 1, True, True, "sdpa", "on CPU"),
    ("flash_attention_2", True, 1, True, False, "flash_attention_2", "asked for"),
    ("flex_attention", True, 1, True, True, "flex_attention", "asked for"),
    ("sdpa", True, 1, True, True, "sdpa", "dense"),
    ("sdpa", True, 4, True, True, "sdpa", "context parallelism"),
    ("sdpa", False, 1, False, False, "sdpa", "asked for"),
])
def test_choice(monkeypatch, choice, cuda, cp_size, flash, flex, want, words):
    attn, reason = _choose(monkeypatch, choice, cuda, cp_size, flash, flex)
    assert attn == want and words in reason, reason
    assert reason.startswith(choice if choice == "auto" else ("asked for", choice)), reason


@pytest.mark.parametrize("choice, cuda, cp_size, flash, flex, words", [
    ("flash_attention_2", False, 1, True, True, "--attention flash_attention_2 needs a CUDA GPU"),
    ("flash_attention_2", True, 1, False, True, "flash_attn is not installed"),
    ("flex_attention", True, 1, True, False, f"torch {torch.__version__} has no FlexAttention"),
    ("flex_attention", False, 1, True, False, "has no FlexAttention"),
    ("flex_attention", False, 1, True, True, "no FlexAttention backward on CPU"),
    ("flex_attention", True, 2, True, True, "does not run with --cp-size 2"),
    ("flash_attention_2", True, 2, True, True, "does not run with --cp-size 2"),
])
def test_refused_choice(monkeypatch, choice, cuda, cp_size, flash, flex, words):
    with pytest.raises(SettingError) as e:
        _choose(monkeypatch, choice, cuda, cp_size, flash, flex)
    assert e.value.owner is ExtendSettings and words in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_probes_on_this_machine():
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    assert model.flex_attention_available() == ((major, minor) >= (2, 5))
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        assert not model.flash_attn_installed()
    else:
        assert model.flash_attn_installed()


def test_plan_log_names_the_attention_and_why():
    s = ExtendSettings(checkpoint="c", output="o", seq_len=512, data=["d"], steps=2)
    lines = []
    loop._log_plan(lines.append, s, plan=resolve_plan(s, 1), dtype="bfloat16", attn="flex_attention",
                   attn_reason="auto: flash_attn is not installed; FlexAttention masks documents without a dense mask",
                   acc=SimpleNamespace(is_fsdp2=False), work=Path("w"))
    assert ("attention flex_attention (auto: flash_attn is not installed; FlexAttention masks documents without a "
            "dense mask)") in lines


# --- refusals through the CLI: one line, exit 2, nothing written --------------------------------------


def _cli(ckpt, tmp_path, *args):
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["extend", str(ckpt), "-o", str(out), "--cache-dir", str(tmp_path / "c"),
                                 "--seq-len", "512", "--data", "synthetic:mixed", "--steps", "1", *args])
    return r, out


def test_flex_attention_where_torch_lacks_it_is_refused(tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr(model, "flex_attention_available", lambda: False)
    r, _ = _cli(tiny_checkpoint, tmp_path, "--attention", "flex_attention")
    assert r.exit_code == 2, (r.output, r.exception)
    assert r.stderr.startswith("Error: --attention flex_attention: torch ") and r.stderr.count("\n") == 1, r.stderr
    assert "has no FlexAttention" in r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
@pytest.mark.parametrize("choice, words", [("flex_attention", "no FlexAttention backward on CPU"),
                                           ("flash_attention_2", "needs a CUDA GPU")])
def test_gpu_only_attention_on_cpu_is_refused(tiny_checkpoint, tmp_path, choice, words):
    r, _ = _cli(tiny_checkpoint, tmp_path, "--attention", choice)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and words in r.stderr, (r.stderr, r.exception)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_the_choice_is_logged_and_recorded(tiny_checkpoint, tmp_path):
    r, out = _cli(tiny_checkpoint, tmp_path, "--attention", "sdpa", "--tokens-per-step", "512")
    assert r.exit_code == 0, (r.output, r.exception)
    assert "attention sdpa (asked for" in r.output, r.output
    args = json.loads((out / "longctx.json").read_text())["args"]
    assert args["attention"] == "sdpa" and args["attention_reason"].startswith("asked for"), args


# --- FlexAttention's document mask = SDPA's ---------------------------------------------------------


DOCUMENTS = [[100, 60, 96], [30, 130, 50, 46]]  # 2 rows x 256 tokens, positions restart at every document


def _batch(device):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 32000, (2, 256), generator=g)
    labels = torch.randint(3, 32000, (2, 256), generator=g)
    restart = torch.stack([torch.cat([torch.arange(n) for n in row]) for row in DOCUMENTS])
    continuous = torch.arange(256).expand(2, -1)  # one causal stream per row: no document mask
    return ids.to(device), labels.to(device), restart.to(device), continuous.to(device)


def _loss(lm, ids, positions, labels, grad):
    module = make_training_module(lm)
    lm.zero_grad()
    with torch.set_grad_enabled(grad):
        loss = module(ids, positions, labels)
    if grad:
        loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in lm.named_parameters()} if grad else None


def _models(ckpt, device):
    cfg = read_config(ckpt)
    return {attn: load_training_model(ckpt, cfg, attn, gradient_checkpointing=False).to(device)
            for attn in ("sdpa", "flex_attention")}


@pytest.mark.slow
def test_flex_attention_masks_documents_like_sdpa(tiny_checkpoint):
    """The summed loss of a packed batch with flex_attention (transformers builds a BlockMask from the restarting
    position_ids) is SDPA's; without the restarts (one causal stream) it is another.

    A random tiny model predicts almost uniformly, so the loss moves little (5e-4 relative) when documents see
    each other; the hidden states show the mask plainly (differences of the size of the states themselves).
    """
    lms = _models(tiny_checkpoint, "cpu")
    assert lms["flex_attention"].config._attn_implementation == "flex_attention"
    ids, labels, restart, continuous = _batch("cpu")
    sdpa, _ = _loss(lms["sdpa"], ids, restart, labels, grad=False)
    flex, _ = _loss(lms["flex_attention"], ids, restart, labels, grad=False)
    causal, _ = _loss(lms["flex_attention"], ids, continuous, labels, grad=False)
    torch.testing.assert_close(flex, sdpa, rtol=1e-5, atol=0)
    assert abs(causal - sdpa) > 1e-4 * sdpa, (float(causal), float(sdpa))  # 10x the tolerance above

    with torch.no_grad():
        hidden = {(attn, name): make_training_module(lms[attn]).hidden_states(ids, positions)
                  for attn, name, positions in [("sdpa", "restart", restart), ("flex_attention", "restart", restart),
                                                ("flex_attention", "continuous", continuous)]}
    want = hidden["sdpa", "restart"]
    torch.testing.assert_close(hidden["flex_attention", "restart"], want, rtol=0, atol=1e-4)
    assert (hidden["flex_attention", "continuous"] - want).abs().max() > 0.1 * want.abs().max()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (FlexAttention has no backward on CPU)")
def test_flex_attention_gradients_equal_sdpa_on_cuda(tiny_checkpoint):
    lms = _models(tiny_checkpoint, "cuda")
    ids, labels, restart, continuous = _batch("cuda")
    sdpa, sdpa_grads = _loss(lms["sdpa"], ids, restart, labels, grad=True)
    flex, flex_grads = _loss(lms["flex_attention"], ids, restart, labels, grad=True)
    causal, _ = _loss(lms["sdpa"], ids, continuous, labels, grad=False)
    torch.testing.assert_close(flex, sdpa, rtol=1e-4, atol=0)
    assert abs(causal - sdpa) > 1e-3 * sdpa, (float(causal), float(sdpa))
    for name, want in sdpa_grads.items():
        torch.testing.assert_close(flex_grads[name], want, rtol=1e-3, atol=1e-5 * float(want.abs().max()), msg=name)

"""`longctx sinks`: first-token attention, M-Act and gate statistics (definitions: Qiu et al. 2025, §4.2-4.3).

The chunked log-sum-exp path is checked against hand-computed values (zero queries give uniform causal
attention, p(token 0 | query i) = 1/(i+1)), against an explicit softmax with soft-capping and a sliding
window, and against transformers' eager attention probabilities (`output_attentions=True`,
`attn_implementation="eager"`) for a baseline, both gated variants, a YaRN checkpoint and every architecture
of tests/architectures.py (sliding windows and Gemma 2's soft-capping included); M-Act against
`output_hidden_states`, which also shows the forward under longctx's attention function is the model's;
gate statistics against `record_gate_scores`.
"""

import json
import math
import random

import pytest
import torch
from architectures import ARCHITECTURES
from click.testing import CliRunner

from longctx.core.errors import InputError
from longctx.report.sinks import plot_sinks, write_sinks_report
from longctx.sinks.attention import Collector, first_token_probs
from longctx.sinks.measure import measure_sinks, token_windows
from longctx.sinks.schema import load_sinks
from longctx.sinks.settings import SinksSettings


def analyze_sinks(checkpoint, out_dir, progress=False, **settings):
    """`longctx sinks` as the CLI runs it: sinks.json, then the report files (sinks.md, sinks.png)."""
    outcome = measure_sinks(SinksSettings(checkpoint=str(checkpoint), output=str(out_dir), **settings), progress)
    write_sinks_report(out_dir)
    return outcome

L = 96  # window length of the model tests: short enough for 2 CPU cores, long enough to chunk


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    """Plain text (a .txt file is one document for iter_documents): random sentences, ~6k tokens."""
    rng = random.Random(0)
    words = "river stone cloud lantern copper meadow signal harbor violet engine orbit candle".split()
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_text(" ".join(f"The {rng.choice(words)} {rng.choice(words)}s near {rng.randint(0, 999)}."
                             for _ in range(1000)))
    return path


def _checkpoint(root, tokenizer_dir, attention, edit=None, **overrides):
    """A tiny `longctx init` checkpoint (trained length 256); `edit(model)` changes weights in place."""
    from transformers import AutoModelForCausalLM

    from longctx.init.checkpoint import init_checkpoint
    from longctx.init.settings import InitSettings

    out = root / f"{attention}-{len(list(root.iterdir()))}"
    init_checkpoint(InitSettings(output=str(out), preset="tiny", attention=attention, tokenizer=str(tokenizer_dir),
                                 config={"max_position_embeddings": 256}))
    if edit is not None:
        model = AutoModelForCausalLM.from_pretrained(out)
        with torch.no_grad():
            edit(model)
        model.save_pretrained(out)
    return out


def _sharpen_gates(model):
    """Spread the gate scores over (0, 1) so that the < 0.1 and < 0.5 fractions are not trivially 0 or 1/2."""
    for layer in model.model.layers:
        layer.self_attn.g_proj.weight.mul_(40)


def test_first_token_probs_equals_softmax_with_gqa():
    torch.manual_seed(0)
    q, k = torch.randn(2, 4, 37, 8) * 2, torch.randn(2, 2, 37, 8) * 2
    scores = q @ k.repeat_interleave(2, dim=1).transpose(-1, -2) * 0.3  # transformers' repeat_kv mapping
    scores.masked_fill_(torch.ones(37, 37, dtype=torch.bool).triu(1), float("-inf"))
    expected = scores.softmax(-1)[..., 0]
    for chunk in (1, 5, 37, None):
        torch.testing.assert_close(first_token_probs(q, k, 0.3, chunk), expected, rtol=1e-5, atol=1e-6)
    # zero queries: every visible key scores 0, so attention is uniform and p(token 0 | i) = 1/(i+1)
    uniform = first_token_probs(torch.zeros(1, 4, 37, 8), k[:1], 0.3, 4)
    torch.testing.assert_close(uniform, (1 / torch.arange(1, 38.0)).expand(1, 4, 37))


def test_first_token_probs_with_softcap_and_sliding_window():
    torch.manual_seed(1)
    n, window, cap = 41, 10, 1.5
    q, k = torch.randn(2, 4, n, 8) * 3, torch.randn(2, 2, n, 8) * 3
    scores = q @ k.repeat_interleave(2, dim=1).transpose(-1, -2) * 0.3
    capped = cap * torch.tanh(scores / cap)  # Gemma 2's soft-cap, before the mask as in its eager attention
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    causal = capped.masked_fill(j > i, float("-inf"))
    # transformers' sliding_window_causal_mask_function: query i sees key j iff 0 <= i - j < window
    windowed = capped.masked_fill((j > i) | (i - j >= window), float("-inf"))
    for chunk in (1, 4, 10, 41, None):
        torch.testing.assert_close(first_token_probs(q, k, 0.3, chunk, softcap=cap), causal.softmax(-1)[..., 0],
                                   rtol=1e-5, atol=1e-6)
        p = first_token_probs(q, k, 0.3, chunk, softcap=cap, window=window)
        torch.testing.assert_close(p, windowed.softmax(-1)[..., 0], rtol=1e-5, atol=1e-6)
        assert (p[..., window:] == 0).all() and (p[..., :window] > 0).all()
    # the cap changes these scores (|s| up to ~10), so the comparison above tests it
    assert not torch.allclose(first_token_probs(q, k, 0.3), causal.softmax(-1)[..., 0], rtol=1e-3)
    # a window no shorter than the input is full causal attention
    torch.testing.assert_close(first_token_probs(q, k, 0.3, 7, window=n), first_token_probs(q, k, 0.3, 7))


@pytest.mark.parametrize("attention", ["baseline", "headwise"])
@pytest.mark.slow
def test_uniform_attention_matches_hand_computed_value(attention, tmp_path, reference_tokenizer_dir, text_file):
    # q_proj = 0 -> q = q_norm(0) = 0 -> uniform causal attention in every layer and head:
    # F-Attn = mean over i = 1..L-1 of 1/(i+1).
    def zero_queries(model):
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.zero_()

    ckpt = _checkpoint(tmp_path, reference_tokenizer_dir, attention, zero_queries)
    r = analyze_sinks(ckpt, tmp_path / "out", data=str(text_file), tokens=2 * L, length=L, chunk=17, progress=False)
    expected = sum(1 / (i + 1) for i in range(1, L)) / (L - 1)
    doc = load_sinks(tmp_path / "out")
    assert doc == json.loads(json.dumps(r.results))
    assert doc["first_token_attention"] == pytest.approx([expected] * 2, rel=1e-6)
    assert sum(doc["first_token_attention_per_head"], []) == pytest.approx([expected] * 8, rel=1e-6)
    assert doc["averages"]["first_token_attention"] == pytest.approx(expected, rel=1e-6)
    # bos: whether the tokenizer puts BOS first (the reference tokenizer, read by transformers 5, adds none)
    assert doc["settings"].items() >= {"windows": 2, "length": L, "tokens_used": 2 * L, "bos": False}.items()
    md = (tmp_path / "out" / "sinks.md").read_text()
    assert "| Model | First-token attn | M-Act | Gate mean | Gate median | Gate <0.1 | Gate <0.5 |" in md
    assert f"| {ckpt.name} | {expected:.3f} |" in md
    if attention == "baseline":
        assert doc["gate"] is None and doc["averages"]["gate_mean"] is None and "no gate" in md
    else:
        assert doc["gate"]["variant"] == "headwise" and "Gate mean per head (headwise)" in md
    assert (tmp_path / "out" / "sinks.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("variant", ["baseline", "elementwise", "headwise", "yarn"])
@pytest.mark.slow
def test_chunked_path_equals_eager_attention(variant, tmp_path, reference_tokenizer_dir, text_file):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from longctx.models.gated_qwen3 import record_gate_scores

    length = L
    if variant == "yarn":
        from longctx.yarn.scaling import yarn_checkpoint
        from longctx.yarn.settings import YarnSettings

        base = _checkpoint(tmp_path, reference_tokenizer_dir, "baseline")
        ckpt = tmp_path / "yarn4x"
        yarn_checkpoint(YarnSettings(checkpoint=str(base), factor=4.0, output=str(ckpt)))
        length = 320  # past the original 256 positions, where YaRN's interpolation acts
    else:
        ckpt = _checkpoint(tmp_path, reference_tokenizer_dir, variant,
                           _sharpen_gates if variant != "baseline" else None)
    r = analyze_sinks(ckpt, tmp_path / "out", data=str(text_file), tokens=3 * length, length=length,
                      batch_size=2, chunk=40, progress=False).results

    windows, _ = token_windows(AutoTokenizer.from_pretrained(ckpt), str(text_file), 3, length)
    model = AutoModelForCausalLM.from_pretrained(ckpt, attn_implementation="eager").eval()
    if variant == "yarn":  # YaRN's attention scaling sits in cos/sin, hence in q and k
        assert model.model.rotary_emb.attention_scaling == pytest.approx(0.1 * torch.log(torch.tensor(4.0)) + 1)
    last_outputs = []
    model.model.layers[-1].register_forward_hook(lambda _m, _i, out: last_outputs.append(out.abs().amax(dim=(1, 2))))
    with torch.no_grad(), record_gate_scores(model) as gates:
        o = model(torch.tensor(windows), output_attentions=True, output_hidden_states=True)

    # F-Attn per layer and head: eager probabilities A[l][:, h, i, 0] averaged over windows and i >= 1
    eager = torch.stack([a[:, :, 1:, 0].mean(dim=(0, 2)) for a in o.attentions])
    per_head = torch.tensor(r["first_token_attention_per_head"])
    torch.testing.assert_close(per_head, eager, rtol=1e-4, atol=1e-6)
    assert r["first_token_attention"] == pytest.approx(eager.mean(1).tolist(), rel=1e-4)
    # M-Act: hidden_states[l + 1] is layer l's output (the last entry is after the final norm, so the
    # last layer's output comes from a hook); max over tokens and channels, mean over windows
    maxima = [h.abs().amax(dim=(1, 2)) for h in o.hidden_states[1:-1]] + last_outputs
    assert r["m_act"] == pytest.approx([m.mean().item() for m in maxima], rel=1e-6)
    assert r["m_act_max"] == pytest.approx([m.max().item() for m in maxima], rel=1e-6)

    if variant in ("baseline", "yarn"):
        assert r["gate"] is None and gates == {}
        return
    g = r["gate"]
    for i, scores in sorted(gates.items()):
        per_head = scores.reshape(*scores.shape[:2], 4, -1).transpose(0, 2).reshape(4, -1)  # (head, values)
        assert g["per_head"]["mean"][i] == pytest.approx(per_head.mean(1).tolist(), rel=1e-5)
        assert g["per_head"]["below_0_1"][i] == pytest.approx((per_head < 0.1).double().mean(1).tolist())
        assert g["per_head"]["below_0_5"][i] == pytest.approx((per_head < 0.5).double().mean(1).tolist())
        assert g["per_head"]["median"][i] == pytest.approx(per_head.median(1).values.tolist(), abs=2e-4)
        assert (g["mean"][i], g["median"][i]) == pytest.approx((scores.mean().item(), scores.median().item()),
                                                               abs=2e-4)
        assert 0.05 < g["below_0_1"][i] < 0.95
    everything = torch.cat([s.flatten() for s in gates.values()])
    a = r["averages"]
    fractions = [(everything < x).double().mean().item() for x in (0.1, 0.5)]
    assert (a["gate_mean"], a["gate_below_0_1"], a["gate_below_0_5"]) == pytest.approx(
        (everything.mean().item(), *fractions))
    assert a["gate_median"] == pytest.approx(everything.median().item(), abs=2e-4)


SLIDING_WINDOWS = {"mistral": [128, 128], "gemma2": [128, None]}  # per layer; others: full attention


def _eager_reference(ckpt, windows, **config):
    """transformers' eager forward of `windows`: per-layer (layer, head) F-Attn from its attention weights,
    per-layer M-Act (mean over windows), and the attention probabilities themselves."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ckpt, attn_implementation="eager", **config).eval()
    last = []
    model.base_model.layers[-1].register_forward_hook(lambda _m, _i, out: last.append(out.abs().amax(dim=(1, 2))))
    with torch.no_grad():
        ids = torch.tensor(windows)
        o = model(ids, labels=ids, output_attentions=True, output_hidden_states=True)
    fta = torch.stack([a[:, :, 1:, 0].mean(dim=(0, 2)) for a in o.attentions])
    m_act = [h.abs().amax(dim=(1, 2)).mean().item() for h in o.hidden_states[1:-1]] + [last[0].mean().item()]
    return fta, m_act, o.attentions, o.loss.item()


@pytest.mark.parametrize("name", list(ARCHITECTURES))
@pytest.mark.slow
def test_every_architecture_matches_its_eager_attention(name, architecture_checkpoint, tmp_path, text_file,
                                                       monkeypatch):
    """First-token attention, M-Act and the loss (with its logits formed 40 positions at a time) equal what
    transformers' own eager forward gives, in every architecture (Gemma 2 soft-caps its final logits)."""
    from transformers import AutoTokenizer

    import longctx.sinks.loss

    monkeypatch.setattr(longctx.sinks.loss, "CHUNK_BYTES", 4 * 32064 * 2 * 40)
    ckpt = architecture_checkpoint(name)
    length = 256  # the trained length, past the 128-token sliding windows of mistral and gemma2
    # chunk 48: the chunk [96, 144) straddles the windows' edge
    r = measure_sinks(SinksSettings(checkpoint=str(ckpt), output=str(tmp_path / "out"), data=str(text_file),
                                    tokens=2 * length, length=length, batch_size=2, chunk=48), progress=False,
                      log=lambda _: None).results
    assert load_sinks(tmp_path / "out") == json.loads(json.dumps(r))
    windows, _ = token_windows(AutoTokenizer.from_pretrained(ckpt), str(text_file), 2, length)
    fta, m_act, attentions, loss = _eager_reference(ckpt, windows)
    assert r["loss"]["mean"] == pytest.approx(loss, rel=1e-5)
    assert r["loss"]["tokens"] == 2 * (length - 1) and r["loss"]["perplexity"] == pytest.approx(math.exp(loss), rel=1e-4)

    torch.testing.assert_close(torch.tensor(r["first_token_attention_per_head"]), fta, rtol=1e-5, atol=1e-7)
    assert r["first_token_attention"] == pytest.approx(fta.mean(1).tolist(), rel=1e-5)
    # the same hidden states as transformers' eager forward: longctx's attention function leaves the forward alone
    assert r["m_act"] == pytest.approx(m_act, rel=1e-5)
    sliding = SLIDING_WINDOWS.get(name, [None, None])
    settings = r["settings"]
    assert (settings["sliding_window"], settings["windows"], settings["length"]) == (sliding, 2, length)
    assert settings["attn_implementation"] == ("eager" if name == "gemma2" else "sdpa")
    assert settings["attn_logit_softcapping"] == ([50.0, 50.0] if name == "gemma2" else [None, None])
    for layer, window in enumerate(sliding):  # the reference does mask: past the window, token 0 is unseen
        if window is not None:
            assert attentions[layer][:, :, window:, 0].max() < 1e-30 < attentions[layer][:, :, :window, 0].min()


@pytest.mark.slow
def test_soft_capped_attention_is_measured_capped_and_run_eager(architecture_checkpoint, tmp_path, text_file,
                                                                monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import longctx.sinks.loss

    # caps of the size of the tiny model's scores and logits, so that capping moves F-Attn by ~1% (50 would move
    # it ~1e-9) and the loss visibly
    ckpt = architecture_checkpoint("gemma2", attn_logit_softcapping=0.05, final_logit_softcapping=0.05)
    length = 192
    r = measure_sinks(SinksSettings(checkpoint=str(ckpt), output=str(tmp_path / "out"), data=str(text_file),
                                    tokens=2 * length, length=length, chunk=64), progress=False,
                      log=lambda _: None).results
    windows, _ = token_windows(AutoTokenizer.from_pretrained(ckpt), str(text_file), 2, length)
    fta, m_act, _, loss = _eager_reference(ckpt, windows)
    torch.testing.assert_close(torch.tensor(r["first_token_attention_per_head"]), fta, rtol=1e-5, atol=1e-7)
    assert r["m_act"] == pytest.approx(m_act, rel=1e-5)
    assert r["loss"]["mean"] == pytest.approx(loss, rel=1e-5)
    assert r["settings"]["attn_implementation"] == "eager"
    assert r["settings"]["attn_logit_softcapping"] == [0.05, 0.05]
    uncapped, _, _, uncapped_loss = _eager_reference(ckpt, windows, attn_logit_softcapping=None,
                                                     final_logit_softcapping=None)
    assert ((uncapped - fta).abs() / fta).max() > 1e-3 and abs(uncapped_loss - loss) > 1e-2
    # a logit step longctx's table lacks: the model's own logits are the oracle, and no loss is reported
    model = AutoModelForCausalLM.from_pretrained(ckpt).eval()
    monkeypatch.delitem(longctx.sinks.loss.LOGIT_STEPS, "final_logit_softcapping")
    note = longctx.sinks.loss.check_logits(model, windows[0], "cpu")
    assert note.startswith("Gemma2ForCausalLM transforms its logits in a way longctx does not know")
    assert longctx.sinks.loss.LossSum(note=note).as_dict() == {"mean": None, "perplexity": None, "tokens": 0,
                                                               "note": note}
    # why eager: transformers' SDPA path drops the cap (its output is the uncapped model's), so running
    # Gemma 2 through SDPA would change the forward the measurement describes
    hidden = {}
    for impl in ("sdpa", "eager"):
        model = AutoModelForCausalLM.from_pretrained(ckpt, attn_implementation=impl).eval()
        with torch.no_grad():
            hidden[impl] = model.model(torch.tensor(windows)).last_hidden_state
    assert (hidden["sdpa"] - hidden["eager"]).abs().max() > 1e-2


def test_a_model_that_bypasses_the_attention_function_is_refused(tiny_checkpoint):
    from longctx.checkpoint.load import load_model

    model = load_model(tiny_checkpoint, dtype="float32", attn_implementation="sdpa").eval()
    collector = Collector(model, None)
    try:
        with torch.no_grad():
            model.model(torch.tensor([[1, 5, 9, 12]]))
        with pytest.raises(InputError, match=r"did not call transformers' attention-function interface in layer"):
            collector.check_seen()
    finally:
        collector.close()


def _fake_sinks(fingerprint, name, fta, m_act, gate_mean):
    return {"format": "longctx-sinks/1", "model": {"name": name, "fingerprint": fingerprint}, "layers": 2,
            "first_token_attention": [fta, fta], "m_act": [m_act, m_act],
            "averages": {"first_token_attention": fta, "m_act": m_act, "gate_mean": gate_mean}}


@pytest.mark.slow
def test_compare_shows_sink_columns(tmp_path):
    from test_report import _run, _scores_doc

    from longctx.report.compare import compare
    from longctx.report.settings import CompareSettings

    base, _ = _run(tmp_path, "base", _scores_doc("base", "fp-base", {"vt": {4096: 90.0, 8192: 80.0}}))
    gate, _ = _run(tmp_path, "gate", _scores_doc("gate", "fp-gate", {"vt": {4096: 95.0, 8192: 90.0}}))
    plain, _ = _run(tmp_path, "plain", _scores_doc("plain", "fp-plain", {"vt": {4096: 70.0, 8192: 60.0}}))
    before = compare(CompareSettings(runs=[base, gate, plain]))
    assert "M-Act" not in before.markdown and before.sinks == {}

    (base / "sinks.json").write_text(json.dumps(_fake_sinks("fp-base", "base", 0.4671, 1053.2, None)))
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "sinks.json").write_text(json.dumps(
        {**_fake_sinks("fp-gate", "gate", 0.048, 94.4, 0.116), "loss": {"mean": 1.751, "perplexity": 5.761}}))
    (plain / "sinks.json").write_text(json.dumps(_fake_sinks("fp-other", "x", 0.3, 10.0, None)))
    c = compare(CompareSettings(runs=[base, gate, plain], sinks=[tmp_path / "elsewhere"], output=tmp_path / "cmp"))
    assert c.columns[-3:] == ["First-token attn", "M-Act", "Gate mean"]
    assert "| base | 90.00 | 80.00 | 85.00 | 0.467 | 1053 | no gate |" in c.markdown
    assert "| gate | 95.00 | 90.00 | 92.50 | 0.048 | 94 | 0.116 |" in c.markdown
    assert "| plain | 70.00 | 60.00 | 65.00 | - | - | - |" in c.markdown
    assert any("sinks.json is for another checkpoint" in n for n in c.notes)
    rows = (tmp_path / "cmp" / "compare.csv").read_text().splitlines()
    assert rows[0].endswith(",first_token_attention,m_act,gate_mean,perplexity")
    assert rows[1].endswith(",0.4671,1053.2,,") and rows[2].endswith(",0.048,94.4,0.116,5.761")
    assert rows[3].endswith(",,,,")
    assert (tmp_path / "cmp" / "compare-sinks.png").read_bytes()[:4] == b"\x89PNG"

    # the paper's Table 4 layout: the sinks values and perplexity, then the RULER average
    t4 = compare(CompareSettings(runs=[base, gate, plain], sinks=[tmp_path / "elsewhere"], layout="table4",
                                 output=tmp_path / "t4"))
    assert t4.markdown.splitlines()[:5] == [
        "| Method | Gate score | M-Act | F-Attn | PPL | RULER avg. |",
        "| --- | --- | --- | --- | --- | --- |",
        "| base | – | 1053 | 0.467 | – | 85.00 |",
        "| gate | 0.116 | 94 | 0.048 | 5.761 | 92.50 |",
        "| plain | – | – | – | – | 65.00 |"]
    assert "The Gated Attention paper's Table 4 layout" in t4.markdown and "First-token attn," not in t4.markdown
    runs = json.loads((tmp_path / "t4" / "compare.json").read_text())["runs"]
    assert [r["sinks"] for r in runs] == [
        {"first_token_attention": 0.4671, "m_act": 1053.2, "gate_mean": None, "perplexity": None},
        {"first_token_attention": 0.048, "m_act": 94.4, "gate_mean": 0.116, "perplexity": 5.761}, None]


@pytest.mark.slow
def test_plot_takes_several_sinks_files(tmp_path):
    for name, fta in (("a", 0.5), ("b", 0.05)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "sinks.json").write_text(json.dumps(_fake_sinks(name, name, fta, 100.0, None)))
    out = plot_sinks([tmp_path / "a", tmp_path / "b" / "sinks.json"], tmp_path / "both.png")
    assert out.read_bytes()[:4] == b"\x89PNG"


def run(*args):
    from longctx.cli.main import cli

    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.mark.slow
def test_cli_prints_the_table_and_files(tmp_path, tiny_checkpoint, text_file):
    r = run("sinks", tiny_checkpoint, "--data", text_file, "--tokens", "128", "--length", "64", "-o", tmp_path / "o")
    assert r.exit_code == 0, r.output
    assert "| Model | First-token attn | M-Act |" in r.output and "no gate" in r.output
    assert str(tmp_path / "o" / "sinks.json") in r.output
    assert load_sinks(tmp_path / "o")["settings"]["windows"] == 2


@pytest.mark.parametrize("args,message", [
    (["{ckpt}", "--length", "512"], "longctx yarn {ckpt} --factor 2"),
    (["{ckpt}", "--data", "{short}", "--length", "64", "--tokens", "128"], "gave 3 tokens, fewer than the 128 needed"),
    (["{root}/missing", "--length", "64"], "does not exist"),
    (["{root}", "--length", "64"], "has no config.json"),
    (["{ckpt}", "--length", "64", "--dtype", "int3"], "unknown dtype 'int3'"),
    (["{ckpt}", "--length", "1"], "too short"),
    (["{ckpt}", "--data", "{root}/nope.txt", "--length", "64"], "nope.txt"),
])
def test_cli_bad_input_is_one_line_exit_2_nothing_written(args, message, tmp_path, tiny_checkpoint):
    root = tmp_path / "bad"
    root.mkdir()
    (root / "short.txt").write_text("too short")
    fmt = {"ckpt": tiny_checkpoint, "root": root, "short": root / "short.txt"}
    r = run("sinks", *[a.format(**fmt) for a in args], "-o", root / "out")
    assert r.exit_code == 2, r.output
    assert message.format(**fmt) in r.stderr
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1, r.stderr
    assert sorted(p.name for p in root.iterdir()) == ["short.txt"]


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_32k_on_one_gpu_within_the_memory_bound(tmp_path, reference_tokenizer_dir):
    from longctx.init.checkpoint import init_checkpoint
    from longctx.init.settings import InitSettings

    # the paper's 1.7B attention shape (16 query / 8 KV heads, head_dim 128, hidden 2048), 2 layers, bf16
    ckpt = tmp_path / "gate"
    init_checkpoint(InitSettings(output=str(ckpt), preset="tiny", attention="elementwise",
                                 tokenizer=str(reference_tokenizer_dir), dtype="bfloat16",
                                 config={"hidden_size": 2048, "intermediate_size": 6144, "num_attention_heads": 16,
                                         "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 32768}))
    torch.cuda.reset_peak_memory_stats()
    r = analyze_sinks(ckpt, tmp_path / "out", tokens=32768, length=32768, progress=False).results
    # an L x L matrix of one layer would be 16 x 32k x 32k x 4 bytes = 64 GiB
    assert torch.cuda.max_memory_allocated() < 8 * 2**30
    assert r["settings"]["device"] == "cuda" and r["settings"]["dtype"] == "bfloat16"
    assert all(0 < x < 1 for x in r["first_token_attention"]) and r["gate"]["variant"] == "elementwise"
    other = analyze_sinks(ckpt, tmp_path / "out2", tokens=32768, length=32768, chunk=512, progress=False).results
    assert other["first_token_attention"] == pytest.approx(r["first_token_attention"], rel=1e-4)

"""`longctx convert --from official`: the paper's released layout -> the longctx gated family.

The official checkpoints (`QwQZh/gated_attention`, code `qiuzh20/gated_attention` @ 49645df
`modeling_qwen3.py`) widen `q_proj` KV-group-major. These tests write small checkpoints in that
layout themselves (G = 1 and G = 2 query heads per KV head; `.bin` weights; `model_type: qwen2`) and
check the converted model against `official_forward`, a from-scratch forward of the official layout.
"""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from longctx.convert.layouts import convert_checkpoint
from longctx.convert.official import split_official_q_proj
from longctx.convert.settings import ConvertSettings

VOCAB, D, HD, FFN, LAYERS = 512, 64, 64, 96, 2


def official_config(variant, heads, kv_heads, qkv_bias=False):
    return {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen2", "auto_map": {"AutoModelForCausalLM":
                                                                                 "modeling_qwen3.Qwen3ForCausalLM"},
        "vocab_size": VOCAB, "hidden_size": D, "intermediate_size": FFN, "num_hidden_layers": LAYERS,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": HD, "hidden_act": "silu",
        "max_position_embeddings": 4096, "rope_theta": 10000.0, "rope_scaling": None, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True, "initializer_range": 0.02, "torch_dtype": "float32",
        "headwise_attn_output_gate": variant == "headwise", "elementwise_attn_output_gate": variant == "elementwise",
        "qkv_bias": qkv_bias, "use_qk_norm": True, "use_sliding_window": False,
    }


def official_state_dict(cfg, seed=0):
    """Random weights with the official shapes: q_proj widened by H*hd (elementwise) or H (headwise)."""
    g = torch.Generator().manual_seed(seed)
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    gate = H * HD if cfg["elementwise_attn_output_gate"] else H if cfg["headwise_attn_output_gate"] else 0

    def rnd(*shape, std=0.08):
        return torch.randn(*shape, generator=g) * std

    sd = {"model.embed_tokens.weight": rnd(VOCAB, D, std=0.5), "model.norm.weight": 1 + rnd(D)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        sd.update({
            p + "self_attn.q_proj.weight": rnd(H * HD + gate, D), p + "self_attn.k_proj.weight": rnd(KV * HD, D),
            p + "self_attn.v_proj.weight": rnd(KV * HD, D), p + "self_attn.o_proj.weight": rnd(D, H * HD),
            p + "self_attn.q_norm.weight": 1 + rnd(HD), p + "self_attn.k_norm.weight": 1 + rnd(HD),
            p + "mlp.gate_proj.weight": rnd(FFN, D), p + "mlp.up_proj.weight": rnd(FFN, D),
            p + "mlp.down_proj.weight": rnd(D, FFN),
            p + "input_layernorm.weight": 1 + rnd(D), p + "post_attention_layernorm.weight": 1 + rnd(D),
        })
        if cfg["qkv_bias"]:
            sd.update({p + "self_attn.q_proj.bias": rnd(H * HD + gate), p + "self_attn.k_proj.bias": rnd(KV * HD),
                       p + "self_attn.v_proj.bias": rnd(KV * HD), p + "self_attn.o_proj.bias": rnd(D)})
    return sd


def _rms(x, w, eps=1e-6):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, pos, theta=10000.0):
    inv = 1.0 / (theta ** (torch.arange(0, HD, 2).float() / HD))
    ang = pos[:, None].float() * inv
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    rot = torch.cat([-x[..., HD // 2:], x[..., :HD // 2]], -1)
    return x * cos + rot * sin


def official_forward(cfg, sd, ids):
    """Logits of the official model, written from the official code's split (not from longctx):
    `q = q_proj(x).view(b, s, KV, -1)`, then per KV group `[q of its G heads | their gates]`."""
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    G = H // KV
    b, s = ids.shape
    pos = torch.arange(s)

    def lin(x, name):
        return F.linear(x, sd[name + ".weight"], sd.get(name + ".bias"))

    h = sd["model.embed_tokens.weight"][ids]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        x = _rms(h, sd[p + "input_layernorm.weight"])
        q = lin(x, p + "self_attn.q_proj").view(b, s, KV, -1)
        if cfg["headwise_attn_output_gate"]:
            q, gate = torch.split(q, [HD * G, G], dim=-1)
            gate = gate.reshape(b, s, H, 1)
        elif cfg["elementwise_attn_output_gate"]:
            q, gate = torch.split(q, [HD * G, HD * G], dim=-1)
            gate = gate.reshape(b, s, H, HD)
        else:
            gate = None
        q = _rms(q.reshape(b, s, H, HD), sd[p + "self_attn.q_norm.weight"]).transpose(1, 2)
        k = _rms(lin(x, p + "self_attn.k_proj").view(b, s, KV, HD), sd[p + "self_attn.k_norm.weight"]).transpose(1, 2)
        v = lin(x, p + "self_attn.v_proj").view(b, s, KV, HD).transpose(1, 2)
        q, k = _rope(q, pos), _rope(k, pos)
        k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(HD)
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        attn = (scores.softmax(-1) @ v).transpose(1, 2)  # (b, s, H, hd)
        if gate is not None:
            attn = attn * torch.sigmoid(gate)
        h = h + lin(attn.reshape(b, s, H * HD), p + "self_attn.o_proj")
        x = _rms(h, sd[p + "post_attention_layernorm.weight"])
        h = h + lin(F.silu(lin(x, p + "mlp.gate_proj")) * lin(x, p + "mlp.up_proj"), p + "mlp.down_proj")
    return F.linear(_rms(h, sd["model.norm.weight"]), sd["model.embed_tokens.weight"])


def write_official(path, variant, heads, kv_heads, qkv_bias=False):
    path.mkdir(parents=True)
    cfg = official_config(variant, heads, kv_heads, qkv_bias)
    sd = official_state_dict(cfg)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    torch.save(sd, path / "pytorch_model.bin")
    (path / "modeling_qwen3.py").write_text("# remote code (never copied, never run)\n")
    (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    return cfg, sd


CASES = [("elementwise", 2, 2, False), ("elementwise", 4, 2, False), ("headwise", 2, 2, False),
         ("headwise", 4, 2, False), ("baseline", 4, 2, False), ("elementwise", 4, 2, True), ("headwise", 4, 2, True)]


@pytest.mark.parametrize("variant,heads,kv_heads,qkv_bias", CASES,
                         ids=[f"{v}-G{h // k}{'-bias' if b else ''}" for v, h, k, b in CASES])
def test_converted_model_matches_the_official_forward(variant, heads, kv_heads, qkv_bias, tmp_path):
    cfg, sd = write_official(tmp_path / "official", variant, heads, kv_heads, qkv_bias)
    summary = convert_checkpoint(ConvertSettings(source=str(tmp_path / "official"), output=str(tmp_path / "ours")))
    assert summary.attention == variant and summary.kv_groups == heads // kv_heads
    out = tmp_path / "ours"
    new_cfg = json.loads((out / "config.json").read_text())
    expected_arch = "Qwen3ForCausalLM" if variant == "baseline" else "GatedQwen3ForCausalLM"
    assert new_cfg["architectures"] == [expected_arch]
    assert new_cfg["rope_parameters"] == {"rope_type": "default", "rope_theta": 10000.0}
    assert new_cfg["attention_bias"] is qkv_bias and "qkv_bias" not in new_cfg and "auto_map" not in new_cfg
    assert sorted(p.name for p in out.iterdir()) == [".longctx-output", "config.json", "longctx.json",
                                                     "model.safetensors", "tokenizer_config.json"]
    prov = json.loads((out / "longctx.json").read_text())
    assert prov["verb"] == "convert" and len(prov["source_fingerprint"]) == 64

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.randint(0, VOCAB, (2, 37), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = official_forward(cfg, sd, ids)
        got = model(ids).logits
    assert ref.abs().max() > 1  # not a vacuous comparison of near-zero logits
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-4)


def test_split_layout_g2():
    """Row bookkeeping for G=2 (the released models): q rows of head h=kG+g sit at k*(2*G*hd) + g*hd + e."""
    H, KV, hd = 4, 2, 3
    G = H // KV
    rows = torch.arange(2 * H * hd).float()[:, None]
    q, gate = split_official_q_proj(rows, H, KV, hd, "elementwise")
    for h in range(H):
        k, g = divmod(h, G)
        for e in range(hd):
            assert q[h * hd + e, 0] == k * (2 * G * hd) + g * hd + e
            assert gate[h * hd + e, 0] == k * (2 * G * hd) + G * hd + g * hd + e
    rows = torch.arange(H * hd + H).float()
    q, gate = split_official_q_proj(rows, H, KV, hd, "headwise")
    assert gate.tolist() == [k * (G * hd + G) + G * hd + g for k in range(KV) for g in range(G)]
    assert q[hd * 3 + 1].item() == 1 * (G * hd + G) + 1 * hd + 1  # head 3 = group 1, g 1, e 1


def test_g2_is_not_the_qwen3_next_interleave(tmp_path):
    """Reading the G=2 official weights as Qwen3-Next's per-head interleave is silently wrong."""
    cfg, sd = write_official(tmp_path / "official", "elementwise", 4, 2)
    w = sd["model.layers.0.self_attn.q_proj.weight"]
    ours_q, _ = split_official_q_proj(w, 4, 2, HD, "elementwise")
    next_q = w.view(4, 2, HD, D)[:, 0].reshape(4 * HD, D)
    assert not torch.equal(ours_q, next_q)


# --- the CLI verb and bad input -------------------------------------------------------------------

def _cli(*args):
    from click.testing import CliRunner

    from longctx.cli.main import cli

    return CliRunner().invoke(cli, [str(a) for a in args])


def test_convert_cli(tmp_path):
    write_official(tmp_path / "official", "headwise", 4, 2)
    r = _cli("convert", tmp_path / "official", tmp_path / "ours", "--from", "official")
    assert r.exit_code == 0, r.output
    assert "GatedQwen3ForCausalLM (headwise)" in r.output and "2 query heads per KV head" in r.output
    assert _cli("convert", tmp_path / "official", tmp_path / "ours", "--from", "official").exit_code == 2
    assert _cli("convert", tmp_path / "official", tmp_path / "ours", "--from", "official",
                "--overwrite").exit_code == 0


def _bad_sources(root, tiny_checkpoint):
    import shutil

    write_official(root / "official", "elementwise", 4, 2)
    shutil.copytree(tiny_checkpoint, root / "qwen3")  # a plain Qwen3 (no gate keys)
    write_official(root / "both", "elementwise", 4, 2)
    cfg = json.loads((root / "both" / "config.json").read_text())
    (root / "both" / "config.json").write_text(json.dumps({**cfg, "headwise_attn_output_gate": True}))
    write_official(root / "narrow", "elementwise", 4, 2)
    cfg = json.loads((root / "narrow" / "config.json").read_text())
    (root / "narrow" / "config.json").write_text(json.dumps({**cfg, "elementwise_attn_output_gate": False,
                                                             "headwise_attn_output_gate": True}))
    (root / "noweights").mkdir()
    (root / "noweights" / "config.json").write_text(json.dumps(official_config("headwise", 4, 2)))
    (root / "pickle").mkdir()
    (root / "pickle" / "config.json").write_text(json.dumps(official_config("headwise", 4, 2)))
    torch.save({"model.embed_tokens.weight": torch.zeros(1), "evil": object()}, root / "pickle" / "pytorch_model.bin")
    from longctx.core.files import mark_output

    (root / "taken").mkdir()
    mark_output(root / "taken", "checkpoint")
    (root / "mine").mkdir()
    (root / "mine" / "notes.txt").write_text("not longctx's")


@pytest.mark.parametrize("args,message", [
    (["{root}/qwen3", "{root}/new"], "config.json has no headwise_attn_output_gate or elementwise_attn_output_gate); "
                                     "expected the official gated-attention layout"),
    (["{root}/both", "{root}/new"], "asks for both headwise_attn_output_gate and elementwise_attn_output_gate"),
    (["{root}/narrow", "{root}/new"], "rows, the headwise layout needs"),
    (["{root}/noweights", "{root}/new"], "has no weight files (*.safetensors, *.bin): copy the model's weights"),
    (["{root}/pickle", "{root}/new"], "holds code, not only tensors"),
    (["{root}/missing", "{root}/new"], "does not exist"),
    (["{root}/official", "{root}/taken"], "already exists; pass --overwrite"),
    (["{root}/official", "{root}/official", "--overwrite"], "would hold the input checkpoint"),
    (["{root}/official", "{root}/mine", "--overwrite"], "exists and was not made by longctx"),
    (["{root}/official", "{root}/official/sub"], "lies inside the input checkpoint"),
])
def test_convert_bad_input_is_one_line_exit_2_nothing_written(args, message, tmp_path, tiny_checkpoint):
    root = tmp_path / "bad"
    root.mkdir()
    _bad_sources(root, tiny_checkpoint)
    before = {p.name: sorted(q.name for q in p.iterdir()) for p in root.iterdir()}
    r = _cli("convert", *[a.format(root=root) for a in args], *([] if "--from" in args else ["--from", "official"]))
    assert r.exit_code == 2, r.output
    assert message in r.stderr
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1, r.stderr
    assert {p.name: sorted(q.name for q in p.iterdir()) for p in root.iterdir()} == before


def test_convert_unknown_source_layout(tmp_path):
    write_official(tmp_path / "official", "headwise", 4, 2)
    r = _cli("convert", tmp_path / "official", tmp_path / "new", "--from", "megatron")
    assert r.exit_code == 2 and "unknown source layout 'megatron'; choose one of official" in r.stderr
    assert not (tmp_path / "new").exists()

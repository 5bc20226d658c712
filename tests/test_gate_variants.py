"""Every point of the gate design space (`longctx.models.gates`) in transformers: the spec, its config keys and
refusals, and each variant's attention output against a written-out formula on random tensors, with GQA."""

import math

import pytest
import torch

from longctx.core.errors import InputError
from longctx.models.gated_qwen3 import GatedQwen3Config, GatedQwen3ForCausalLM, gate_width
from longctx.models.gates import NAMED, GateSpec, gate_name, gate_of, parse_gate
from longctx.models.variants import attention_variant, gate_flags

SMALL = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64,
         "rope_parameters": {"rope_type": "default", "rope_theta": 10000}}
GATED = [name for name, spec in NAMED.items() if spec is not None]
COMBINATIONS = ["position=value,granularity=headwise,heads=shared", "position=key,form=additive,activation=silu",
                "position=query,granularity=headwise,source=free,activation=ns-sigmoid",
                "position=dense,form=additive,activation=sigmoid", "granularity=headwise,form=additive"]


def _model(variant: str, seed: int = 0) -> GatedQwen3ForCausalLM:
    torch.manual_seed(seed)
    model = GatedQwen3ForCausalLM(GatedQwen3Config(**SMALL, **gate_flags(variant))).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("gate_logits", "head_norm.weight")):  # zero/one-initialised: make them count
                p.copy_(torch.randn_like(p))
    return model


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def _act(name, z):
    return {"sigmoid": lambda: 1 / (1 + torch.exp(-z)), "silu": lambda: z / (1 + torch.exp(-z)),
            "identity": lambda: z, "ns-sigmoid": lambda: 0.5 + 0.5 / (1 + torch.exp(-z))}[name]()


def _rms(x, weight, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight


def _gate(spec: GateSpec, attn, y, x):
    """`y` (b, s, n, d) or (b, s, hidden) through `spec`, written out from the module's weights."""
    if spec.kind == "silu":
        return y / (1 + torch.exp(-y))
    if spec.kind == "rmsnorm":
        return _rms(y, attn.head_norm.weight, attn.head_norm.variance_epsilon)
    z = x @ attn.g_proj.weight.T if spec.source == "input" else attn.gate_logits.expand(*x.shape[:-1], -1)
    g = _act(spec.activation, z)
    if y.dim() == 4:
        n, d = y.shape[2], y.shape[3]
        g = g.reshape(*x.shape[:-1], n, d if spec.granularity == "elementwise" else 1)
        if spec.heads == "shared":
            g = g.mean(dim=2, keepdim=True)
    return y * g if spec.form == "multiplicative" else y + g


def _formula(model, ids):
    """Layer 0's attention output for `ids`, by the paper's equations on the module's weights."""
    cfg, layer = model.config, model.model.layers[0]
    attn, spec = layer.self_attn, gate_of(model.config)
    x = layer.input_layernorm(model.model.embed_tokens(ids))
    b, s, _ = x.shape
    H, KV, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    pos = torch.arange(s, dtype=torch.float32)
    inv = 1.0 / (cfg.rope_parameters["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    angles = torch.cat([pos[:, None] * inv[None]] * 2, dim=-1)
    cos, sin = angles.cos()[None, :, None], angles.sin()[None, :, None]
    q = _rotate(_rms((x @ attn.q_proj.weight.T).view(b, s, H, d), attn.q_norm.weight, attn.q_norm.variance_epsilon),
                cos, sin)
    k = _rotate(_rms((x @ attn.k_proj.weight.T).view(b, s, KV, d), attn.k_norm.weight, attn.k_norm.variance_epsilon),
                cos, sin)
    v = (x @ attn.v_proj.weight.T).view(b, s, KV, d)
    at = None if spec is None else (spec.position if spec.kind == "gate" else "sdpa")
    q = _gate(spec, attn, q, x) if at == "query" else q
    k = _gate(spec, attn, k, x) if at == "key" else k
    v = _gate(spec, attn, v, x) if at == "value" else v
    k, v = k.repeat_interleave(H // KV, dim=2), v.repeat_interleave(H // KV, dim=2)
    logits = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d)
    logits = logits.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    y = torch.einsum("bhqk,bkhd->bqhd", logits.softmax(-1), v)
    y = _gate(spec, attn, y, x) if at == "sdpa" else y
    out = y.reshape(b, s, H * d) @ attn.o_proj.weight.T
    return (_gate(spec, attn, out, x) if at == "dense" else out), x


# FlexAttention compiles its kernel on first use (~15 s on 2 CPU cores, once per process; the variants share it)
ATTENTION = ["eager", "sdpa", pytest.param("flex_attention", marks=pytest.mark.slow)]


@pytest.mark.parametrize("variant", [*GATED, *COMBINATIONS])
@pytest.mark.parametrize("attn", ATTENTION)
def test_each_variant_computes_the_written_out_formula(variant, attn):
    model = _model(variant)
    model.config._attn_implementation = attn
    ids = torch.randint(0, SMALL["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(1))
    captured = {}
    hook = model.model.layers[0].self_attn.register_forward_hook(lambda _m, _i, out: captured.update(out=out[0]))
    with torch.no_grad():
        model(ids)
        want, _ = _formula(model, ids)
    hook.remove()
    torch.testing.assert_close(captured["out"], want, rtol=1e-5, atol=1e-5)
    # and the gate changed something: the same weights without it compute another output
    if variant != "baseline":
        plain = GatedQwen3ForCausalLM(GatedQwen3Config(**SMALL)).eval()
        plain.load_state_dict(model.state_dict(), strict=False)
        with torch.no_grad():
            other = plain.model.layers[0].self_attn(plain.model.layers[0].input_layernorm(
                plain.model.embed_tokens(ids)), plain.model.rotary_emb(plain.model.embed_tokens(ids),
                                                                       torch.arange(12)[None]), None)[0]
        assert (other - want).abs().max() > 0.01 * want.abs().max()


@pytest.mark.parametrize("variant", [*GATED, *COMBINATIONS])
def test_save_load_round_trip_keeps_the_gate_and_the_weights(variant, tmp_path):
    model = _model(variant)
    model.save_pretrained(tmp_path)
    loaded = GatedQwen3ForCausalLM.from_pretrained(tmp_path).eval()
    assert attention_variant(loaded.config) == attention_variant(model.config) == gate_name(parse_gate(variant))
    assert loaded.state_dict().keys() == model.state_dict().keys()
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor, rtol=0, atol=0, msg=name)


def test_the_official_gates_keep_their_keys_and_the_others_are_attn_gate():
    assert gate_flags("elementwise") == {"elementwise_attn_output_gate": True, "headwise_attn_output_gate": False}
    assert gate_flags("baseline") == {"elementwise_attn_output_gate": False, "headwise_attn_output_gate": False}
    shared = gate_flags("head-shared")
    assert shared["attn_gate"]["heads"] == "shared" and not shared["elementwise_attn_output_gate"]
    assert gate_of({"headwise_attn_output_gate": True}) == GateSpec(granularity="headwise")
    assert parse_gate("granularity=headwise") == NAMED["headwise"] and gate_name(NAMED["headwise"]) == "headwise"
    assert gate_name(parse_gate(COMBINATIONS[0])) == COMBINATIONS[0]


@pytest.mark.parametrize("variant,width", [("elementwise", 32), ("headwise", 4), ("value-elementwise", 16),
                                           ("value-headwise", 2), ("key-elementwise", 16), ("query-elementwise", 32),
                                           ("dense-elementwise", 32), ("head-shared", 32), ("silu", 0), ("rmsnorm", 0)])
def test_gate_widths_follow_the_heads_of_their_position(variant, width):
    assert gate_width(GatedQwen3Config(**SMALL, **gate_flags(variant))) == width


@pytest.mark.parametrize("text,said", [
    ("position=dense,granularity=headwise", "a headwise gate needs heads: dense (G5)"),
    ("position=dense,heads=shared", "heads=shared needs heads: dense (G5)"),
    ("kind=silu,position=value", "gate kind 'silu' is a non-linearity at sdpa (G1) only"),
    ("kind=rmsnorm,activation=silu", "gate kind 'rmsnorm' has no parameters to shape: drop activation=silu"),
    ("activation=tanh", "gate activation 'tanh' is not one of sigmoid, silu, identity, ns-sigmoid"),
    ("colour=red", "'colour=red' in the gate 'colour=red' is not field=value"),
    ("form=additive,form=additive", "gives form twice"),
    ("gated", "unknown attention variant 'gated'"),
])
def test_a_combination_that_makes_no_sense_is_one_line_naming_the_parts(text, said):
    with pytest.raises(InputError, match=None) as e:
        parse_gate(text)
    assert said in str(e.value) and "\n" not in str(e.value)


def test_malformed_gate_keys_in_a_config_are_refused():
    with pytest.raises(InputError, match="both headwise_attn_output_gate and elementwise_attn_output_gate"):
        GatedQwen3Config(**SMALL, headwise_attn_output_gate=True, elementwise_attn_output_gate=True)
    with pytest.raises(InputError, match="elementwise_attn_output_gate and an attn_gate gate"):
        gate_of({"elementwise_attn_output_gate": True, "attn_gate": {"position": "value"}})
    with pytest.raises(InputError, match="unknown fields colour"):
        gate_of({"attn_gate": {"colour": "red"}})
    with pytest.raises(InputError, match="not an object of text fields"):
        gate_of({"attn_gate": ["value"]})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (FlexAttention has no backward on CPU)")
@pytest.mark.parametrize("variant", [n for n in GATED if n != "silu"])
def test_each_variant_trains_with_flex_attention_as_with_sdpa_on_cuda(variant):
    """The loss and every gate gradient of a forward and backward through FlexAttention equal SDPA's."""
    ids = torch.randint(0, SMALL["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(2)).cuda()
    grads = {}
    for attn in ("sdpa", "flex_attention"):
        model = _model(variant).cuda().train()
        model.config._attn_implementation = attn
        loss = model(ids, labels=ids).loss
        loss.backward()
        grads[attn] = loss.detach(), {n: p.grad for n, p in model.named_parameters()
                                      if any(k in n for k in ("g_proj", "gate_logits", "head_norm"))}
    torch.testing.assert_close(grads["flex_attention"][0], grads["sdpa"][0], rtol=1e-4, atol=0)
    assert grads["sdpa"][1].keys() == grads["flex_attention"][1].keys() and grads["sdpa"][1]
    for name, want in grads["sdpa"][1].items():
        torch.testing.assert_close(grads["flex_attention"][1][name], want, rtol=1e-3,
                                   atol=1e-5 * float(want.abs().max()), msg=name)


@pytest.mark.parametrize("variant", [n for n in GATED if n != "silu"])
def test_each_variant_trains_with_gradient_checkpointing(variant):
    """Every gate parameter gets a gradient through a checkpointed forward and backward (what `extend` runs)."""
    model = _model(variant).train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(0, SMALL["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(2))
    model(ids, labels=ids).loss.backward()
    gate = {n: p for n, p in model.named_parameters() if any(k in n for k in ("g_proj", "gate_logits", "head_norm"))}
    assert len(gate) == SMALL["num_hidden_layers"]
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in gate.values()), variant


def test_the_papers_table_4_renders_in_the_table_4_layout():
    """The paper's Table 4 (tests/data/table4), typed in, in the layout longctx writes for its own runs."""
    from pathlib import Path

    from longctx.core.parse import loads
    from longctx.report.sinks import Table4Row, table4_markdown

    paper = loads((Path(__file__).parent / "data" / "table4" / "paper.json").read_text())
    assert {r["variant"] for r in paper} <= set(NAMED)  # every row is a variant longctx builds
    rows = [Table4Row(r["method"], r["gate"], r["m_act"], r["f_attn"], r["ppl"]) for r in paper]
    assert table4_markdown(rows) in (Path(__file__).parent.parent / "docs" / "compare.md").read_text()  # as shown
    assert table4_markdown(rows).splitlines() == [
        "| Method | Gate score | M-Act | F-Attn | PPL | RULER avg. |",
        "| --- | --- | --- | --- | --- | --- |",
        "| baseline | – | 1053 | 0.467 | 6.026 | – |",
        "| SDPA elementwise | 0.116 | 94 | 0.048 | 5.761 | – |",
        "| SDPA headwise | 0.172 | 98 | 0.073 | 5.792 | – |",
        "| SDPA elem. head-shared | 0.271 | 286 | 0.301 | 5.801 | – |",
        "| v elementwise (G2) | 0.221 | 125 | 0.297 | 5.820 | – |",
        "| input-independent | 0.335 | 471 | 0.364 | 5.917 | – |",
        "| NS-sigmoid (0.5+0.5σ) | 0.653 | 892 | 0.451 | 5.900 | – |",
    ]
    # a checkpoint's own sinks.json gives the same row shape, with its RULER average
    doc = {"averages": {"gate_mean": 0.25, "m_act": 3.21, "first_token_attention": 0.0123}}
    assert table4_markdown([Table4Row.of("tiny gated", doc, 12.5)]).splitlines()[2] == (
        "| tiny gated | 0.250 | 3.21 | 0.012 | – | 12.50 |")

"""`longctx sinks` on every gate variant: first-token attention and M-Act for each, and the gate statistics that
make sense for it, equal to the scores the model applies (recorded by `record_gate_scores`)."""

import pytest
import torch
from test_sinks import L, _checkpoint, analyze_sinks, text_file  # noqa: F401 (text_file is a fixture)

from longctx.models.gates import NAMED
from longctx.report.sinks import layer_markdown
from longctx.sinks.measure import token_windows

GATE_HEADS = {"value-elementwise": 2, "value-headwise": 2, "key-elementwise": 2, "head-shared": 1,
              "headwise-shared": 1, "dense-elementwise": 1}  # the tiny preset: 4 query heads, 2 key/value heads


@pytest.mark.slow
@pytest.mark.parametrize("variant", [n for n in NAMED if n not in ("baseline", "elementwise", "headwise")])
def test_sinks_measures_every_variant(variant, tmp_path, reference_tokenizer_dir, text_file):  # noqa: F811
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from longctx.models.gated_qwen3 import record_gate_scores

    ckpt = _checkpoint(tmp_path, reference_tokenizer_dir, variant)
    r = analyze_sinks(ckpt, tmp_path / "out", data=str(text_file), tokens=2 * L, length=L, batch_size=2, chunk=40,
                      progress=False).results
    assert len(r["first_token_attention"]) == len(r["m_act"]) == 2 and r["averages"]["m_act"] > 0
    if variant in ("silu", "rmsnorm"):
        assert r["gate"] is None and r["gate_reported"].startswith("no gate scores")
        assert r["averages"]["gate_mean"] is None
        return
    assert r["gate"]["variant"] == variant
    said = r["gate_reported"]
    assert ("not how sparse" in said) == variant.startswith("additive")
    assert ("sparsity" in said) == (variant in ("head-shared", "headwise-shared", "value-elementwise",
                                                "value-headwise", "key-elementwise", "query-elementwise",
                                                "dense-elementwise", "input-independent", "ns-sigmoid"))
    heads = GATE_HEADS.get(variant, 4)
    assert [len(row) for row in r["gate"]["per_head"]["mean"]] == [heads, heads]
    table = layer_markdown(r).split("Gate mean per head")[1]
    assert table.splitlines()[2] == "| Layer | " + " | ".join(f"h{h}" for h in range(heads)) + " |"
    assert ("over key/value heads" in table) == variant.startswith(("value", "key"))

    windows, _ = token_windows(AutoTokenizer.from_pretrained(ckpt), str(text_file), 2, L)
    model = AutoModelForCausalLM.from_pretrained(ckpt).eval()
    with torch.no_grad(), record_gate_scores(model) as gates:
        model(torch.tensor(windows))
    for i, scores in sorted(gates.items()):
        assert r["gate"]["mean"][i] == pytest.approx(scores.double().mean().item(), rel=1e-5)
        assert r["gate"]["below_0_5"][i] == pytest.approx((scores < 0.5).double().mean().item())

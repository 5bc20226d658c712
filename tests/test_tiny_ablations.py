"""`recipes/tiny-ablations.yaml`, the paper's Table 4 grid at tiny scale, through its quick variant (CI): every
Table 4 row built with the baseline's parameter count, pretrained, measured and compared in Table 4's layout."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import user_environment

from longctx.core.parse import loads

ROOT = Path(__file__).resolve().parent.parent
PAPER = loads((ROOT / "tests" / "data" / "table4" / "paper.json").read_text())


def test_the_grid_is_every_row_of_the_papers_table_4():
    from longctx.models.gates import NAMED, parse_gate
    from longctx.recipe.load import load_recipe

    for name in ("tiny-ablations.yaml", "tiny-ablations-quick.yaml"):
        recipe = load_recipe(ROOT / "recipes" / name)
        assert {m.source for m in recipe.models} == {"init"}
        variants = {m.name: m.settings.attention for m in recipe.models}
        assert variants == {r["variant"]: r["variant"] for r in PAPER}, name  # a model per row, named as the row
        assert all(parse_gate(v) == NAMED[v] for v in variants.values() if v != "baseline")
        assert all(m.settings.match_params == (m.name != "baseline") for m in recipe.models)
        assert recipe.stages["compare"].layout == "table4"


@pytest.mark.slow
def test_the_quick_grid_runs_into_one_table_4(tmp_path):
    """`longctx run recipes/tiny-ablations-quick.yaml` as a user runs it (its own process): seven models of one
    parameter count, each with its gate, and one Table-4 table with every measured column filled."""
    from transformers import AutoConfig

    from longctx.init.presets import parameter_count
    from longctx.models.gates import NAMED, gate_of

    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "longctx", "run", str(ROOT / "recipes" / "tiny-ablations-quick.yaml"),
                        "-o", str(out)], capture_output=True, text=True, env=user_environment(), timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    sizes = {}
    for row in PAPER:
        ckpt = out / row["variant"] / "pretrain" / f"{row['variant']}-pretrain"
        config = AutoConfig.from_pretrained(ckpt)
        assert gate_of(config) == NAMED[row["variant"]]
        sizes[row["variant"]] = parameter_count(config)
    assert max(sizes.values()) / min(sizes.values()) - 1 < 0.001, sizes

    table = (out / "compare" / "compare.md").read_text().splitlines()
    assert table[0] == "| Method | Gate score | M-Act | F-Attn | PPL | RULER avg. |"
    rows = {cells[0]: cells[1:] for cells in (line.strip("| ").split(" | ") for line in table[2:2 + len(PAPER)])}
    assert set(rows) == {f"{row['variant']}-pretrain" for row in PAPER}
    for method, (gate, m_act, f_attn, ppl, ruler) in rows.items():
        assert (gate == "–") == method.startswith("baseline"), method
        for cell in (m_act, f_attn, ppl, ruler):
            float(cell)  # measured, not absent
    assert table[0] in r.stdout  # the run ends by printing the table
    runs = json.loads((out / "compare" / "compare.json").read_text())["runs"]
    assert all(run["sinks"]["perplexity"] > 1 for run in runs)
    # NS-sigmoid's gate never falls below 0.5; the others start near sigmoid(0) = 0.5
    ns = json.loads((out / "ns-sigmoid" / "sinks" / "ns-sigmoid-pretrain" / "sinks.json").read_text())
    assert ns["averages"]["gate_below_0_5"] == 0 and ns["averages"]["gate_mean"] > 0.5

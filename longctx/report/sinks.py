"""Tables and plots of `sinks.json` files: the paper's Table 4 layout, per-layer tables, the by-layer plot,
and the sink columns `compare` adds to RULER runs. Reads files only."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from longctx.core.errors import InputError
from longctx.core.files import write_atomic
from longctx.report.plots import new_figure, save_figure
from longctx.report.run import Report
from longctx.report.tables import markdown_row
from longctx.sinks.schema import SINKS_FILE, SinksResults, load_sinks


def _num(v: float | None, digits: int = 3) -> str:
    return "no gate" if v is None else f"{v:.{digits}f}"


def _m_act(v: float) -> str:
    """Whole numbers as the paper prints M-Act (1053, 94); 3 significant digits below 10 (tiny models)."""
    return f"{v:.0f}" if abs(v) >= 10 else f"{v:.3g}"


SUMMARY_COLUMNS = ["Model", "First-token attn", "M-Act", "Gate mean", "Gate median", "Gate <0.1", "Gate <0.5",
                   "Loss", "PPL"]


def perplexity(doc: SinksResults) -> float | None:
    """The perplexity of the measured windows (None: not measured, as in files written before longctx did)."""
    return (doc.get("loss") or {}).get("perplexity")


# What compare reads of a sinks.json: key -> (its column in the sections across seeds, digits shown there).
SINK_VALUES = {"first_token_attention": ("F-Attn", 3), "m_act": ("M-Act", 2), "gate_mean": ("Gate score", 3),
               "perplexity": ("PPL", 3)}


def sink_values(doc: SinksResults | None) -> dict[str, float | None] | None:
    """SINK_VALUES of a sinks.json (averages over layers, and the windows' perplexity); None without one."""
    if doc is None:
        return None
    return {k: perplexity(doc) if k == "perplexity" else doc["averages"].get(k) for k in SINK_VALUES}


def _loss_cells(doc: SinksResults) -> list[str]:
    loss = doc.get("loss") or {}
    return ["-" if loss.get("mean") is None else f"{loss['mean']:.4f}",
            "-" if loss.get("perplexity") is None else f"{loss['perplexity']:.3f}"]


def sinks_markdown(runs: Sequence[SinksResults], names: Sequence[str] | None = None) -> str:
    """The paper's Table 4 shape: a row per checkpoint, averages over layers, and the windows' loss."""
    names = names or [r["model"].get("name", "?") for r in runs]
    lines = [markdown_row(SUMMARY_COLUMNS), markdown_row(["---"] * len(SUMMARY_COLUMNS))]
    for name, r in zip(names, runs):
        a = r["averages"]
        lines.append(markdown_row([name, _num(a["first_token_attention"]), _m_act(a["m_act"]),
                                   *[_num(a[f"gate_{k}"]) for k in ("mean", "median", "below_0_1", "below_0_5")],
                                   *_loss_cells(r)]))
    return "\n".join(lines)


def layer_markdown(r: SinksResults) -> str:
    """Per layer: first-token attention, M-Act (mean and max over windows), gate stats; then, for a gated
    model, the gate mean per head."""
    g = r["gate"]
    head = ["Layer", "First-token attn", "M-Act", "M-Act (max)", "Gate mean", "Gate median", "Gate <0.1", "Gate <0.5"]
    lines = [markdown_row(head), markdown_row(["---"] * len(head))]
    for i in range(r["layers"]):
        gate = [_num(g[k][i]) if g else "no gate" for k in ("mean", "median", "below_0_1", "below_0_5")]
        lines.append(markdown_row([str(i), _num(r["first_token_attention"][i]), _m_act(r["m_act"][i]),
                                   _m_act(r["m_act_max"][i]), *gate]))
    if g:
        heads = [f"h{h}" for h in range(len(g["per_head"]["mean"][0]))]
        over = f", over {g['heads']}" if g.get("heads") and g["heads"] != "query heads" else ""
        lines += ["", f"Gate mean per head ({g['variant']}{over}):", "", markdown_row(["Layer", *heads]),
                  markdown_row(["---"] * (len(heads) + 1))]
        lines += [markdown_row([str(i), *map(_num, row)]) for i, row in enumerate(g["per_head"]["mean"])]
    s = r["settings"]
    lines += ["", f"{s['windows']} window(s) of {s['length']} tokens from {s['data']}"
                  f"{' (BOS first)' if s['bos'] else ''}; first-token attention excludes query position 0; loss: "
                  "mean next-token cross-entropy in nats (held-out only on text the model was not trained on)."]
    if (r.get("loss") or {}).get("note"):
        lines.append(f"No loss: {r['loss']['note']}.")
    return "\n".join(lines)


def even_first_token_share(length: int) -> float:
    """First-token attention of attention spread evenly over a window of `length` tokens: query i puts 1/(i + 1) on
    token 0, and the mean over queries 1..length-1 (those `sinks` averages) is (H_length - 1) / (length - 1). A
    first-token sink is measured against this level, not against 0."""
    return sum(1 / (i + 1) for i in range(1, length)) / (length - 1)


def sinks_figure(runs: Sequence[SinksResults | str | os.PathLike], names: Sequence[str] | None = None):
    """(figure, (first-token axes, M-Act axes)) of `plot_sinks`, not saved. The first-token panel fits its values
    and marks the level of attention spread evenly over each window length measured (dashed)."""
    docs = [r if isinstance(r, dict) else load_sinks(r) for r in runs]
    names = names or [d["model"].get("name", "?") for d in docs]
    fig, (ax1, ax2) = new_figure(ncols=2, size=(10, 4))  # InputError without matplotlib, before its imports
    from matplotlib.ticker import MaxNLocator

    for name, d in zip(names, docs):
        layers = list(range(d["layers"]))
        ax1.plot(layers, d["first_token_attention"], marker="o", markersize=3, label=name)
        ax2.plot(layers, d["m_act"], marker="o", markersize=3, label=name)
    lengths = sorted({d["settings"]["length"] for d in docs if (d.get("settings") or {}).get("length", 0) > 1})
    for length in lengths:
        ax1.axhline(even_first_token_share(length), color="grey", linestyle="--", linewidth=0.8,
                    label=f"spread evenly over {length} tokens")
    top = max([v for d in docs for v in d["first_token_attention"]] + [even_first_token_share(n) for n in lengths])
    ax1.set_ylim(0, min(1.0, 1.25 * top) if top > 0 else 1.0)
    ax1.set_ylabel("attention on token 0")
    ax1.set_title("First-token attention")
    ax2.set_yscale("log")
    ax2.set_ylabel("max |hidden state|")
    ax2.set_title("Massive activations (M-Act)")
    for ax in (ax1, ax2):
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # layers are whole: no 0.2, 0.4, ... ticks
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return fig, (ax1, ax2)


def plot_sinks(runs: Sequence[SinksResults | str | os.PathLike], out: str | os.PathLike,
               names: Sequence[str] | None = None) -> Path:
    """Two panels, one line per checkpoint: first-token attention by layer, M-Act by layer (log scale).
    `runs` are results or sinks.json paths (or their directories)."""
    fig, _ = sinks_figure(runs, names)
    return save_figure(fig, out)


TABLE4_COLUMNS = ["Method", "Gate score", "M-Act", "F-Attn", "PPL", "RULER avg."]


@dataclass(frozen=True)
class Table4Row:
    """A row of the paper's Table 4 (Qiu et al. 2025): the mean gate score (None: no gate scores), M-Act and
    first-token attention (means over layers), held-out perplexity and the RULER average where known."""

    method: str
    gate: float | None
    m_act: float | None
    f_attn: float | None
    ppl: float | None = None
    ruler: float | None = None

    @classmethod
    def of(cls, method: str, doc: SinksResults, ruler: float | None = None) -> Table4Row:
        """The row of a checkpoint's sinks.json (and its RULER average)."""
        a = doc["averages"]
        return cls(method, a["gate_mean"], a["m_act"], a["first_token_attention"], perplexity(doc), ruler)


def table4_cells(r: Table4Row, absent: str = "–") -> list[str]:
    """A row's TABLE4_COLUMNS cells; `absent` where a value is not known (or there is no gate)."""
    def cell(v: float | None, text) -> str:
        return absent if v is None else text(v)

    return [r.method, cell(r.gate, lambda v: f"{v:.3f}"), cell(r.m_act, _m_act), cell(r.f_attn, lambda v: f"{v:.3f}"),
            cell(r.ppl, lambda v: f"{v:.3f}"), cell(r.ruler, lambda v: f"{v:.2f}")]


def table4_markdown(rows: Sequence[Table4Row]) -> str:
    """The paper's Table 4 layout: a row per method; '–' where a value is not known (or there is no gate)."""
    lines = [markdown_row(TABLE4_COLUMNS), markdown_row(["---"] * len(TABLE4_COLUMNS))]
    return "\n".join(lines + [markdown_row(table4_cells(r)) for r in rows])


COMPARE_COLUMNS = ["First-token attn", "M-Act", "Gate mean"]


def _num_or_null(v) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def _checked_sinks(path: str | os.PathLike) -> SinksResults:
    """`load_sinks(path)`, or InputError naming the file and what it lacks of what compare reads."""
    doc = load_sinks(path)
    a, model = doc.get("averages"), doc.get("model")
    problem = None
    if not isinstance(model, dict):
        problem = "it has no 'model' object"
    elif not isinstance(a, dict) or not all(k in a and _num_or_null(a[k])
                                            for k in ("first_token_attention", "m_act", "gate_mean")):
        problem = "its 'averages' lack first_token_attention, m_act or gate_mean"
    elif a["first_token_attention"] is None or a["m_act"] is None:
        problem = "its 'averages' have no first_token_attention or m_act"
    elif not (isinstance(doc.get("layers"), int) and all(
            isinstance(doc.get(k), list) and len(doc[k]) == doc["layers"] and all(map(_num_or_null, doc[k]))
            for k in ("first_token_attention", "m_act"))):
        problem = "it has no per-layer first_token_attention and m_act for its 'layers'"
    if problem is not None:
        file = Path(path) / SINKS_FILE if Path(path).is_dir() else Path(path)
        raise InputError(f"{file} is incomplete or corrupt: {problem}; run 'longctx sinks CKPT -o DIR' again")
    return doc


def sinks_for_runs(runs: Sequence[dict], dirs: Sequence[Path], extra: Sequence[str | os.PathLike] = ()
                   ) -> tuple[list[SinksResults | None], list[str]]:
    """The sinks results of each RULER run's checkpoint, matched by model fingerprint: `<run_dir>/sinks.json`
    or one of `extra` (sinks.json files or directories holding one). Returns (per run: results or None, notes)."""
    notes: list[str] = []
    by_fp: dict[str, SinksResults] = {}
    for path in extra:
        doc = _checked_sinks(path)
        by_fp[doc["model"].get("fingerprint")] = doc
    found: list[SinksResults | None] = []
    for run, d in zip(runs, dirs):
        fp = run["model"].get("fingerprint")
        doc = by_fp.get(fp)
        if doc is None and (Path(d) / SINKS_FILE).is_file():
            doc = _checked_sinks(d)
            if doc["model"].get("fingerprint") != fp:
                notes.append(f"{Path(d) / SINKS_FILE} is for another checkpoint than the run; ignored")
                doc = None
        found.append(doc)
    return found, notes


def compare_cells(doc: SinksResults | None) -> list[str]:
    """The COMPARE_COLUMNS cells of one run: '-' without sinks results, 'no gate' for a baseline."""
    if doc is None:
        return ["-"] * len(COMPARE_COLUMNS)
    a = doc["averages"]
    return [_num(a["first_token_attention"]), _m_act(a["m_act"]), _num(a["gate_mean"])]


def write_sinks_report(out_dir: str | os.PathLike, plot: bool = True) -> Report:
    """`out_dir/sinks.json` -> sinks.md (Table 4 layout, then per-layer tables) and sinks.png."""
    out = Path(out_dir)
    results = load_sinks(out)
    rep = Report(results, [out / SINKS_FILE])
    rep.markdown = sinks_markdown([results]) + "\n\n" + layer_markdown(results)
    write_atomic(out / "sinks.md", rep.markdown + "\n")
    rep.files.append(out / "sinks.md")
    if plot:
        try:
            rep.files.append(plot_sinks([results], out / "sinks.png"))
        except InputError as e:
            rep.notes.append(f"no plot: {e}")
    return rep

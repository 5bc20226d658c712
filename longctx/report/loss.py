"""Training-loss curves of the checkpoints a recipe trained: `loss.md` and `loss.png` from `train_log.jsonl`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from longctx.core.errors import InputError
from longctx.core.files import write_atomic
from longctx.core.parse import loads
from longctx.extend.output import LOG_FILE


def read_train_log(path: Path) -> list[dict[str, Any]]:
    """The steps of a train_log.jsonl that carry a loss (a torn or foreign line is skipped)."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = loads(line)
        except ValueError:  # torn, or over a limit of `loads`
            continue
        if isinstance(row, dict) and isinstance(row.get("loss"), (int, float)):
            rows.append(row)
    return rows


def training_curves(checkpoints: list[Path], out: Path) -> tuple[str, list[Path], list[str]]:
    """The training loss of each checkpoint's train_log.jsonl: (Markdown table, files written, notes)."""
    from longctx.report.plots import new_figure, save_figure

    logs = {c.name: read_train_log(c / LOG_FILE) for c in checkpoints if (c / LOG_FILE).is_file()}
    if not logs:
        return "", [], []
    lines = ["| Run | steps | tokens | first loss | final loss (mean of last 10%) |", "| --- | --- | --- | --- | --- |"]
    for name, rows in logs.items():
        tail = rows[-max(1, len(rows) // 10):]
        final = sum(r["loss"] for r in tail) / len(tail)
        lines.append(f"| {name} | {rows[-1].get('step', len(rows))} | {rows[-1].get('tokens', '')} | "
                     f"{rows[0]['loss']:.4f} | {final:.4f} |")
    md = "\n".join(lines)
    write_atomic(out / "loss.md", md + "\n")
    files, notes = [out / "loss.md"], []
    try:
        fig, ax = new_figure()
        for name, rows in logs.items():
            ax.plot([r.get("step", i + 1) for i, r in enumerate(rows)], [r["loss"] for r in rows], label=name)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("training loss")
        ax.set_title("training loss")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        files.append(save_figure(fig, out / "loss.png"))
    except InputError as e:
        notes.append(f"no loss plot: {e}")
    return md, files, notes

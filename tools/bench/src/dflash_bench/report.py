"""Writing a benchmark: JSON (everything), a Markdown table (for docs/benchmarks.md), a PNG plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from dflash_core.fileio import atomic_file, write_json
from .machine import describe, one_line


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence]) -> str:
    def cell(value) -> str:
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 100 else f"{value:.1f}"
        return str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_report(out: Path, name: str, *, title: str, command: str, columns: Sequence[str], rows: Sequence[Sequence],
                 data: dict, notes: Sequence[str] = ()) -> Path:
    """out/name.json, out/name.md; returns the Markdown path. The machine is described in both."""
    out.mkdir(parents=True, exist_ok=True)
    machine = describe()
    write_json(out / f"{name}.json", {"title": title, "command": command, "machine": machine, "columns": list(columns),
                                       "rows": [list(r) for r in rows], "data": data, "notes": list(notes)})
    text = [f"### {title}", "", f"Machine: {one_line(machine)}.", "", f"Command: `{command}`", "",
            markdown_table(columns, rows), ""]
    text += [f"- {note}" for note in notes]
    with atomic_file(out / f"{name}.md", "w") as handle:
        handle.write("\n".join(text).rstrip() + "\n")
    return out / f"{name}.md"


def plot_lines(path: Path, title: str, xlabel: str, ylabel: str, series: dict[str, tuple[list, list]],
               hline: float | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", label=label)
    if hline is not None:
        ax.axhline(hline, color="grey", linestyle="--", linewidth=1)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_bars(path: Path, title: str, ylabel: str, labels: list[str], values: list[float],
              hline: float | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import textwrap

    fig, ax = plt.subplots(figsize=(max(6.4, 1.1 * len(labels)), 4.4), dpi=120)
    ax.bar(labels, values, color="#4c72b0")
    if hline is not None:
        ax.axhline(hline, color="grey", linestyle="--", linewidth=1)
    ax.set_title("\n".join(textwrap.wrap(title, 60)), fontsize=10)
    ax.set_ylabel(ylabel)
    ax.tick_params(axis="x", labelrotation=25, labelsize=8)
    for i, v in enumerate(values):
        ax.text(i, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def load(path: Path) -> dict:
    return json.loads(Path(path).read_text())

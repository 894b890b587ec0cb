"""Writing a benchmark: JSON (everything), a Markdown table (for docs/benchmarks.md), a PNG plot."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from dflash_core.files.atomic import atomic_file, atomic_path, write_json
from .machine import describe, one_line


def pair_parser(doc: str | None, *, prompts: bool = True, max_new_tokens: int = 128) -> argparse.ArgumentParser:
    """A study's argument parser with the pair it measures (the demo pair by default) and, with `prompts`, the
    held-out prompts it decodes (--prompts-file, --prompts, --max-new-tokens); the study adds its own."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, default=Path("models/demo/target"))
    parser.add_argument("--drafter", type=Path, default=Path("models/demo/drafter"))
    if prompts:
        parser.add_argument("--prompts-file", type=Path, default=Path("models/demo/heldout.jsonl"))
        parser.add_argument("--prompts", type=int, default=24)
        parser.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    return parser


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


def _pyplot():
    """matplotlib's pyplot on the Agg backend, or None where matplotlib is missing (e.g. a bare GPU box)."""
    try:
        import matplotlib
    except ImportError:
        print("note: matplotlib is not installed: plots skipped (JSON and Markdown are written)", file=sys.stderr)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    """Write the figure whole or not at all (a temporary sibling, then renamed)."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=Path(path).suffix.lstrip(".") or "png")


def plot_lines(path: Path, title: str, xlabel: str, ylabel: str, series: dict[str, tuple[list, list]],
               hline: float | None = None, *, dashed: Sequence[str] = (), logx: bool = False,
               xticks: Sequence[float] = ()) -> None:
    """One line per series, measured points marked; `dashed` series (fits, predictions) drawn unmarked;
    `xticks`: the x values to label (e.g. the concurrencies on a log axis)."""
    plt = _pyplot()
    if plt is None:
        return

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for label, (xs, ys) in series.items():
        style = {"linestyle": "--"} if label in dashed else {"marker": "o"}
        ax.plot(xs, ys, label=label, **style)
    if hline is not None:
        ax.axhline(hline, color="grey", linestyle="--", linewidth=1)
    if logx:
        ax.set_xscale("log")
    if xticks:
        ax.set_xticks(list(xticks), [f"{x:g}" for x in xticks])
        ax.minorticks_off()
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def plot_bars(path: Path, title: str, ylabel: str, labels: list[str], values: list[float],
              hline: float | None = None) -> None:
    plt = _pyplot()
    if plt is None:
        return

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
    _save(fig, path)
    plt.close(fig)


def plot_points(path: Path, title: str, ylabel: str, groups: dict[str, list[float]],
                hline: float | None = None) -> None:
    """One box per group with every value drawn on it as a point (e.g. one point per prompt)."""
    plt = _pyplot()
    if plt is None:
        return

    import textwrap

    labels = list(groups)
    fig, ax = plt.subplots(figsize=(max(6.4, 1.1 * len(labels)), 4.4), dpi=120)
    ax.boxplot([groups[k] for k in labels], widths=0.5, showfliers=False)
    for i, label in enumerate(labels, start=1):
        values = groups[label]
        offsets = [0.0] if len(values) == 1 else [0.3 * (j / (len(values) - 1) - 0.5) for j in range(len(values))]
        ax.scatter([i + o for o in offsets], values, s=12, color="#4c72b0", alpha=0.7, zorder=3)
    if hline is not None:
        ax.axhline(hline, color="grey", linestyle="--", linewidth=1)
    ax.set_xticks(range(1, len(labels) + 1), labels)
    ax.set_title("\n".join(textwrap.wrap(title, 60)), fontsize=10)
    ax.set_ylabel(ylabel)
    ax.tick_params(axis="x", labelrotation=25, labelsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def load(path: Path) -> dict:
    return json.loads(Path(path).read_text())

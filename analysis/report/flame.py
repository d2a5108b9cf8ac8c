"""The report's Python flame graphs: per process, one icicle chart per phase (a selector),
drawn as horizontal bars so the page's partial plotly.js (cartesian bundle, no
icicle trace) draws it; zoom by dragging along x, double-click to reset.

Bounded whatever the run's length: frames are merged by function and file (not
line), a node narrower than ``MIN_SHARE`` of its phase's samples goes with its
subtree, at most ``MAX_NODES`` nodes per phase and ``MAX_PROCESSES`` processes
(the ones with the most samples); the section says what was left out.
"""

from __future__ import annotations

import os
import zlib
from typing import Dict, List, Optional, Tuple

import numpy as np
import pandas as pd

from stepscope.analysis.tables.samples import stack_paths
from stepscope.core.vocabulary import OTHER, PHASES

MAX_NODES = 250
MIN_SHARE = 0.005
MAX_PROCESSES = 4
ALL = "whole steps"


def _label(function: str, file: str) -> str:
    return f"{function} ({os.path.basename(file)})"


def flame_nodes(counts: Dict[int, int], paths, labels, max_nodes: int = MAX_NODES,
                min_share: float = MIN_SHARE) -> Tuple[pd.DataFrame, int]:
    """counts: samples per stack id. Returns (nodes: label, depth, x0, samples (the width); the
    number of nodes left out). Children are laid out widest first (left-heavy)."""
    total = sum(counts.values())
    node_of: Dict[Tuple[int, str], int] = {}
    parent: List[int] = []
    label: List[str] = []
    n: List[int] = []
    for st, c in counts.items():
        at = -1
        for s in paths[st]:
            key = (at, labels[s])
            node = node_of.get(key)
            if node is None:
                node = node_of[key] = len(label)
                parent.append(at)
                label.append(labels[s])
                n.append(0)
            n[node] += c
            at = node
    count = np.array(n, dtype=np.int64)
    keep = count >= max(1, min_share * total)
    if keep.sum() > max_nodes:
        keep &= count >= np.sort(count[keep])[::-1][max_nodes - 1]
        keep[np.flatnonzero(keep)[max_nodes:]] = False  # ties: the first ones (parents come first)
    for i in range(len(parent)):  # parents come first: a node needs its parent kept
        if keep[i] and parent[i] >= 0 and not keep[parent[i]]:
            keep[i] = False
    children: Dict[int, List[int]] = {}
    for i in np.flatnonzero(keep):
        children.setdefault(parent[i], []).append(int(i))
    rows, todo, x = [], [], 0
    for root in sorted(children.get(-1, []), key=lambda c: -count[c]):  # roots side by side
        todo.append((root, 0, x))
        x += int(count[root])
    while todo:
        node, depth, x0 = todo.pop()
        rows.append((label[node], depth, x0, int(count[node])))
        for kid in sorted(children.get(node, []), key=lambda c: -count[c]):  # widest first, from the left
            todo.append((kid, depth + 1, x0))
            x0 += int(count[kid])
    return (pd.DataFrame(rows, columns=["label", "depth", "x0", "samples"]),
            int(len(parent) - keep.sum()))


def _color(label: str) -> str:
    h = zlib.crc32(label.encode()) & 0xFFFF
    return f"hsl({20 + h % 35},{70 + h % 20}%,{55 + (h >> 8) % 15}%)"  # warm, like flame graphs


def flame_figures(run) -> Tuple[list, str]:
    """Figures (one per process) and a note on what was reduced; ([], '') without samples."""
    import plotly.graph_objects as go

    s = run.samples
    s = s[s["phase"].notna()] if len(s) else s  # the loop threads' samples within steps
    if not len(s):
        return [], ""
    stacks = run.stacks
    paths = stack_paths(stacks)
    labels = [_label(f, fl) for f, fl in zip(stacks["function"], stacks["file"])]
    by_proc = s.groupby("process", observed=True).size().sort_values(ascending=False)
    figs, left_out, notes = [], 0, []
    for proc in by_proc.index[:MAX_PROCESSES]:
        mine = s[s["process"] == proc]
        interval = float(mine["interval_ns"].iloc[0]) / 1e9
        order = [p for p in (*PHASES, OTHER) if (mine["phase"] == p).any()]
        fig = go.Figure()
        buttons = []
        for i, phase in enumerate([ALL, *order]):
            sel = mine if phase == ALL else mine[mine["phase"] == phase]
            counts = sel["stack"].value_counts().to_dict()
            nodes, dropped = flame_nodes(counts, paths, labels)
            left_out += dropped
            total = len(sel)
            fig.add_trace(go.Bar(
                orientation="h", base=nodes["x0"], x=nodes["samples"], y=nodes["depth"], width=0.95,
                text=nodes["label"], textposition="inside", insidetextanchor="start", textfont={"size": 11},
                marker={"color": [_color(lbl) for lbl in nodes["label"]], "line": {"width": 1, "color": "white"}},
                customdata=np.column_stack([np.round(nodes["samples"] * interval, 3),
                                            np.round(100 * nodes["samples"] / max(total, 1), 1)]),
                hovertemplate="%{text}<br>%{x} samples, %{customdata[0]} s, %{customdata[1]}% of "
                              + phase + "<extra></extra>",
                name=phase, visible=i == 0, showlegend=False))
            depth = int(nodes["depth"].max()) + 1 if len(nodes) else 1
            buttons.append({"label": f"{phase} ({total} samples, {total * interval:.2f} s)", "method": "update",
                            "args": [{"visible": [j == i for j in range(len(order) + 1)]},
                                     {"yaxis.range": [depth - 0.5, -0.5], "xaxis.autorange": True}]})
        first_depth = int(fig.data[0].y.max()) + 1 if len(fig.data[0].y) else 1
        fig.update_layout(
            title=f"Python stacks of {proc} (root at the top; drag to zoom, double-click to reset)",
            height=min(1000, 170 + 24 * max(first_depth, 8)), bargap=0,
            updatemenus=[{"buttons": buttons, "x": 0, "xanchor": "left", "y": 1.12, "yanchor": "bottom"}],
            xaxis={"title": "samples", "zeroline": False},
            yaxis={"autorange": False, "range": [first_depth - 0.5, -0.5], "fixedrange": True,
                   "showticklabels": False, "title": "stack depth"},
            margin={"t": 90})
        figs.append(fig)
        notes.append(f"{proc}: {int(by_proc[proc])} samples")
    note = (f"<p class='muted'>Python stack samples in steps, per phase of the loop's thread "
            f"({'; '.join(notes)}), frames merged by function and file. To keep this page small, frames "
            f"under {100 * MIN_SHARE:g}% of a phase's samples and beyond the widest {MAX_NODES} per phase are "
            f"left out ({left_out} left out)")
    if len(by_proc) > MAX_PROCESSES:
        note += f", and only the {MAX_PROCESSES} processes with the most samples of {len(by_proc)} are shown"
    note += (f". Every sample: <code>stepscope export {run.name} --format speedscope</code> "
             f"(or <code>--format collapsed</code> for flamegraph.pl).</p>")
    return figs, note


def flame_section(run, esc) -> Optional[Tuple[str, list]]:
    """(head html, figures) for the report, or None when the run has no samples in steps."""
    try:
        figs, note = flame_figures(run)
    except Exception:  # noqa: BLE001 - a run without readable samples has no flame graphs
        return None
    if not figs:
        return None
    return note.replace(f"export {run.name} ", f"export {esc(run.name)} "), figs

"""The report's Compilation section (torch.compile; analysis/compilation.py): per compiled
function its compiles, recompiles and dynamo's reasons, the graph breaks by place, and a
picture of the time each train step spent compiling beside the rest of the step."""

from __future__ import annotations

import numpy as np

from stepscope.core.vocabulary import TRAIN

MAX_BARS = 2000  # train steps drawn (a longer run: its first ones, where compiling happens)


def compilation_section(run, esc, summary: dict):
    """(html head, figures), or None where nothing was compiled."""
    import plotly.graph_objects as go

    c = summary.get("compilation")
    if not c:
        return None
    head = (f"<p>{c['compiles']} compile(s), {c['recompiles']} recompile(s), {c['graph_breaks']} graph break(s): "
            f"{c['total_ms'] / 1e3:.2f} s compiling, {100 * c['share_of_train']:.1f}% of train step time.</p>")
    rows = "".join(f"<tr><td>{esc(place)}</td><td>{f['compiles']}</td><td>{f['recompiles']}</td>"
                   f"<td>{f['compile_ms'] / 1e3:.2f}</td><td>{esc('; '.join(f['reasons']))}</td></tr>"
                   for place, f in c["functions"].items())
    head += ("<table class='grid compiles'><tr><th>compiled function</th><th>compiles</th><th>recompiles</th>"
             f"<th>compile time (s)</th><th>why it recompiled (dynamo)</th></tr>{rows}</table>")
    for hit in c.get("limits", []):
        when = f"from {hit['mode']} step {hit['step']} on" if "step" in hit else "from then on"
        head += (f"<p class='warn'><b>{esc(hit['function'])}</b> hit torch._dynamo's {esc(hit['limit'])} "
                 f"({esc(hit['value'])}): it runs uncompiled {esc(when)} (last reason: {esc(hit['reason'])}).</p>")
    if c["breaks"]:
        rows = "".join(f"<tr><td>{esc(b['file'])}:{b['line']}</td><td>{esc(b['function'] or '')}</td>"
                       f"<td>{esc(b.get('reason') or '')}</td></tr>" for b in c["breaks"])
        head += ("<h3>Graph breaks</h3><table class='grid breaks'><tr><th>place</th><th>function</th>"
                 f"<th>reason (dynamo)</th></tr>{rows}</table>")
    steps = run.steps
    train = steps[steps["mode"] == TRAIN].sort_values("start_ns", kind="stable").head(MAX_BARS)
    if not len(train):
        return head, []
    compiling = train["compile_ns"].to_numpy(np.int64) / 1e6
    rest = np.maximum(train["duration_ns"].to_numpy() / 1e6 - compiling, 0)
    label = train["process"].astype(str) + " step " + train["step"].astype(str)
    x = np.arange(len(train))
    fig = go.Figure([go.Bar(x=x, y=np.round(compiling, 3), name="compiling", marker_color="#c0392b",
                            hovertext=label),
                     go.Bar(x=x, y=np.round(rest, 3), name="rest of the step", marker_color="#bab0ac",
                            hovertext=label)])
    fig.update_layout(barmode="stack", title="Train steps: time spent compiling (torch.compile)",
                      xaxis_title="train step (in start order)", yaxis_title="ms")
    return head, [fig]

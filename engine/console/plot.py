"""``polyindex eval --plot FILE``: the console's evaluation charts written to a file.

``.html``: one self-contained page (the shipped Chart.js, the console's own chart code and
the summary inlined: no network, no server) drawing what the console's Evaluate page draws.
``.png``: the same three charts with matplotlib, the optional extra ``polyindex[plot]``.
"""
from __future__ import annotations

import json
from pathlib import Path

from polyindex.errors import InvalidArgument

STATIC = Path(__file__).resolve().parent / "static"
FORMATS = (".html", ".png")


def check_target(path: Path) -> str:
    """The plot's format from its suffix, checked before any query runs."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise InvalidArgument(f"--plot {path}: give a .html or .png file")
    if suffix == ".png":
        _pyplot()
    return suffix


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")  # no display: files only
        import matplotlib.pyplot as plt
    except ImportError:
        raise InvalidArgument("--plot FILE.png needs matplotlib: pip install 'polyindex[plot]' "
                              "(or write --plot FILE.html, which needs nothing)") from None
    return plt


def write_plot(path: Path, summary: dict, title: str) -> None:
    if check_target(path) == ".html":
        Path(path).write_text(html(summary, title), encoding="utf-8")
    else:
        png(path, summary, title)


def _script(text: str) -> str:
    return text.replace("</script", "<\\/script")  # an inlined script cannot end early


def html(summary: dict, title: str) -> str:
    css = (STATIC / "console.css").read_text(encoding="utf-8")
    chart = (STATIC / "vendor" / "chart.umd.min.js").read_text(encoding="utf-8")
    charts = (STATIC / "charts.js").read_text(encoding="utf-8")
    data = json.dumps(summary, allow_nan=False)
    esc = title.replace("&", "&amp;").replace("<", "&lt;")
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>{esc}</title><style>{css}</style>
<script>{_script(chart)}</script><script>{_script(charts)}</script></head>
<body><main><h1>{esc}</h1><div id="table"></div><div class="charts" id="charts"></div></main>
<script>
const summary = {_script(data)};
document.getElementById("table").append(PICharts.evalTable(summary));
PICharts.evaluation(document.getElementById("charts"), summary);
</script></body></html>
"""


def png(path: Path, s: dict, title: str) -> None:
    plt = _pyplot()
    import numpy as np
    others = s["profiles"][1:]
    fig, axes = plt.subplots(1, 3 if others else 1, figsize=(18 if others else 7, 5),
                             squeeze=False)
    ax = axes[0][0]
    n, m = len(s["profiles"]), len(s["measures"])
    width = 0.8 / n
    x = np.arange(m)
    for i, p in enumerate(s["profiles"]):
        v = [s["means"][p][k] for k in s["measures"]]
        mean = np.array([e["mean"] for e in v])
        err = np.array([[e["mean"] - e["low"] for e in v], [e["high"] - e["mean"] for e in v]])
        ax.bar(x + (i - (n - 1) / 2) * width, mean, width, yerr=err, capsize=3, label=p)
    ax.set_xticks(x, s["measures"])
    ax.set_title(f"each measure per profile ({s['queries']} queries, "
                 f"{round(100 * s['confidence'])}% CI)")
    ax.legend()
    if others:
        ax = axes[0][1]
        labels = [f"{p} · {k}" for p in others for k in s["measures"]]
        left = np.zeros(len(labels))
        for key, color in (("wins", "#59a14f"), ("ties", "#bab0ac"), ("losses", "#e15759")):
            vals = np.array([s["wins"][p][k][key] for p in others for k in s["measures"]])
            ax.barh(labels, vals, left=left, color=color, label=key)
            left += vals
        ax.invert_yaxis()
        ax.set_title(f"per-query wins, ties and losses against {s['baseline']}")
        ax.legend()
        ax = axes[0][2]
        for p in others:
            d = [e["delta"] for e in s["deltas"].get(p, [])]
            ax.bar(np.arange(1, len(d) + 1), d, label=p, alpha=0.8)
        ax.axhline(0, color="#333", linewidth=0.8)
        ax.set_title(f"{s['measures'][0]} per query minus {s['baseline']}'s (sorted)")
        ax.set_xlabel("queries")
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

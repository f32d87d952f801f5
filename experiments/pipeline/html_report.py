"""The self-contained HTML report of one pipeline run folder (layout: the pipeline's output sheet).

``write_report("runs/pipeline/synthetic")`` writes ``runs/pipeline/synthetic/report/report.html``:
inline CSS, every figure an inline base64 PNG, no script, no external resource. A stage whose
files are missing renders as "not run"; one whose files cannot be read or plotted renders the
error instead of failing the pipeline.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import re
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from experiments.pipeline.paths import portable_path, shown_folder
from recsys.io import atomic_write_text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["write_report"]

#: stages in pipeline order (the timing table lists them in this order, unknown ones last)
STAGES = ("quality", "screening", "selection", "dims", "tuning", "final", "original", "compare", "report")

CSS = """body{font-family:system-ui,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1100px;padding:0 1em}
h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}th{background:#f3f3f3}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:left;vertical-align:top}
td.n{text-align:right;font-variant-numeric:tabular-nums}tr.flag td{background:#fff3f0}
img{max-width:100%;display:block;margin:.6em 0}pre{background:#f7f7f7;padding:.6em;overflow-x:auto}
.muted{color:#777}.warn{color:#a33}.ok{color:#2a7a2a;font-weight:bold}.bad{color:#b22;font-weight:bold}"""


# -- small helpers ---------------------------------------------------------------------------------
def _e(value: Any) -> str:
    return html.escape(str(value))


def _load(path: Path) -> Any | None:
    """The JSON at ``path``; None when the file does not exist (invalid JSON raises)."""
    return json.loads(path.read_text()) if path.is_file() else None


def _dig(data: Any, *keys: str) -> Any:
    for key in keys:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def _path(value: Any, out: Path) -> str:
    """A path of a stage result, relative to the run folder or the repository (``n/a`` if none)."""
    return "n/a" if not value else portable_path(str(value), out)


def _real(x: Any) -> float | None:
    """``x`` as a finite float, else None."""
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    return float(x) if ok else None


def _num(x: Any, spec: str = ".4f") -> str:
    """A number formatted with ``spec`` (``","``: integer with separators); ``n/a`` for None /
    NaN; anything else as text."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    return format(int(x) if spec in (",", "+,") else x, spec)


def _bytes(n: Any) -> str:
    b = _real(n)
    return "n/a" if b is None else f"{b / 1e6:.2f} MB" if b >= 1e6 else f"{b / 1e3:.1f} kB"


def _ratio(new: Any, old: Any) -> str:
    a, b = _real(new), _real(old)
    return f"{a / b:.3g}x" if a is not None and b else "n/a"


def _diff(new: Any, old: Any, spec: str = "+.4f") -> str:
    a, b = _real(new), _real(old)
    return "n/a" if a is None or b is None else _num(a - b, spec)


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]], flagged: Sequence[bool] = ()) -> str:
    """An HTML table; every cell is escaped, cells that read as numbers are right-aligned."""

    def cell(v: Any) -> str:
        text = str(v)
        numeric = text.replace(",", "").replace(".", "").lstrip("+-").rstrip("x").isdigit()
        return f'<td class="n">{_e(text)}</td>' if numeric else f"<td>{_e(text)}</td>"

    out = ["<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"]
    for i, row in enumerate(rows):
        cls = ' class="flag"' if i < len(flagged) and flagged[i] else ""
        out.append(f"<tr{cls}>" + "".join(cell(v) for v in row) + "</tr>")
    return "".join(out) + "</table>"


def _names(names: Sequence[Any]) -> str:
    return ", ".join(_e(n) for n in names) if names else '<span class="muted">none</span>'


def _p(text: str, cls: str = "") -> str:
    return f'<p class="{cls}">{_e(text)}</p>' if cls else f"<p>{_e(text)}</p>"


def _img(make: Callable[[], Figure], alt: str) -> str:
    """``make()``'s figure as an inline PNG ``<img>`` (a failing plot renders its error); every
    figure opened meanwhile is closed."""
    import matplotlib.pyplot as plt

    before, buf = set(plt.get_fignums()), io.BytesIO()
    try:
        make().savefig(buf, format="png", dpi=100, bbox_inches="tight", metadata={"Software": None})
    except Exception as e:  # a broken plot must not sink the whole report
        return _p(f"{alt}: plot failed ({type(e).__name__}: {e})", "warn")
    finally:
        for num in set(plt.get_fignums()) - before:
            plt.close(num)
    return f'<img src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode("ascii")}" alt="{_e(alt)}">'


# -- header ----------------------------------------------------------------------------------------
def _header(out: Path) -> tuple[str, str]:
    """``(pipeline name, header HTML)``: name, date, MLflow parent run, stage timings, config."""
    try:
        state = _load(out / "pipeline_state.json") or {}
    except ValueError as e:
        return out.name, f"<h1>{_e(out.name)}</h1>" + _p(f"pipeline_state.json could not be read: {e}", "warn")
    name = str(state.get("name") or out.name)
    stages: dict[str, Any] = state.get("stages") or {}
    order = [s for s in STAGES if s in stages] + [s for s in stages if s not in STAGES]
    rows = [[s, _dig(stages, s, "status") or "done", _num(_dig(stages, s, "seconds"), ".1f"),
             _num(_dig(stages, s, "peak_rss_mb"), ",.0f"), _dig(stages, s, "run_id") or "",
             _dig(stages, s, "finished_at") or ""] for s in order]
    total = sum(_real(_dig(stages, s, "seconds")) or 0.0 for s in order)
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        f"<h1>Pipeline report: {_e(name)}</h1>",
        f'<p class="muted">generated {_e(now)} from {_e(shown_folder(out))}</p>',
        _table(["item", "value"], [["MLflow parent run", state.get("parent_run_id") or "n/a"],
                                   ["config sha", state.get("config_sha") or "n/a"]]),
        "<h3>Stage timings</h3>",
        _table(["stage", "status", "seconds", "peak RSS MB", "run id", "finished at"],
               [*rows, ["total", "", f"{total:.1f}", "", "", ""]])
        if rows else _p("no stage has finished yet", "muted"),
    ]
    if (out / "config.yaml").is_file():
        parts.append(f"<details><summary>resolved config</summary><pre>{_e(_config_text(out))}</pre>"
                     "</details>")
    return name, "\n".join(parts)


def _config_text(out: Path) -> str:
    """``config.yaml`` with its ``output`` folder named as :func:`shown_folder` does."""
    text = (out / "config.yaml").read_text()
    return re.sub(r"^output: (/.*|[A-Za-z]:\\.*)$", lambda m: f"output: {shown_folder(m.group(1).strip())}", text,
                  flags=re.M)


# -- sections (each returns None when its stage did not run) -------------------------------------
def _compare(out: Path) -> str | None:
    """Original vs final: table with changes, AUC verdict, bar chart."""
    compare = _load(out / "compare" / "result.json") or {}
    orig = compare.get("original") or _load(out / "original" / "result.json")
    final = compare.get("final") or _load(out / "final" / "result.json")
    if not orig or not final:
        return None
    batches = sorted(set(orig.get("latency_ms") or {}) | set(final.get("latency_ms") or {}),
                     key=lambda b: (int(b) if str(b).isdigit() else 1 << 62, str(b)))
    rows: list[list[Any]] = []
    for label, key, fmt, change in [
        ("features", "n_features", ",", lambda a, b: _diff(a, b, "+,")),
        ("embedding parameters", "embedding_parameters", ",", lambda a, b: f"{_diff(a, b, '+,')} ({_ratio(a, b)})"),
        ("test AUC", "test_auc", ".4f", _diff),
        ("test log loss", "test_logloss", ".4f", _diff),
    ]:
        a, b = orig.get(key), final.get(key)
        rows.append([label, _num(a, fmt), _num(b, fmt), change(b, a)])
    rows.append(["export size", _bytes(orig.get("export_bytes")), _bytes(final.get("export_bytes")),
                 _ratio(final.get("export_bytes"), orig.get("export_bytes"))])
    for b in batches:
        for q in ("median", "p90"):
            o, f = _dig(orig, "latency_ms", b, q), _dig(final, "latency_ms", b, q)
            rows.append([f"latency batch {b} {q} (ms)", _num(o, ".3f"), _num(f, ".3f"), _ratio(f, o)])
    auc_line = (f"final test AUC {_num(final.get('test_auc'))} vs original {_num(orig.get('test_auc'))} "
                f"(change {_diff(final.get('test_auc'), orig.get('test_auc'))})")
    within = compare.get("within_tolerance")
    interval = compare.get("test_auc_interval")
    if interval:  # DeLong's interval of the paired difference on the same test rows
        auc_line += (f", 95% interval [{interval['low']:+.4f}, {interval['high']:+.4f}] on the same "
                     f"{interval['n']:,} test rows (DeLong): {compare.get('verdict')}")
    elif within is not None:
        auc_line += ", one run each, no paired interval (the test pass kept no scores)"
    if within is None:
        verdict = _p(f"{auc_line}; no verdict: the compare stage did not run", "muted")
    else:
        word, cls = ("within", "ok") if within else ("NOT within", "bad")
        verdict = _p(f"{auc_line}: {word} the AUC tolerance of {_num(compare.get('auc_tolerance'), 'g')}", cls)

    def chart() -> Figure:
        import matplotlib.pyplot as plt

        metrics: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
            ("embedding parameters", lambda s: s.get("embedding_parameters")),
            ("export size (MB)", lambda s: (_real(s.get("export_bytes")) or math.nan) / 1e6),
            *[(f"latency batch {b} median (ms)", lambda s, b=b: _dig(s, "latency_ms", b, "median")) for b in batches],
        ]
        fig, axes = plt.subplots(1, len(metrics), figsize=(2.6 * len(metrics), 2.8), squeeze=False)
        for ax, (label, value) in zip(axes[0], metrics):
            heights = [math.nan if _real(value(s)) is None else _real(value(s)) for s in (orig, final)]
            ax.bar(["original", "final"], heights, color=["0.6", "tab:blue"])
            ax.set_title(label, fontsize=9)
            ax.tick_params(labelsize=8)
        fig.tight_layout()
        return fig

    return "\n".join([verdict, _table(["", "original", "final", "change"], rows), _img(chart, "original vs final")])


def _quality(out: Path) -> str | None:
    """Dropped features with their flags; the per-feature quality table."""
    result, report = _load(out / "quality" / "result.json"), _load(out / "quality" / "quality.json")
    if result is None and report is None:
        return None
    parts = []
    if result is not None:
        dropped: dict[str, list[str]] = result.get("dropped") or {}
        parts.append(_p(f"{result.get('n_rows', 'n/a')} rows; {len(result.get('kept') or [])} features kept, "
                        f"{len(dropped)} dropped"))
        if dropped:
            parts.append(_table(["dropped feature", "flags"], [[f, ", ".join(v)] for f, v in dropped.items()]))
    if report is not None:
        if report.get("scoring_error"):
            parts.append(_p(f"OutRank scoring skipped: {report['scoring_error']}", "muted"))
        feats = report.get("features") or []
        rows = [[f.get("feature"), f.get("kind"), _num(f.get("cardinality"), ","), _num(f.get("coverage"), ".3f"),
                 _num(f.get("relevance"), ".4g"), ", ".join(f.get("flags") or [])] for f in feats]
        parts += ["<h3>Per-feature quality</h3>",
                  _table(["feature", "kind", "cardinality", "coverage", "relevance", "flags"], rows,
                         [bool(f.get("flags")) for f in feats])]
    return "\n".join(parts)


def _screening(out: Path) -> str | None:
    """OutRank importance bars; kept and dropped features with reasons."""
    result = _load(out / "screening" / "result.json")
    if result is None:
        return None
    from selection import ImportanceReport

    parts = []
    if (out / "screening" / "outrank.json").is_file():
        parts.append(_img(ImportanceReport.load(out / "screening" / "outrank.json").plot, "OutRank importance"))
    kept, dropped = result.get("kept") or [], result.get("dropped") or {}
    parts.append(f"<p><b>kept ({len(kept)}):</b> {_names(kept)}</p>")
    parts.append(_table(["dropped feature", "reason"], list(dropped.items())) if dropped else _p("nothing dropped"))
    return "\n".join(parts)


def _selection(out: Path) -> str | None:
    """Chosen k and kept features; the method's (LeAP's) importance bars; the AUC-vs-k curve against
    random rankings."""
    result = _load(out / "selection" / "result.json")
    if result is None:
        return None
    from selection import ImportanceReport, SelectionCurve

    parts = [f"<p><b>chosen k = {_e(result.get('k', 'n/a'))}</b>; kept: {_names(result.get('kept') or [])}</p>",
             f"<p>dropped: {_names(result.get('dropped') or [])}</p>"]
    curve = result.get("curve") or {}
    if curve:
        parts.append(_table(["validation AUKC", "test AUKC", "random test AUKC (mean)", "all-features validation AUC",
                             "all-features test AUC", "smallest k within tolerance (chosen on validation)"],
                            [[_num(curve.get("val_aukc")), _num(curve.get("aukc")), _num(curve.get("random_aukc_mean")),
                              _num(curve.get("full_val_auc")), _num(curve.get("full_test_auc")),
                              curve.get("smallest_k_within_tolerance", "n/a")]]))
    method = str(result.get("method") or "leap")  # the importance file is named after the method
    if (out / "selection" / f"{method}.json").is_file():
        parts.append(_img(ImportanceReport.load(out / "selection" / f"{method}.json").plot, f"{method} importance"))
    if (out / "selection" / "curve.json").is_file():
        parts.append(_img(SelectionCurve.load(out / "selection" / "curve.json").plot, "selection curve"))
    return "\n".join(parts)


def _dims(out: Path) -> str | None:
    """Budget vs parameters vs uniform; the per-feature dims plot (uniform dim dashed)."""
    result = _load(out / "dims" / "result.json")
    if result is None:
        return None
    params, budget, uniform = result.get("parameters"), result.get("budget"), result.get("uniform_parameters")
    parts = [_table(["method", "budget", "parameters", "parameters / budget", "uniform dim", "uniform parameters",
                     "parameters / uniform"],
                    [[result.get("method", "n/a"), _num(budget, ","), _num(params, ","), _ratio(params, budget),
                      result.get("uniform_dim", "n/a"), _num(uniform, ","), _ratio(params, uniform)]])]
    if (out / "dims" / "plan.json").is_file():
        from embeddings import DimensionPlan

        plan = DimensionPlan.load(out / "dims" / "plan.json")

        def plot() -> Figure:
            fig = plan.plot()
            if _real(result.get("uniform_dim")) is not None:
                fig.axes[0].axhline(result["uniform_dim"], color="0.4", linestyle="--", linewidth=0.8,
                                    label=f"uniform dim {result['uniform_dim']}")
                fig.axes[0].legend(fontsize=8)
            return fig

        parts.append(_img(plot, "per-feature embedding dims"))
    if result.get("dims"):
        parts.append(_table(["feature", "dim"], list(result["dims"].items())))
    return "\n".join(parts)


def _tuning(out: Path) -> str | None:
    """Summary line; convergence plot (trials coloured by phase, best so far); best params."""
    result = _load(out / "tuning" / "result.json")
    if result is None:
        return None
    values: list[Any] = result.get("values") or []
    phases: list[Any] = result.get("phases") or []
    points = [(i, float(v), phases[i] if i < len(phases) else None)
              for i, v in enumerate(values) if _real(v) is not None]
    parts = [_p(f"sampler {result.get('sampler', 'n/a')}, {result.get('n_trials', len(values))} trials; best "
                f"validation AUC {_num(result.get('best_value'))} at trial {result.get('best_trial', 'n/a')}; "
                f"best config {_path(result.get('best_config'), out)}")]
    if result.get("chosen"):
        parts.append(_p(f"the config's own hyperparameters reach {_num(result.get('incumbent_val_auc'))} on the same "
                        f"trial budget; the final model uses the {result['chosen']} config"))

    def convergence() -> Figure:
        import matplotlib.pyplot as plt
        import numpy as np

        fig, ax = plt.subplots(figsize=(7, 3.6))
        colors = {"warmup": "tab:orange", "group": "tab:blue", "fallback": "tab:purple"}
        for phase in dict.fromkeys(p for _, _, p in points):
            sub = [(i, v) for i, v, p in points if p == phase]
            ax.scatter([i for i, _ in sub], [v for _, v in sub], s=18, color=colors.get(str(phase), "tab:gray"),
                       label="trial" if phase is None else str(phase), zorder=3)
        ax.step([i for i, _, _ in points], np.maximum.accumulate([v for _, v, _ in points]), where="post",
                color="black", linewidth=1, label="best so far")
        if _real(result.get("incumbent_val_auc")) is not None:
            ax.axhline(result["incumbent_val_auc"], color="tab:red", linestyle="--", linewidth=0.8,
                       label="the config's own hyperparameters")
        ax.set(xlabel="trial number", ylabel="validation AUC")
        ax.set_title("HPO convergence", fontsize=10)
        ax.legend(fontsize=8, loc="lower right")
        fig.tight_layout()
        return fig

    parts.append(_img(convergence, "HPO convergence") if points else _p("no trial finished with a value", "muted"))
    best, schedule = result.get("best_params") or {}, result.get("schedule") or {}
    if best:
        parts.append(_table(["parameter", "best value"], [[k, _num(v, ".4g")] for k, v in best.items()]))
    if schedule:
        parts.append(_table(["schedule", "value"], [[k, json.dumps(v, default=str)] for k, v in schedule.items()]))
    return "\n".join(parts)


def _final(out: Path) -> str | None:
    """Export directory, size, parity, run and config of the final model (the original beside it)."""
    final = _load(out / "final" / "result.json")
    if final is None:
        return None
    orig = _load(out / "original" / "result.json") or {}
    fields: list[tuple[str, str, Callable[[Any], str]]] = [
        ("export directory", "export_dir", lambda v: _path(v, out)), ("export size", "export_bytes", _bytes),
        ("parity max abs diff", "parity_max_abs_diff", lambda v: _num(v, ".3g")),
        ("best validation AUC", "best_val_auc", _num), ("MLflow run", "run_id", str),
        ("config", "config", lambda v: _path(v, out)),
        ("features", "features", lambda v: ", ".join(map(str, v or []))),
    ]
    rows = [[label, *(fmt(s[key]) if key in s else "n/a" for s in (final, orig))] for label, key, fmt in fields]
    parts = [_table(["", "final", "original"], rows)]
    if isinstance(final.get("compressed"), dict):
        parts.append(_compressed(final, out))
    return "\n".join(parts)


def _compressed(final: dict[str, Any], out: Path) -> str:
    """The compression step: the plan's precisions, bytes and AUC against fp32, the frontier."""
    c = final["compressed"]
    counts: dict[str, int] = {}
    for p in (c.get("tables") or {}).values():
        counts[p] = counts.get(p, 0) + 1
    limit = f"validation AUC tolerance {_num(c.get('auc_tolerance'))}" + (f", budget {c['budget']}" if c.get("budget") else "")
    head = (f"Compressed ({limit}): {', '.join(f'{n} x {p}' for p, n in counts.items()) or 'no table'}; "
            f"embedding bytes {_bytes(c.get('embedding_bytes'))} vs fp32 {_bytes(c.get('fp32_embedding_bytes'))} "
            f"({_ratio(c.get('embedding_bytes'), c.get('fp32_embedding_bytes'))}); validation AUC {_num(c.get('val_auc'))} "
            f"vs fp32 {_num(c.get('fp32_val_auc'))} on {c.get('val_rows')} rows; test AUC {_num(c.get('test_auc'))} "
            f"vs fp32 {_num(final.get('test_auc'))} (change {_diff(c.get('test_auc'), final.get('test_auc'))}); "
            f"export {_path(c.get('export_dir'), out)} ({_bytes(c.get('export_bytes'))}).")
    rows = [[p["technique"], _bytes(p["bytes"]), _num(p["val_auc"]), _num(p["test_auc"])] for p in c.get("frontier") or []]

    def frontier() -> Figure:
        from embeddings.compression.precision import plot_frontier

        return plot_frontier(c.get("frontier") or [], c.get("trace") or [])

    return "\n".join([_p(head), _table(["precision", "embedding bytes", "validation AUC", "test AUC"], rows),
                      _img(frontier, "bytes vs AUC")])


SECTIONS: tuple[tuple[str, str, Callable[[Path], str | None]], ...] = (
    ("compare", "Before / after", _compare),
    ("quality", "Data quality", _quality),
    ("screening", "Screening (OutRank)", _screening),
    ("selection", "Selection", _selection),
    ("dims", "Embedding dimensions", _dims),
    ("tuning", "Tuning", _tuning),
    ("final", "Final model", _final),
)


def _section(out: Path, key: str, title: str, render: Callable[[Path], str | None]) -> str:
    try:
        body = render(out)
    except Exception as e:  # a corrupt stage file shows up in the report instead of failing it
        body = _p(f"could not render this stage: {type(e).__name__}: {e}", "warn")
    if body is None:
        return f'<section id="{key}" class="not-run"><h2>{_e(title)}</h2><p class="muted">not run</p></section>'
    return f'<section id="{key}"><h2>{_e(title)}</h2>\n{body}\n</section>'


def write_report(output_dir: str | Path) -> Path:
    """Render the pipeline run folder ``output_dir`` as one self-contained HTML file.

    Args:
        output_dir: the folder a pipeline run writes (any stage folder may be missing).

    Returns:
        The path of ``<output_dir>/report/report.html``, written atomically.
    """
    import matplotlib

    if "matplotlib.pyplot" not in sys.modules:  # headless; switching later would close the caller's figures
        matplotlib.use("Agg")
    out = Path(output_dir)
    name, header = _header(out)
    body = "\n".join([header, *(_section(out, key, title, fn) for key, title, fn in SECTIONS)])
    doc = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_e(name)}: pipeline report'
           f"</title><style>\n{CSS}\n</style></head>\n<body>\n{body}\n</body></html>\n")
    path = out / "report" / "report.html"
    atomic_write_text(path, doc)
    return path

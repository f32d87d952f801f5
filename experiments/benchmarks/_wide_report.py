"""The wide benchmark's verdicts, markdown table and plot (see :mod:`experiments.benchmarks.wide`)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from experiments.benchmarks._common import hardware_text
from recsys.io import atomic_savefig, atomic_write_text

__all__ = ["dims_verdict", "render", "save"]


def dims_verdict(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Dims removed at the k chosen on validation, and whether test AUC is lost there: the chosen
    model minus the all-features model of the same seed on the same test rows, over the seeds
    (:mod:`recsys.stats`: each seed's DeLong interval with the seeds' spread where the curve kept
    them, else a t interval over the seeds; one seed without scores gives no interval, a tie)."""
    from recsys.stats import Interval, mean_interval, over_seeds

    shares, diffs, paired = [], [], []
    for r in runs:
        s = r.get("summary")
        if not s or s.get("smallest_k_within_tolerance") is None:
            continue
        curve = r["curve"]
        k = s["smallest_k_within_tolerance"]
        point = next(p for p in curve["points"] if p["k"] == k)
        shares.append(float(s["dims_removed_share"] or 0.0))
        diffs.append(float(point["test_auc"]) - float(curve["full"]["test_auc"]))
        paired.append(point.get("test_vs_full"))
    if not diffs:
        return {"dims_removed_share": None, "loss": "no k chosen"}
    iv = over_seeds([Interval(**p) for p in paired]) if all(paired) else mean_interval(diffs)
    outcome = iv.verdict()
    return {"dims_removed_share": sum(shares) / len(shares), "dims_removed_shares": shares, "test_auc_change": iv.estimate,
            "test_auc_change_se": iv.se, "test_auc_change_interval": iv.to_dict(), "verdict": outcome,
            "no_loss": outcome != "worse" and math.isfinite(iv.low)}


def interrupted(row: dict[str, Any]) -> bool:
    """A worker stopped by SIGTERM (the session's time ran out): not measured, not a failure."""
    return bool(row.get("interrupted")) or str(row.get("error", "")).startswith("exit -15")


def _status(row: dict[str, Any]) -> str:
    if interrupted(row):
        return "not measured (stopped before it finished)"
    if row.get("error"):
        return "FAILED: " + row["error"].splitlines()[0][:120]
    if row.get("refused"):
        return "refused: " + row["refused"][:160]
    return "completed (the curves part's seed-0 ranking)" if row.get("from_curves") else "completed"


def _met(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "NOT met")


def verdicts(result: dict[str, Any]) -> dict[str, Any]:
    """Each target of issue 37 against the measured numbers (None: not measured in this result)."""
    out: dict[str, Any] = {}
    rank = result.get("rank", {})
    top = rank.get("5000", {})
    if top:
        rows = {m: r for m, r in top.items() if m != "fit"}
        failed = {m: _status(r) for m, r in rows.items() if r.get("error") and not interrupted(r)}
        unmeasured = sorted(m for m, r in rows.items() if interrupted(r))
        registered = [m for m in unmeasured if ":" not in m]  # variants (name:option=value) are extra rows
        out["every_selector_at_5000"] = {"met": None if registered and not failed else not failed, "failed": failed,
                                         "not_measured": unmeasured,
                                         "refused": {m: r["refused"] for m, r in rows.items() if r.get("refused")}}
        leap = rows.get("leap", {})
        if "recall" in leap:
            out["leap_recall_at_5000"] = {"value": leap["recall"], "met": leap["recall"] >= 0.95}
        if leap.get("cost_runs") is not None:
            own = leap["cost_seconds"] / leap["fit_seconds"] if leap.get("fit_seconds") else None
            out["leap_cost_runs_at_5000"] = {"value": leap["cost_runs"], "vs_its_own_fit": own,
                                             "met": leap["cost_runs"] <= 1.5}
    io = result.get("io", {})
    rss = {}
    if io.get("5000"):
        rss.update({k: io["5000"][k]["peak_rss_mb"] for k in ("quality", "outrank")})
    if top:
        rss.update({k: top[k].get("peak_rss_mb") for k in ("fit", "leap") if k in top})
    if rss:
        out["peak_rss_at_5000"] = {"mb": rss, "met": all(v is not None and v < 8 * 1024 for v in rss.values())}
    ratio = io.get("outrank_full_vs_relevance", {}).get("ratio_median")
    if ratio is not None:
        out["outrank_full_vs_relevance_at_1000"] = {"value": ratio, "met": ratio <= 2.0}
    profile = result.get("throughput", {}).get("profile")
    if profile:
        share = profile["per_feature_overhead_share"]
        out["per_feature_overhead_share"] = {"value": share, "features": profile["features"], "met": share <= 0.25}
    curves = result.get("curves", {}).get("methods", {})
    if curves:
        removed = {m: c.get("dims_removed_share") for m, c in curves.items()}
        no_loss = {m: c.get("no_loss") for m, c in curves.items()}
        leap = removed.get("leap")
        gates = [removed[m] for m in curves if m in ("autofield", "adafs", "lpfs", "optfs") and no_loss.get(m) and removed[m]]
        best_gate = max(gates) if gates else None
        others = [removed[m] for m in curves if m != "leap" and no_loss.get(m) and removed[m] is not None]
        out["leap_dims_removed"] = {
            "leap": leap, "leap_no_loss": no_loss.get("leap"), "best_gate_baseline": best_gate,
            "ratio_to_best_gate": (leap / best_gate) if leap and best_gate else None,
            "most_of_all": bool(leap is not None and no_loss.get("leap") and all(leap >= v for v in others)),
            "met": bool(leap and no_loss.get("leap") and (best_gate is None or leap >= 2 * best_gate)
                        and all(leap >= v for v in others)),
        }
    pipe = result.get("pipeline")
    if pipe and "screening_kept_pair" in pipe:
        kept = (pipe.get("selection") or {}).get("kept") or []
        out["pipeline_keeps_the_pair"] = {
            "screening_dropped": pipe.get("screening_dropped"), "selection_kept_pair": all(f in kept for f in pipe["pair"]),
            **({"note": "met trivially: screening dropped nothing"} if pipe.get("screening_dropped") == 0 else {}),
            "met": bool(pipe["screening_kept_pair"])}
    return out


def _rank_table(rank: dict[str, Any]) -> list[str]:
    lines = []
    for width, rows in sorted(rank.items(), key=lambda kv: int(kv[0])):
        fit = rows.get("fit", {})
        lines += [f"### F = {width}", "",
                  f"One plain training run (the cost unit): {fit.get('seconds', float('nan')):.0f} s, test AUC "
                  f"{fit.get('test_auc') or float('nan'):.4f}, peak RSS {fit.get('peak_rss_mb', float('nan')):.0f} MB "
                  "(a row merged from another run keeps its cost in runs of that run's own plain fit)"
                  + (f" ({_status(fit)})" if fit.get("error") else "") + ".", "",
                  "| selector | recall@|signal| | copies demoted | cost (s) | its own fit (s) | cost (training runs) | "
                  "peak RSS (MB) | status |",
                  "|---|---|---|---|---|---|---|---|"]
        for m, r in rows.items():
            if m == "fit":
                continue
            rec = f"{r['recall']:.2f}" if "recall" in r else ""
            runs = f"{r['cost_runs']:.2f}" if r.get("cost_runs") is not None else ""
            cost = (f"{r['cost_seconds']:.0f}" if r.get("cost_seconds") is not None
                    else "" if interrupted(r) else f"{r.get('wall_seconds', 0):.0f}")
            own = f"{r['fit_seconds']:.0f}" if r.get("fit_seconds") is not None else ""
            lines.append(f"| {m} | {rec} | {'yes' if r.get('copies_demoted') else ('no' if 'recall' in r else '')} | {cost} | "
                         f"{own} | {runs} | {r.get('peak_rss_mb', float('nan')):.0f} | {_status(r)} |")
            for fusion, a in (r.get("ablations") or {}).items():
                lines.append(f"| leap[fusion={fusion}] (same fit) | {a['recall']:.2f} | {'yes' if a['copies_demoted'] else 'no'} "
                             f"| | | | | ablation |")
        lines.append("")
    return lines


def render(result: dict[str, Any]) -> dict[str, Any]:
    for method in result.get("curves", {}).get("methods", {}).values():  # the verdict rule may have changed since the run
        method.update(dims_verdict(method.get("runs", [])))
    v = verdicts(result)
    lines = [
        "# Wide benchmark: thousands of heterogeneous, mostly-default features",
        "",
        f"Command: `{result.get('command', '')}`  ",
        *(f"Part {part}: " + "; ".join(f"`{c}`" for c in cmds) + "  " for part, cmds in result.get("commands", {}).items()),
        f"Date: {result.get('date', '')}; hardware: {hardware_text(result['hardware']) if 'hardware' in result else ''}; "
        f"rows: {result.get('rows')} (the wide generator, `recsys.data.synthetic.wide`)." + (" QUICK RUN: not a result." if result.get("quick") else ""),
        "",
        "## Targets",
        "",
        "| target | result | verdict |",
        "|---|---|---|",
    ]
    for name, t in v.items():
        shown = {k: val for k, val in t.items() if k != "met"}
        lines.append(f"| {name} | {json.dumps(shown, default=lambda x: round(x, 4) if isinstance(x, float) else str(x))[:300]} "
                     f"| {_met(t.get('met'))} |")
    if result.get("rank"):
        lines += ["", "## Rankings (seed 0)", "", *_rank_table(result["rank"])]
    io = result.get("io")
    if io:
        lines += ["## Raw files", "", "| F | command | seconds | peak RSS (MB) |", "|---|---|---|---|"]
        for width, rows in io.items():
            if width == "outrank_full_vs_relevance":
                continue
            for cmd, r in rows.items():
                lines.append(f"| {width} | {cmd} | {r['seconds']:.1f} | {r['peak_rss_mb']:.0f} |" + (" failed" if r.get("exit") else ""))
        o = io.get("outrank_full_vs_relevance")
        if o:
            lines += ["", f"OutRank full ranking vs relevance alone ({o['features']}, {o['rows']} rows, alternating runs): "
                          f"median ratio {o['ratio_median']:.2f} (ratios {', '.join(f'{x:.2f}' for x in o['ratios'])}).", ""]
    tp = result.get("throughput")
    if tp:
        lines += ["## Training throughput", "", f"Batch {tp['batch_size']}, the wide DCNv2 (low-rank cross network), "
                  "random batches, kernels interleaved; median samples/s.", "",
                  "| F | tables | dense columns | input dims | train GFLOP/sample | fused | grouped | plain | fused/plain | grouped/plain |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for width, r in tp["per_width"].items():
            grouped = r["median"].get("grouped")
            lines.append(f"| {width} | {r['tables']} | {r['dense_columns']} | {r['input_dims']} | {r['train_flops'] / 1e9:.3f} | "
                         f"{r['median']['fused']:.0f} | {'' if grouped is None else f'{grouped:.0f}'} | {r['median']['plain']:.0f} | "
                         f"{r['fused_vs_plain']:.2f} | {r.get('grouped_vs_plain', float('nan')):.2f} |")
        lines += ["", "fused: FBGEMM's table-batched kernel (one lookup for every table, Adagrad fused into the backward); "
                  "grouped: `model.embedding_kernel: grouped`, the tables of one width stacked into one torch `embedding_bag` "
                  "(one lookup per width), the touched rows' Adagrad in the backward as with fused; plain: torchrec's per-table "
                  "`EmbeddingBagCollection` (one lookup per table), Adam over every row. The dense arch trains with Adam in all three."]
        for key in ("profile", "profile_grouped"):
            p = tp.get(key)
            if p:
                ops = ", ".join(f"{k} {1e3 * s:.1f} ms" for k, s in p["op_seconds"].items())
                note = f" ({p['note']})" if p.get("note") else ""
                lines += ["", f"Profile at F = {p['features']} ({p['backbone']}, {p.get('kernel', 'fused')} kernel): step "
                          f"{1e3 * p['step_seconds']:.1f} ms (op time: {ops}), building the batch {1e3 * p['batching_seconds']:.1f} ms; "
                          f"the dense arch's arithmetic is {p['dense_arith_share']:.0%}, the per-feature overhead "
                          f"{p['per_feature_overhead_share']:.0%}{note}."]
        lines.append("")
    curves = result.get("curves")
    if curves:
        lines += [f"## Selection curves (F = {curves['features']}, ks {curves['ks']}, k chosen on validation)", "",
                  "| selector | recall@|signal| (per seed) | ranking cost (s) | dims removed (share, mean over seeds) | "
                  "test AUC change at the chosen k (95% interval over the seeds) | verdict |",
                  "|---|---|---|---|---|---|"]
        for m, c in curves["methods"].items():
            share, change = c.get("dims_removed_share"), c.get("test_auc_change")
            shown_share = "" if share is None else f"{share:.3f}"
            iv = c.get("test_auc_change_interval") or {}
            ends = f" [{iv['low']:+.4f}, {iv['high']:+.4f}] ({iv['method']})" if iv and iv.get("low") is not None else ""
            shown_change = "" if change is None else f"{change:+.4f}{ends}"
            ranked = [r.get("ranking", {}) for r in c.get("runs", [])]
            recall = ", ".join(f"{r['recall']:.2f}" for r in ranked if "recall" in r)
            cost = ", ".join(f"{r['cost_seconds']:.0f}" for r in ranked if r.get("cost_seconds") is not None)
            lines.append(f"| {m} | {recall} | {cost} | {shown_share} | {shown_change} | {c.get('verdict', c.get('loss', ''))} |")
        lines.append("")
    pipe = result.get("pipeline")
    if pipe:
        lines += ["## Pipeline (F = 1,000)", "", f"Exit {pipe.get('exit')} in {pipe.get('seconds', 0):.0f} s; screening kept "
                  f"{pipe.get('screening_kept')} features, dropped {pipe.get('screening_dropped')}, kept the pair "
                  f"{pipe.get('pair')}: {pipe.get('screening_kept_pair')}.", ""]
        cmp = pipe.get("compare") or {}
        if cmp.get("original") and cmp.get("final"):
            o, f = cmp["original"], cmp["final"]
            kept = (pipe.get("selection") or {}).get("kept") or []
            lines += [f"The final model keeps {f['n_features']} of {o['n_features']} features (the pair "
                      f"{'kept' if all(x in kept for x in pipe['pair']) else 'not kept'} by LeAP's selection at k = "
                      f"{(pipe.get('selection') or {}).get('k')}): test AUC {f['test_auc']:.4f} against the original's "
                      f"{o['test_auc']:.4f} (one run each), exported {f['export_bytes'] / 1e6:.1f} MB against "
                      f"{o['export_bytes'] / 1e6:.1f} MB.", ""]
        if pipe.get("error"):
            lines += ["```", pipe["error"][-800:], "```", ""]
    return {"markdown": "\n".join(lines) + "\n", "verdicts": v}


def portable(value: Any, root: Path) -> Any:
    """``value`` with this machine's paths made relative to ``root`` (the benchmark's data
    folder, the repository): a committed result names no machine's folders."""
    if isinstance(value, dict):
        return {k: portable(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [portable(v, root) for v in value]
    if isinstance(value, str) and value.startswith("/"):
        for base in (root, Path(__file__).resolve().parents[2]):
            if value.startswith(str(base) + "/"):
                return value[len(str(base)) + 1:]
        if value.startswith("/tmp/"):
            return Path(value).name
    return value


def save(result: dict[str, Any], folder: Path, quick: bool, root: Path | None = None) -> None:
    from recsys.io import atomic_write_json

    stem = "wide_quick" if quick else "wide"
    folder.mkdir(parents=True, exist_ok=True)
    if root is not None:
        result = portable(result, root)
    atomic_write_json(folder / f"{stem}.json", result)
    atomic_write_text(folder / f"{stem}.md", render(result)["markdown"])
    _plot(result, folder / f"{stem}.png")


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    tp = result.get("throughput", {}).get("per_width", {})
    if tp:
        widths = sorted(tp, key=int)
        for kernel in [k for k in ("fused", "grouped", "plain") if k in tp[widths[0]]["median"]]:
            axes[0].plot([int(w) for w in widths], [tp[w]["median"][kernel] for w in widths], "-o", label=kernel)
        axes[0].set_xscale("log")
        axes[0].set_xlabel("features F")
        axes[0].set_ylabel("training samples/s")
        axes[0].set_title("throughput against width", fontsize=10)
        axes[0].legend(fontsize=8)
    curves = result.get("curves", {}).get("methods", {})
    for m, c in curves.items():
        run = next((r for r in c.get("runs", []) if r.get("curve")), None)
        if run is None:
            continue
        pts = sorted(run["curve"]["points"], key=lambda p: p["dims"])
        axes[1].plot([p["dims"] for p in pts], [p["test_auc"] for p in pts], "-o", markersize=3, label=m)
        full = run["curve"]["full"]
        axes[1].axhline(full["test_auc"], color="black", linestyle="--", linewidth=0.6)
    if curves:
        axes[1].set_xscale("log")
        axes[1].set_xlabel("input dimensions kept")
        axes[1].set_ylabel("test AUC")
        axes[1].set_title("selection curves in dimensions (seed 0)", fontsize=10)
        axes[1].legend(fontsize=7)
    fig.tight_layout()
    atomic_savefig(fig, path)
    plt.close(fig)

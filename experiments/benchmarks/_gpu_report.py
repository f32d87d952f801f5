"""The markdown table of a :mod:`experiments.benchmarks.gpu_suite` result."""

from __future__ import annotations

from typing import Any

__all__ = ["to_markdown"]


def _n(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:,.3g}"


def _table_rows(result: dict[str, Any]) -> list[str]:
    s = result["sections"]
    rows: list[tuple[str, str, str, str]] = []
    c = s["copy_bandwidth"]
    rows.append(
        (
            "copy",
            "device-to-device copy, GB/s (read + write, median)",
            _n(c["gb_per_s"]["median"]),
            (
                f"{c['buffer_bytes'] / 2**20:,.0f} MiB buffer, {c['repeats']} repeats x {c['copies_per_repeat']} copies, "
                f"{c['timer']}"
            ),
        )
    )
    lk = s["embedding_lookup"]
    shape = (
        f"batch {lk['batch_size']:,} x {lk['fields']} one-hot fields, dim {lk['embedding_dim']}, "
        f"{lk['table_rows']:,} rows, uniform ids"
    )
    for kernel in ("plain", "fused"):
        block = lk[kernel]
        label = f"lookup ({kernel})"
        if "skipped" in block:
            rows.append((label, "skipped", "-", block["skipped"]))
            continue
        fb, fw = block["fwd_bwd"], block["forward"]
        rows.append(
            (
                label,
                "fwd+bwd lookups/s",
                _n(fb["lookups_per_s"]),
                f"{_n(fb['ms_per_step']['median'])} ms/step; {shape}",
            )
        )
        rows.append(
            (
                label,
                "fwd+bwd effective GB/s (rows read + grad rows written)",
                _n(fb["effective_gb_per_s"]),
                f"{fb['ratio_to_copy']:.3g} x copy bandwidth",
            )
        )
        if "gb_per_s_with_dense_grad" in fb:
            rows.append(
                (
                    label,
                    "fwd+bwd GB/s incl. the dense table-sized gradient fill",
                    _n(fb["gb_per_s_with_dense_grad"]),
                    f"{fb['ratio_to_copy_with_dense_grad']:.3g} x copy bandwidth",
                )
            )
        rows.append(
            (
                label,
                "forward-only lookups/s",
                _n(fw["lookups_per_s"]),
                f"{fw['effective_gb_per_s']:.3g} GB/s rows read, {fw['ratio_to_copy']:.3g} x copy",
            )
        )
    tr = s["training"]
    for bs, b in tr["by_batch_size"].items():
        rows.append(
            (
                "train DCNv2",
                f"samples/s at batch {int(bs):,} (median)",
                _n(b["samples_per_s"]["median"]),
                (
                    f"{b['ms_per_step']:.3g} ms/step, {b['repeats']} x {b['steps_per_repeat']} steps after "
                    f"{b['warmup_steps']} warm-up; loss {b['final_loss']:.3f}"
                ),
            )
        )
    h2d = s["h2d"]
    if not h2d["applicable"]:
        rows.append(("H2D", "batch transfer", "n/a", h2d["reason"]))
    else:
        for bs, b in h2d["by_batch_size"].items():
            p, q = b["pinned"], b["pageable"]
            rows.append(
                (
                    "H2D",
                    f"pinned batch {int(bs):,}, ms (median)",
                    f"{p['ms_per_batch']['median']:.3g}",
                    (
                        f"{p['gb_per_s']:.3g} GB/s, {100 * p['share_of_train_step']:.1f}% of a step; "
                        f"pageable {q['ms_per_batch']['median']:.3g} ms"
                    ),
                )
            )
    inf = s["inference"]
    where = inf["device"] + ("" if inf["placement"]["moved_to_device"] or inf["device"] == "cpu" else " (fallback)")
    for bs, b in inf["by_batch_size"].items():
        e = b["exported_ms"]
        rows.append(
            (
                "exported latency",
                f"batch {int(bs):,}: median / p90 ms",
                f"{e['median']:.3g} / {e['p90']:.3g}",
                f"on {where}; eager median {b['eager_ms']['median']:.3g} ms; {e['n']} calls",
            )
        )
    rows.append(
        (
            "exported parity",
            "max abs diff vs eager (probabilities)",
            f"{inf['max_abs_diff']:.2g}",
            f"export-time CPU check {inf['export_parity_cpu']:.2g}",
        )
    )
    for name, secs in result["elapsed_s"].items():
        rows.append(("elapsed", name, f"{secs:.1f} s", ""))
    lines = ["| section | metric | value | notes |", "| --- | --- | ---: | --- |"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return lines


def to_markdown(result: dict[str, Any]) -> str:
    dev, v = result["device"], result["versions"]
    cuda = f"CUDA {dev['torch_cuda']}" if dev.get("torch_cuda") else "CPU build"
    startup = (
        "" if result["startup_seconds"] is None else f", after {result['startup_seconds']:.1f} s of process start-up"
    )
    lines = [
        "# GPU suite: copy bandwidth, embedding lookups, DCNv2 training, exported-model latency",
        "",
        f"Generated {result['date']} by `{result['command']}` ({result['wall_seconds']:.0f} s{startup}).  ",
        (
            f"Device: **{dev['name']}** (`{dev['device']}`); torch {dev['torch']} ({cuda}), torchrec {v['torchrec']}, "
            f"fbgemm_gpu {v['fbgemm_gpu']}; "
            f"FBGEMM CUDA kernels usable: **{'yes' if dev['fbgemm_cuda_available'] else 'no'}**."
        ),
    ]
    if result["size_note"]:
        lines += ["", f"**{result['size_note']}**"]
    lines += [
        "",
        *_table_rows(result),
        "",
        "Byte model of the lookup rows: " + result["sections"]["embedding_lookup"]["byte_model"] + ".",
        "",
        (
            f"The training rows time steps, not learning: each batch size cycles {result['config']['train_pool']} "
            "device-resident batches whose labels are random (25% positive), so a model that takes many steps "
            "memorises them and its final loss falls towards 0."
        ),
    ]
    return "\n".join(lines) + "\n"

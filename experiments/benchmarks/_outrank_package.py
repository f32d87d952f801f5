"""The ``outrank`` package (Outbrain's OutRank, PyPI ``outrank``) beside ours in ``salience bench scale``.

The package goes into a virtualenv of its own (``.cache/outrank/venv``, made by
:func:`ensure_venv` when missing: its dependencies include pre-commit and flake8, which ours
does not need; ``xxhash<4``, since its CLI hashes text that xxhash 4 refuses). Two measurements on the same Criteo-shaped file:

* :func:`run_cli` - its own command line, relevance only (``--task ranking --target_ranking_only
  True --heuristic MI-numba-randomized --subsampling 1``), on a comma-separated copy of the file
  with a header (``csv-raw``, the format it reads raw tables in; the copy is made before the
  clock starts);
* :func:`time_kernels` - the scoring kernels alone, single-threaded, on the same integer codes
  (each batch's own, ``0..K-1``, as both encode a batch):
  the package's ``mutual_info_estimator_numba`` (its score with the per-group shift null) and
  ours (:func:`selection.model_free.mutual_info.outrank_score`, with that null and with our
  default rotation null), over every feature of every 16,384-row batch, after one warm-up call
  each (numba compiles on the first).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["PACKAGE", "VENV", "encode_batches", "ensure_venv", "package_lines", "package_rows", "run_cli", "time_kernels",
           "write_csv"]

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".cache" / "outrank" / "venv"
PACKAGE = "outrank==0.97.5"
#: xxhash 4 refuses str input, which the package's CLI hashes (``TypeError: Strings must be encoded``)
PACKAGE_PINS = ("xxhash<4",)
BATCH = 2**14
#: the kernel-timing script, run by either interpreter (ours, or the package's venv)
_KERNEL_SCRIPT = r"""
import json, sys, time
import numpy as np
codes = np.load(sys.argv[1])
label, names = codes["label"], [k for k in codes.files if k != "label"]
which = sys.argv[2]
if which == "package":
    from outrank.algorithms.feature_ranking.ranking_mi_numba import mutual_info_estimator_numba as mi
    def score(x, y):
        return mi(x.astype(np.int32), y.astype(np.int32), np.float32(1.0), True)
else:
    from selection.model_free.mutual_info import outrank_score
    null = which.split(":")[1]
    def score(x, y):
        return outrank_score(x, y, null)
batch = int(sys.argv[3])
n = len(label) // batch * batch
def compact(x):  # a batch's own codes 0..K-1, as both pipelines encode a batch
    return np.unique(x, return_inverse=True)[1].reshape(-1).astype(np.int64)
batches = [(compact(label[lo:lo + batch]), [compact(codes[f][lo:lo + batch]) for f in names])
           for lo in range(0, n, batch)]
score(batches[0][1][0], batches[0][0])
start = time.perf_counter()
for y, xs in batches:
    for x in xs:
        score(x, y)
seconds = time.perf_counter() - start
print(json.dumps({"rows": n, "features": len(names), "seconds": round(seconds, 3), "rows_per_s": round(n / seconds, 1)}))
"""


#: runs its arguments as a command, then prints the largest peak RSS of that command's processes
_RSS_WRAPPER = r"""
import resource, subprocess, sys
code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode
print("PEAK_RSS_KB", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(code)
"""


def ensure_venv(venv: Path = VENV) -> Path:
    """The package venv's python, after creating the venv and installing :data:`PACKAGE`."""
    python = venv / "bin" / "python"
    if python.exists() and subprocess.run([str(python), "-c", "import outrank"], capture_output=True).returncode == 0:
        return python
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([shutil.which("python3") or sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", PACKAGE, *PACKAGE_PINS], check=True)
    if subprocess.run([str(python), "-c", "import outrank"], capture_output=True).returncode != 0:
        raise RuntimeError(f"{venv}: {PACKAGE} was installed but does not import; remove the folder and run again")
    return python


def write_csv(tsv: Path, folder: Path) -> Path:
    """``folder/data.csv``: the Criteo TSV with commas and a header (``label,I1..I13,C1..C26``)."""
    from recsys.data.readers.criteo import COLUMNS
    from recsys.io import atomic_path

    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "data.csv"
    table = bytes.maketrans(b"\t", b",")
    with open(tsv, "rb") as src, atomic_path(out) as tmp, open(tmp, "wb") as dst:
        dst.write((",".join(COLUMNS) + "\n").encode())
        while block := src.read(1 << 24):
            dst.write(block.translate(table))
    return out


def run_cli(csv_folder: Path, out: Path, threads: int, rows: int) -> dict[str, Any]:
    """The package's CLI on ``csv_folder/data.csv``: wall seconds (its imports included), rows/s,
    the peak RSS of its largest process (``RUSAGE_CHILDREN`` of a fresh interpreter that runs only
    the CLI) and the features it ranked."""
    python = ensure_venv()
    shutil.rmtree(out, ignore_errors=True)
    cmd = [str(python), "-m", "outrank", "--task", "ranking", "--data_path", str(csv_folder), "--data_source", "csv-raw",
           "--heuristic", "MI-numba-randomized", "--target_ranking_only", "True", "--subsampling", "1",
           "--minibatch_size", str(BATCH), "--num_threads", str(threads), "--output_folder", str(out),
           "--disable_tqdm", "True", "--label_column", "label"]
    start = time.perf_counter()  # under a fresh interpreter whose only children are the CLI's: their peak RSS
    proc = subprocess.run([sys.executable, "-c", _RSS_WRAPPER, *cmd], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: " + " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])}
    peak_kb = int(proc.stdout.strip().splitlines()[-1].removeprefix("PEAK_RSS_KB "))
    ranked = out / "pairwise_ranks.tsv"  # (feature, label) rows, both ways round
    lines = ranked.read_text().splitlines()[1:] if ranked.exists() else []
    features = len({a for a, b, *_ in (ln.split("\t") for ln in lines) if b.startswith("label-") and not a.startswith("label-")})
    return {"rows": rows, "seconds": round(seconds, 2), "rows_per_s": round(rows / seconds, 1), "threads": threads,
            "features_ranked": features, "peak_rss_mb": round(peak_kb / 1024, 1)}


def encode_batches(tsv: Path, out: Path, max_rows: int | None = None) -> Path:
    """The file's columns as integer codes (``out``, npz: ``label`` and one array per feature;
    a dense value is its own category, as the package's ``csv-raw`` reads it)."""
    import pandas as pd

    from recsys.data.readers.criteo import COLUMNS

    frame = pd.read_csv(tsv, sep="\t", header=None, names=list(COLUMNS), dtype=str, nrows=max_rows,
                        keep_default_na=False)
    codes = {c: np.asarray(pd.factorize(frame[c])[0], dtype=np.int64) for c in COLUMNS}
    np.savez(out, **codes)  # type: ignore[arg-type]
    return out


def time_kernels(codes: Path, package_python: str | None = None, batch: int = BATCH) -> dict[str, Any]:
    """Each kernel over the same codes, single-threaded, in its own process: ``{name: result}``
    (``package_python``: the interpreter with the package; default: :func:`ensure_venv`'s)."""
    env_threads = {"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    runs = {"package (per-group shift null)": (package_python or str(ensure_venv()), "package"),
            "ours (per-group shift null)": (sys.executable, "ours:package"),
            "ours (rotation null, the default)": (sys.executable, "ours:rotation")}
    out: dict[str, Any] = {}
    for name, (python, which) in runs.items():
        proc = subprocess.run([python, "-c", _KERNEL_SCRIPT, str(codes), which, str(batch)], capture_output=True,
                              text=True, cwd=ROOT, env={**os.environ, **env_threads, "PYTHONPATH": str(ROOT)})
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        out[name] = json.loads(lines[-1]) if proc.returncode == 0 and lines else {
            "error": f"exit {proc.returncode}: " + " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])}
    return out


def package_rows(path: Path, work: Path, rows: int) -> dict[str, Any]:
    """The package on the benchmark's file of ``rows`` rows: its CLI (every core) and the kernels
    alone (on at most 1M rows); an install failure is recorded, not raised."""
    try:
        ensure_venv()
    except (OSError, subprocess.CalledProcessError, RuntimeError) as e:
        return {"error": f"{PACKAGE} could not be installed in {VENV}: {e}"}
    csv = write_csv(path, work / "outrank-package")
    out: dict[str, Any] = {"version": PACKAGE,
                           "cli": run_cli(csv.parent, work / "outrank-package-out", os.cpu_count() or 1, rows)}
    csv.unlink()
    codes = encode_batches(path, work / "codes.npz", max_rows=min(rows, 1_000_000))
    out["kernels"] = time_kernels(codes)
    codes.unlink()
    return out


def package_lines(result: dict[str, Any]) -> list[str]:
    """The markdown of the package rows of a ``scale`` result (none without them)."""
    size = next((s for s in result["sizes"] if s.get("package")), None)
    if size is None:
        return []
    package = size["package"]
    if "error" in package:
        return ["", f"The `outrank` package: {package['error']}"]
    lines = ["", f"The `{package['version']}` package beside ours on the same {size['rows']:,}-row file "
             "(relevance only; its CLI reads a comma-separated copy with a header, made before its clock starts, "
             "and runs on every core; wall time includes its imports):", "",
             "| run | wall s | rows/s | peak RSS MB |", "|---|---:|---:|---:|"]
    ours = size["steps"].get("outrank") or {}
    if "rows_per_s" in ours:
        lines.append(f"| ours: `salience rank --method outrank` | {ours['seconds']} | {ours['rows_per_s']:,.0f} | "
                     f"{ours['peak_rss_mb']:,.0f} |")
    cli = package["cli"]
    lines.append(f"| package: `outrank --task ranking` ({cli.get('threads', '?')} threads) | "
                 + (f"- | failed: {cli['error'][:70]} | - |" if "error" in cli else
                    f"{cli['seconds']} | {cli['rows_per_s']:,.0f} | {cli['peak_rss_mb']:,.0f} |"))
    lines += ["", "The scoring kernels alone, one thread, the same integer codes (every feature of every "
              f"{BATCH:,}-row batch):", "", "| kernel | seconds | rows/s |", "|---|---:|---:|"]
    for name, m in package.get("kernels", {}).items():
        lines.append(f"| {name} | - | failed: {m['error'][:70]} |" if "error" in m else
                     f"| {name} | {m['seconds']} | {m['rows_per_s']:,.0f} |")
    return lines

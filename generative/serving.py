"""TorchScript export of a :class:`~generative.model.SIDRecommender`'s ``recommend()``, beam search included.

An export directory holds::

    model.pt       TorchScript: forward(history [B, T] int64) -> (items [B, k] int64, scores [B, k] float32)
    metadata.json  format, k, beam_size, num_items, levels, level_sizes, max_history, rules, parity
    codes.npy      the semantic IDs [num_items + 1, L] (row 0 = -1) the module decodes into
    loader.py      standalone loader (torch + stdlib): load(dir), recommend(histories)

The served call takes a left-padded batch of item-index histories (0 = padding; ids outside
``1..num_items`` are read as padding; only the last ``max_history`` columns are read) and
returns the top-``k`` catalogue items, best first, with their log-likelihoods. The module is
scripted (never traced), so batch size and history length are free at call time. The TorchRec
token embedding is converted to an identical ``nn.Embedding`` (``plain_embedding=True``), so the
served module needs only torch; with ``plain_embedding=False`` the loader imports
``fbgemm_gpu`` first (TorchRec's jagged ops).

    path = export_recommender(model, "exports/sid", k=10)
    served = load_recommender(path)
    items, scores = served(torch.tensor([[0, 0, 17, 4, 230]]))
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Tuple

import numpy as np
import torch
from torch import Tensor, nn

from generative.decoding import ConstrainedBeamSearch
from generative.model import SIDRecommender
from recsys.artifacts import export_header
from recsys.export.serving import eval_mode, model_device
from recsys.io import atomic_dir, read_marked_json

__all__ = [
    "EXPORT_FORMAT",
    "PARITY_ATOL",
    "ExportError",
    "SIDServingModule",
    "check_parity_in_fresh_process",
    "check_recommender_parity",
    "export_recommender",
    "load_recommender",
    "parity_histories",
    "read_metadata",
    "script_module",
    "serving_module",
]

EXPORT_FORMAT = "salience-sid-export/1"
MODEL_FILE, METADATA_FILE, CODES_FILE, LOADER_FILE = "model.pt", "metadata.json", "codes.npy", "loader.py"
# Items must match exactly; scores are float32 sums of L log-probabilities computed by the same
# kernels in the same order, so they agree to rounding (observed <= 1e-6).
PARITY_ATOL = 1e-5


class ExportError(RuntimeError):
    """The exported module does not reproduce eager decoding."""


class SIDServingModule(nn.Module):
    """``history [B, T] -> (items [B, k], scores [B, k])``: beam search with ``k`` and the beam fixed.

    Args:
        search: a :class:`ConstrainedBeamSearch` over a model's transformer and trie.
        k: items returned per row (``1 <= k <= num_items``).
        beam_size: beams per row (``>= k``).
    """

    def __init__(self, search: ConstrainedBeamSearch, k: int, beam_size: int) -> None:
        super().__init__()
        if not 1 <= k <= search.num_items:
            raise ValueError(f"k={k} must be in 1..{search.num_items} (the catalogue size)")
        self.search = search
        self.k = int(k)
        self.beam_size = max(int(beam_size), int(k))

    def forward(self, history: Tensor) -> Tuple[Tensor, Tensor]:
        if history.dim() != 2:
            raise ValueError("history must be [B, T] item indices, got " + str(history.dim()) + " dims")
        if history.is_floating_point():
            raise ValueError("history must hold integer item indices, got a floating-point tensor")
        with torch.no_grad():
            return self.search(history.to(torch.int64), self.k, self.beam_size)


def serving_module(
    model: SIDRecommender, k: int = 10, beam_size: int | None = None, plain_embedding: bool = True
) -> SIDServingModule:
    """An eager, eval-mode CPU copy of ``model``'s decoding behind :class:`SIDServingModule` (script it to serve).

    Args:
        plain_embedding: replace the TorchRec token embedding by an ``nn.Embedding`` with the
            same weights (the served module then needs only torch).
    """
    k, beam = model.resolve_k(k, beam_size)
    tokens = model.transformer.tokens
    memo: dict[int, Any] = {}
    if plain_embedding:
        memo[id(tokens)] = tokens.to_plain()  # the TorchRec collection is never copied
    transformer = copy.deepcopy(model.transformer, memo).cpu().eval()
    trie = copy.deepcopy(model.trie).cpu()
    return SIDServingModule(ConstrainedBeamSearch(transformer, trie), k, beam).eval()


def parity_histories(num_items: int, max_history: int, batch_size: int = 24, seed: int = 0) -> list[Tensor]:
    """Histories that exercise the edge cases: random lengths (left-padded), an all-padding row,
    unknown ids (``num_items + 1``, large, negative), a single item, longer than ``max_history``,
    one row, and an empty batch. Returns a list of ``[B, T]`` int64 batches."""
    gen = torch.Generator().manual_seed(seed)
    width = max_history + 3
    rows = torch.randint(1, num_items + 1, (batch_size, width), generator=gen)
    lengths = torch.randint(0, width + 1, (batch_size,), generator=gen)
    rows[torch.arange(width).unsqueeze(0) < (width - lengths).unsqueeze(1)] = 0  # left padding
    rows[0] = 0  # all padding
    rows[1, -3:] = torch.tensor([num_items + 1, -7, 10**9])  # unknown ids only at the end
    rows[2, :-1] = 0  # a single item
    rows[3, width // 2] = num_items + 5  # an unknown id in the middle
    short = rows[4:8, -max(1, max_history // 2) :]
    return [rows, short, rows[5:6, -max_history:], rows[:0]]


def check_recommender_parity(
    model: SIDRecommender, served: nn.Module, histories: list[Tensor], k: int, beam_size: int | None = None
) -> float:
    """Max |score difference| between ``served(history)`` and ``model.recommend(history, k, beam_size)``.

    Eager decoding runs on a CPU copy when the model is on an accelerator. Raises
    :class:`ExportError` when any item differs or a score differs by more than ``PARITY_ATOL``.
    """
    reference = model if model_device(model).type == "cpu" else copy.deepcopy(model).cpu()
    diff = 0.0
    with eval_mode(reference, served):
        for history in histories:
            items, scores = reference.recommend(history, k, beam_size)
            got_items, got_scores = served(history)
            if got_items.shape != items.shape or not torch.equal(got_items, items):
                same_shape = got_items.shape == items.shape
                rows = (got_items != items).any(1).nonzero().flatten().tolist() if same_shape else []
                raise ExportError(
                    f"exported items differ from eager decoding (batch {tuple(history.shape)}, rows {rows[:5]})"
                )
            if scores.numel():
                diff = max(diff, float((got_scores - scores).abs().max()))
    if not diff <= PARITY_ATOL:
        raise ExportError(f"exported scores differ from eager decoding by {diff:.3g} (> {PARITY_ATOL})")
    return diff


def _metadata(
    model: SIDRecommender, served: SIDServingModule, plain: bool, diff: float, extra: dict[str, Any]
) -> dict[str, Any]:
    t = model.transformer
    return {
        **export_header(EXPORT_FORMAT, model),
        "k": served.k,
        "beam_size": served.beam_size,
        "num_items": model.num_items,
        "num_levels": model.num_levels,
        "level_sizes": list(model.level_sizes),
        "max_history": t.max_history,
        "d_model": t.d_model,
        "trained_embedding": t.embedding_kernel,
        "embedding": "plain" if plain or t.embedding_kernel == "plain" else "torchrec",
        "unknown_items": "history ids outside 1..num_items are read as padding (not counted by the module)",
        "history_rule": "left-padded with 0, most recent item last; only the last max_history columns are read",
        "score_rule": "sum over levels of log p(code | history, previous codes), the model's softmax per level",
        "serving_signature": {
            "forward": "forward(history: Tensor) -> Tuple[Tensor, Tensor]",
            "history": "B x T int64 item indices",
            "output": "items B x k int64 in 1..num_items (distinct per row, best first), scores B x k float32",
        },
        "parity_max_abs_score_diff": diff,
        "metadata": extra,
    }


def script_module(served: SIDServingModule) -> torch.jit.ScriptModule:
    """``torch.jit.script(served)`` without torch's and TorchRec's scripting chatter."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*found in ScriptModule constants.*")
        warnings.filterwarnings("ignore", message=".*dtype-specific subtypes.*")
        return torch.jit.script(served)


def export_recommender(
    model: SIDRecommender,
    out_dir: str | Path,
    k: int = 10,
    beam_size: int | None = None,
    plain_embedding: bool = True,
    metadata: dict[str, Any] | None = None,
    check: bool = True,
) -> Path:
    """Script ``model``'s decoding (``k`` items, ``beam_size`` beams) and write an export directory atomically.

    Checks the scripted module against eager :meth:`SIDRecommender.recommend` on
    :func:`parity_histories` before writing (``ExportError`` on a mismatch). The model's
    training flags and device are left as they were.

    Args:
        model: the trained recommender.
        out_dir: export directory (replaced if it holds a previous export).
        k: items per row, ``1 <= k <= num_items``.
        beam_size: beams per row; default the model's ``beam_size`` (at least ``k``).
        plain_embedding: serve the token table as ``nn.Embedding`` (torch only) instead of TorchRec.
        metadata: JSON-able extras stored under ``metadata`` (run id, metrics, ...).
        check: run the parity check.

    Returns:
        The export directory.
    """
    out_dir = Path(out_dir)
    served = serving_module(model, k, beam_size, plain_embedding)
    scripted = script_module(served)
    diff = float("nan")
    if check:
        histories = parity_histories(model.num_items, model.max_history)
        diff = check_recommender_parity(model, scripted, histories, served.k, served.beam_size)
    plain = plain_embedding or model.transformer.embedding_kernel == "plain"
    info = _metadata(model, served, plain, diff, dict(metadata or {}))
    text = json.dumps(info, indent=1) + "\n"
    with atomic_dir(out_dir, METADATA_FILE) as tmp:
        torch.jit.save(scripted, str(tmp / MODEL_FILE), _extra_files={METADATA_FILE: text})
        (tmp / METADATA_FILE).write_text(text, encoding="utf-8")
        np.save(tmp / CODES_FILE, model.codes.detach().cpu().numpy())
        (tmp / LOADER_FILE).write_text(LOADER_SOURCE, encoding="utf-8")
    return out_dir


def read_metadata(export_dir: str | Path) -> dict[str, Any]:
    """The parsed ``metadata.json`` of an export directory (checks the format marker)."""
    return read_marked_json(export_dir, METADATA_FILE, EXPORT_FORMAT, "a semantic-ID export directory")


def load_recommender(path: str | Path) -> torch.jit.ScriptModule:
    """The exported module (eval mode) from an export directory or its ``model.pt``."""
    path = Path(path)
    export_dir = path if path.is_dir() else path.parent
    if read_metadata(export_dir)["embedding"] == "torchrec":
        import fbgemm_gpu  # noqa: F401  registers the fbgemm:: ops of TorchRec's jagged tensors

    module = torch.jit.load(str(export_dir / MODEL_FILE), map_location="cpu")
    module.eval()
    return module


def check_parity_in_fresh_process(
    export_dir: str | Path, history: Tensor, items: Tensor, scores: Tensor, timeout: float = 300
) -> float:
    """Max |score difference| of the export's own ``loader.py``, run by a fresh ``sys.executable``
    on ``history``, against the expected ``items``/``scores`` (e.g. eager ``recommend``).

    Raises :class:`ExportError` when items differ, ``RuntimeError`` when the loader fails or
    imported salience, TorchRec or (for a plain-embedding export) fbgemm_gpu.
    """
    export_dir = Path(export_dir).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        inputs, outputs = Path(tmp) / "inputs.pt", Path(tmp) / "outputs.pt"
        torch.save({"history": history.cpu()}, inputs)
        cmd = [sys.executable, str(export_dir / LOADER_FILE), str(export_dir)]
        cmd += ["--inputs", str(inputs), "--outputs", str(outputs)]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=timeout, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"loader.py failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        result = torch.load(outputs, weights_only=True)
    if result["modules"]:
        raise RuntimeError(f"the standalone loader imported {result['modules']}")
    if not torch.equal(result["items"], items.cpu()):
        raise ExportError("items from the fresh process differ from the expected items")
    diff = float((result["scores"] - scores.cpu()).abs().max()) if scores.numel() else 0.0
    if not diff <= PARITY_ATOL:
        raise ExportError(f"fresh-process scores differ by {diff:.3g} (> {PARITY_ATOL})")
    return diff


LOADER_SOURCE = '''"""Standalone loader of a Salience semantic-ID recommender export: needs only torch and the stdlib.

    import loader                                     # this file, inside the export folder
    module, meta = loader.load("export_dir")          # TorchScript module + parsed metadata.json
    items, scores = loader.recommend([[12, 7, 99], [5]], "export_dir")   # lists, best first

CLI: ``python loader.py DIR --histories h.json`` (a JSON list of item-index lists, oldest first)
prints {"items": [...], "scores": [...]}; ``--inputs in.pt --outputs out.pt`` runs the module
on a saved {"history": [B, T] int64} tensor. Histories are left-padded with 0; ids outside
1..num_items are read as padding; only the last max_history items are read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent


def load(export_dir: str | Path = HERE) -> tuple[torch.jit.ScriptModule, dict[str, Any]]:
    """The scripted module (eval mode) and the parsed ``metadata.json`` of ``export_dir``."""
    export_dir = Path(export_dir)
    meta = json.loads((export_dir / "metadata.json").read_text(encoding="utf-8"))
    if meta.get("embedding") == "torchrec":
        import fbgemm_gpu  # noqa: F401  (TorchRec's jagged ops; must come before torch.jit.load)
    module = torch.jit.load(str(export_dir / "model.pt"), map_location="cpu")
    module.eval()
    return module, meta


def pad(histories: list[list[int]], max_history: int) -> torch.Tensor:
    """Left-padded ``[B, T]`` int64 batch of the last ``max_history`` items of each history."""
    rows = [list(h)[-max_history:] for h in histories]
    width = max([len(r) for r in rows] + [1])
    return torch.tensor([[0] * (width - len(r)) + r for r in rows], dtype=torch.int64).reshape(len(rows), width)


def recommend(histories: list[list[int]], export_dir: str | Path = HERE) -> tuple[list[list[int]], list[list[float]]]:
    """Top-k items and scores per history."""
    module, meta = load(export_dir)
    items, scores = module(pad(histories, int(meta["max_history"])))
    return items.tolist(), scores.tolist()


def _forbidden() -> list[str]:
    names = ("generative", "recsys", "torchrec")
    return sorted(m for m in sys.modules if m.split(".")[0] in names)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export_dir", nargs="?", default=str(HERE))
    parser.add_argument("--histories", help="JSON file: a list of item-index lists")
    parser.add_argument("--inputs", help="torch file with {'history': [B, T] int64}")
    parser.add_argument("--outputs", help="where --inputs writes {'items', 'scores', 'modules'}")
    args = parser.parse_args(argv)
    if args.inputs:
        module, meta = load(args.export_dir)
        history = torch.load(args.inputs, weights_only=True)["history"]
        items, scores = module(history)
        modules = _forbidden()
        if meta.get("embedding") != "torchrec":
            modules += sorted(m for m in sys.modules if m.split(".")[0] == "fbgemm_gpu")
        torch.save({"items": items, "scores": scores, "modules": modules}, args.outputs)
    else:
        histories = json.loads(Path(args.histories).read_text()) if args.histories else json.load(sys.stdin)
        items, scores = recommend(histories, args.export_dir)
        print(json.dumps({"items": items, "scores": scores}))


if __name__ == "__main__":
    main()
'''

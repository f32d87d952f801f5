"""Executes every tutorial notebook end to end (in a temporary working directory).

A notebook's cell tagged ``parameters`` (papermill's convention) holds its sizes; the suite runs
each notebook with the smaller sizes of :data:`SMOKE`, injected as a cell right after it, so
every cell runs in minutes on 2 cores. The notebooks as shipped use the sizes in their cell.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))

#: per notebook, the code that replaces its parameters for the test run
SMOKE = {
    "02_feature_selection.ipynb": "N_ROWS, EPOCHS = 8_000, 1",
    "03_embedding_dims.ipynb": "N_ROWS, EPOCHS = 8_000, 1",
    "04_generative.ipynb": "EPOCHS, TRAIN_BATCHES = 1, 8",
    "05_gif_hpo.ipynb": "BUDGET, SEEDS, B = 60, (0,), 30",
}


def with_smoke_parameters(nb: nbformat.NotebookNode, code: str) -> nbformat.NotebookNode:
    """``nb`` with ``code`` as a new cell after the one tagged ``parameters`` (which must exist)."""
    tagged = [i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, "the notebook needs exactly one cell tagged 'parameters'"
    nb.cells.insert(tagged[0] + 1, nbformat.v4.new_code_cell(code))
    return nb


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path: Path, tmp_cwd: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    if path.name in SMOKE:
        nb = with_smoke_parameters(nb, SMOKE[path.name])
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_cwd)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors


def test_there_are_notebooks() -> None:
    assert any(p.name == "01_quickstart.ipynb" for p in NOTEBOOKS)
    assert set(SMOKE) <= {p.name for p in NOTEBOOKS}

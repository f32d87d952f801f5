"""``salience pipeline``: one importance-driven path from raw data to a smaller served model.

quality gates -> OutRank screening -> learned selection (LeAP) with the selection curve ->
dimension search (DNIS) on the kept features -> importance-first tuning (GIF) of the reduced
model -> final fit -> export -> parity, next to the original model, with a comparison and a
self-contained HTML report; one MLflow parent run, one nested run per stage, resumable::

    salience pipeline --config experiments/configs/pipeline/frappe.yaml

    from experiments.pipeline import run_pipeline
    results = run_pipeline("experiments/configs/pipeline/synthetic.yaml")
    results["compare"]["delta"]["test_auc"]
"""

from experiments.pipeline.config import PipelineConfig, PipelineConfigError
from experiments.pipeline.runner import Pipeline, PipelineState, run_pipeline
from experiments.pipeline.stages import STAGES, StageError

__all__ = ["STAGES", "Pipeline", "PipelineConfig", "PipelineConfigError", "PipelineState", "StageError", "run_pipeline"]

"""``PipelineConfig`` files through the shared artifact helper (:mod:`recsys.artifacts`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from experiments.pipeline import PipelineConfig, PipelineConfigError

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("path", sorted((ROOT / "experiments" / "configs" / "pipeline").glob("*.yaml")), ids=lambda p: p.name)
def test_committed_configs_load_and_save_as_the_runner_wrote_them(tmp_path: Path, path: Path) -> None:
    config = PipelineConfig.load(path)
    saved = config.save(tmp_path / "config.yaml")
    runner_text = yaml.safe_dump(json.loads(json.dumps(config.to_dict(), default=str)), sort_keys=False)
    assert saved.read_text() == runner_text  # what the runner's config.yaml always held
    assert json.loads(config.save(tmp_path / "config.json").read_text()) == json.loads(json.dumps(config.to_dict()))


def test_load_errors_are_pipeline_config_errors(tmp_path: Path) -> None:
    with pytest.raises(PipelineConfigError, match=r"pipeline config not found: .*absent\.yaml"):
        PipelineConfig.load(tmp_path / "absent.yaml")
    (tmp_path / "bad.yaml").write_text("name: [x\n")
    with pytest.raises(PipelineConfigError, match=r"bad\.yaml: not a pipeline config \(invalid YAML"):
        PipelineConfig.load(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(PipelineConfigError, match=r"list\.yaml: not a pipeline config \(expected a mapping"):
        PipelineConfig.load(tmp_path / "list.yaml")

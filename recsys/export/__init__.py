"""Export: TorchScript serving module, export directory, standalone loader, Predictor, parity.

    result = export_model(model, preprocessor, "exports/dlrm", metadata={"run_id": run_id})
    Predictor.load("exports/dlrm").predict(records)          # in-library, raw records
    # anywhere with only torch + fbgemm_gpu:  python exports/dlrm/loader.py exports/dlrm --records r.json
"""

from __future__ import annotations

from recsys.export.predictor import (
    MissingFeatureError,
    Predictor,
    check_parity,
    check_parity_in_fresh_process,
    preprocessor_from_export,
    run_loader_in_fresh_process,
    save_parity_inputs,
)
from recsys.export.serving import (
    EXPORT_FORMAT,
    ExportError,
    ExportResult,
    ServingModule,
    export_model,
    export_schema,
    kjt_to_lists,
    load_exported,
    model_device,
    read_export_header,
    read_export_schema,
    synthetic_inputs,
    to_plain_kernel,
)

__all__ = [
    "EXPORT_FORMAT",
    "ExportError",
    "ExportResult",
    "MissingFeatureError",
    "Predictor",
    "ServingModule",
    "check_parity",
    "check_parity_in_fresh_process",
    "export_model",
    "export_schema",
    "kjt_to_lists",
    "load_exported",
    "model_device",
    "preprocessor_from_export",
    "read_export_header",
    "read_export_schema",
    "run_loader_in_fresh_process",
    "save_parity_inputs",
    "synthetic_inputs",
    "to_plain_kernel",
]

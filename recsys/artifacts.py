"""Artifact files: one mapping written as JSON or YAML (chosen by the file's suffix), atomically,
and read back with errors that name the file.

Result objects with a file format (``Schema``, ``DimensionPlan``, ``ImportanceReport``,
``PipelineConfig``) go through :func:`write_artifact` and :func:`read_artifact` and only convert
to and from a dict themselves; ``rows_key`` keeps a large table (the semantic-ID codebook's
codes) one row per line. Files that carry a ``format_version`` check it with
:func:`check_format_version`. Export directories head their metadata file with
:func:`export_header`.

Example::

    write_artifact("plan.yaml", plan.to_dict())
    data = read_artifact("plan.yaml", "dimension plan", DimensionPlanError, any_of=("dims", "blocks"))
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from recsys.io import atomic_write_text

__all__ = [
    "ArtifactError",
    "artifact_format",
    "check_format_version",
    "dump_artifact",
    "export_header",
    "plain",
    "read_artifact",
    "write_artifact",
]

#: suffixes read and written as YAML; ``.json`` is JSON; any other suffix takes the default
YAML_SUFFIXES = (".yaml", ".yml")
#: the formats an artifact is written in
ArtifactFormat = Literal["json", "yaml"]


class ArtifactError(ValueError):
    """An artifact file that cannot be read as the kind of artifact asked for."""


def artifact_format(path: str | Path, default: ArtifactFormat = "json") -> ArtifactFormat:
    """``"yaml"`` for ``.yaml``/``.yml``, ``"json"`` for ``.json``, else ``default``."""
    suffix = Path(path).suffix.lower()
    if suffix in YAML_SUFFIXES:
        return "yaml"
    return "json" if suffix == ".json" else default


def plain(obj: Any) -> Any:
    """``obj`` as JSON- and YAML-safe Python values: mappings with string keys, lists for
    tuples and arrays (anything with ``tolist``), NaN/inf as None, paths as strings."""
    if isinstance(obj, Mapping):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):
        return plain(obj.tolist())
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def dump_artifact(data: Mapping[str, Any], fmt: ArtifactFormat, allow_nan: bool = False, rows_key: str | None = None) -> str:
    """The text :func:`write_artifact` writes.

    JSON is indented by 2 and ends with a newline; YAML is ``yaml.safe_dump`` in key order.

    Args:
        data: the mapping (plain values, see :func:`plain`).
        fmt: ``"json"`` or ``"yaml"``.
        allow_nan: JSON only: write NaN/inf as ``NaN``/``Infinity`` instead of refusing them.
        rows_key: JSON only: a last key whose list is written one compact row per line (large
            tables stay diffable and small); ``data`` must hold it.
    """
    if fmt == "yaml":
        import yaml

        return yaml.dump(dict(data), Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False)
    if fmt != "json":
        raise ValueError(f"artifact format must be 'json' or 'yaml', got {fmt!r}")
    if rows_key is None:
        return json.dumps(data, indent=2, allow_nan=allow_nan) + "\n"
    head = {k: v for k, v in data.items() if k != rows_key}
    rows = data[rows_key]
    text = json.dumps(head, indent=2, allow_nan=allow_nan)
    text = text[: text.rstrip().rfind("}")].rstrip()  # reopen the object to append the rows
    body = ",\n".join("    " + json.dumps(r, allow_nan=allow_nan) for r in rows)
    sep = ",\n" if head else "\n"
    return text + f"{sep}  {json.dumps(rows_key)}: [\n" + body + ("\n" if rows else "") + "  ]\n}\n"


def write_artifact(
    path: str | Path,
    data: Mapping[str, Any],
    default_format: ArtifactFormat = "json",
    allow_nan: bool = False,
    rows_key: str | None = None,
) -> Path:
    """Write ``data`` to ``path`` atomically, as YAML or JSON by the suffix (see
    :func:`artifact_format`; :func:`dump_artifact` for the options); returns the path."""
    path = Path(path)
    atomic_write_text(path, dump_artifact(data, artifact_format(path, default_format), allow_nan, rows_key))
    return path


def _article(what: str) -> str:
    return f"an {what}" if what[:1].lower() in "aeiou" else f"a {what}"


def read_artifact(
    path: str | Path,
    what: str,
    error: type[Exception] = ArtifactError,
    default_format: ArtifactFormat = "json",
    required: Iterable[str] = (),
    any_of: Iterable[str] = (),
    marker: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """The mapping stored in ``path`` (YAML or JSON by the suffix), checked to be a ``what``.

    Args:
        path: the file.
        what: the kind of artifact, for the messages (``"dimension plan"``).
        error: the exception raised for a file that is not one (a ``ValueError`` subclass
            taking one message, e.g. ``SchemaError``).
        default_format: the format of a file with neither a JSON nor a YAML suffix.
        required: keys the mapping must all hold.
        any_of: keys of which the mapping must hold at least one.
        marker: ``(key, value)`` the mapping must hold, e.g. ``("format", "salience-codebook")``.

    Raises:
        FileNotFoundError: no such file (``"<what> not found: <path>"``).
        error: not UTF-8 text, invalid JSON/YAML (with the line), not a mapping, or a missing
            key or marker; every message starts with the path.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    fmt = artifact_format(path, default_format)
    not_one = f"{path}: not {_article(what)}"
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{not_one} (not UTF-8 text)") from e
    if fmt == "yaml":
        import yaml

        try:
            loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)  # libyaml's safe loader: a wide schema in ms
            try:
                data = loader.get_single_data()
            finally:
                loader.dispose()
        except yaml.YAMLError as e:  # its message names the line and column
            raise error(f"{not_one} (invalid YAML: {e})") from e
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise error(f"{not_one} (invalid JSON at line {e.lineno}: {e.msg})") from e
    if not isinstance(data, Mapping):
        raise error(f"{not_one} (expected a mapping at the top level, got {type(data).__name__})")
    if marker is not None and data.get(marker[0]) != marker[1]:
        raise error(f"{not_one} (expected {json.dumps(marker[0])}: {marker[1]!r})")
    required, any_of = list(required), list(any_of)
    missing = [k for k in required if k not in data]
    if missing:
        raise error(f"{not_one} (needs {' and '.join(repr(k) for k in required)}; missing {missing})")
    if any_of and not set(any_of) & set(data):
        raise error(f"{not_one} (needs {', '.join(repr(k) for k in any_of[:-1])} or {any_of[-1]!r})")
    return dict(data)


def check_format_version(
    data: Mapping[str, Any],
    supported: int,
    source: str,
    what: str,
    error: type[Exception] = ArtifactError,
    required: bool = False,
    key: str = "format_version",
) -> int:
    """The ``format_version`` of ``data`` (``supported`` when absent and not ``required``).

    Raises:
        error: a version newer than ``supported``, or one that is not an integer >= 1.
    """
    version = data.get(key)
    if version is None and not required:
        return supported
    if isinstance(version, float) and version.is_integer():
        version = int(version)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise error(f"{source}: {what} format version {version!r} is not one this Salience reads (1..{supported})")
    if version > supported:
        raise error(f"{source}: {what} format {version} is newer than this Salience reads ({supported})")
    return version


def export_header(export_format: str, model: object) -> dict[str, Any]:
    """The fields that head every export directory's metadata file, in this order: ``format``
    (the export's marker), ``salience_version``, ``torch_version``, ``created`` (local time,
    ISO 8601 with the UTC offset) and ``model_class``."""
    import torch

    import recsys

    return {
        "format": export_format,
        "salience_version": recsys.__version__,
        "torch_version": torch.__version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model_class": type(model).__name__,
    }

"""Servers bind 127.0.0.1 by default: every server command in the Makefile, README, docs and
notebooks passes a loopback bind (``--host 127.0.0.1``), and a non-loopback bind (a cluster
setup) appears only with a comment right there saying that it exposes the server.

Why explicit: a default can change under us (``mlflow server`` reads ``MLFLOW_HOST``, other tools
default to all interfaces), and an MLflow or Optuna dashboard has no authentication.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: commands that start a network server
SERVER = re.compile(
    r"(?<![\w.-])(mlflow\s+(?:ui|server|models\s+serve|gateway\s+start)|optuna-dashboard|tensorboard"
    r"|jupyter[-\s]+(?:lab|notebook|server)|http\.server|uvicorn|gunicorn|streamlit\s+run|torchserve"
    r"|dask[-\s]+(?:scheduler|worker))\b"
)
#: a bind flag with its address
BIND = re.compile(r"(?:--host|--ip|--bind|--address|--server\.address|\s-[hb])(?:=|\s+)['\"]?([^\s'\"]+)")
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
ALL_INTERFACES = re.compile(
    r"(?<![\d.])0\.0\.0\.0(?![\d.])|(?:--host|--ip|--bind)(?:=|\s+)['\"]?(?:::|\[::\])(?=[\s'\"]|$)"
)
EXPOSES = re.compile(r"\bexpos(?:e|es|ed|ing)\b", re.IGNORECASE)


def _commands(text: str) -> list[tuple[int, str, str]]:
    """(first line, logical command line, the comment lines right above it) of ``text``; lines
    ending with a backslash are joined with the next one."""
    out: list[tuple[int, str, str]] = []
    lines = text.splitlines()
    comments: list[str] = []
    i = 0
    while i < len(lines):
        start, line = i, lines[i]
        while line.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line.rstrip()[:-1] + " " + lines[i]
        stripped = line.strip()
        if stripped.startswith("#") and not stripped.startswith("#!"):
            comments.append(stripped)
        else:
            out.append((start + 1, line, "\n".join(comments)))
            comments = [] if stripped else comments
        i += 1
    return out


def problems(text: str, where: str) -> list[str]:
    """Server commands of ``text`` that do not bind 127.0.0.1 (or say they expose the server)."""
    found = []
    for line, command, above in _commands(text):
        exposed = bool(EXPOSES.search(command) or EXPOSES.search(above))
        if SERVER.search(command):
            binds = [m.group(1) for m in BIND.finditer(command)]
            if not binds:
                found.append(f"{where}:{line}: server command without --host 127.0.0.1: {command.strip()}")
            elif not all(b in LOOPBACK for b in binds) and not exposed:
                found.append(f"{where}:{line}: non-loopback bind {binds} without a comment that it exposes the server")
        if ALL_INTERFACES.search(command) and not exposed:
            found.append(f"{where}:{line}: binds all interfaces without a comment that it exposes the server")
    return found


def _documents() -> list[tuple[str, str]]:
    """(name, text) of the Makefile, the README, every doc and every notebook cell."""
    out = []
    for path in [ROOT / "Makefile", ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        out.append((path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8")))
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for k, cell in enumerate(json.loads(nb.read_text(encoding="utf-8"))["cells"]):
            src = cell["source"]
            text = "".join(src) if isinstance(src, list) else src
            out.append((f"{nb.relative_to(ROOT).as_posix()}[cell {k}]", text))
    return out


def test_checker_flags_what_it_should() -> None:
    bad = [
        "mlflow ui --backend-store-uri sqlite:///mlflow.db",
        "mlflow server --host 0.0.0.0 --port 5000",
        "$(VENV)/bin/mlflow ui --port 5000",
        "optuna-dashboard sqlite:///optuna.db",
        "tensorboard --logdir runs --host 0.0.0.0",
        "jupyter lab --ip=0.0.0.0",
        "python -m http.server 8000",
        "mlflow server --backend-store-uri x \\\n  --host 10.0.0.5",
        "uvicorn app:app --host :: --port 80",
        "app.run(host='0.0.0.0')",
        "dask scheduler --port 8786",  # Dask unpickles what clients send: never on every interface
        "dask-scheduler --host 10.0.0.5",
        "dask worker tcp://10.0.0.5:8786 --nworkers 8",
    ]
    for text in bad:
        assert problems(text, "t"), text
    good = [
        "mlflow ui --backend-store-uri x --host 127.0.0.1 --port 5000",
        "mlflow server --host=127.0.0.1",
        "optuna-dashboard sqlite:///optuna.db --host 127.0.0.1",
        "jupyter lab --ip 127.0.0.1",
        "python -m http.server 8000 --bind 127.0.0.1",
        "# this EXPOSES the server to the cluster network\nmlflow server \\\n  --host 10.0.0.5 --port 5000",
        "mlflow server --host 0.0.0.0  # exposes the server on every interface",
        "`make ui` then serves the MLflow UI on http://127.0.0.1:5000.",
        "an MLflow server with artifact serving",
        "export MLFLOW_TRACKING_URI=http://MLFLOW_HOST:5000",
        "dask scheduler --host 127.0.0.1 --port 8786",
        "# this exposes the scheduler to the private network, TLS only\ndask scheduler --host 10.0.0.5 --protocol tls",
    ]
    for text in good:
        assert problems(text, "t") == [], text


def test_makefile_ui_binds_loopback() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    servers = [c for _, c, _ in _commands(makefile) if SERVER.search(c)]
    assert servers, "the Makefile has no server command (make ui)"
    assert all("--host 127.0.0.1" in c for c in servers)


def test_docs_and_notebooks_bind_loopback_or_say_they_expose() -> None:
    docs = _documents()
    assert any(name == "docs/multi-worker-hpo.md" for name, _ in docs)
    found = [p for name, text in docs for p in problems(text, name)]
    assert not found, "\n".join(found)


def test_no_code_binds_all_interfaces() -> None:
    found = []
    for top in ("recsys", "selection", "embeddings", "generative", "experiments"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
                if ALL_INTERFACES.search(line) and not EXPOSES.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)


def test_a_local_dask_cluster_listens_on_loopback_only() -> None:
    """The Dask engine's own cluster (``data.scheduler: null``): scheduler, workers and dashboard
    on 127.0.0.1; the docs start a shared one only on a private address with TLS."""
    import inspect

    from recsys.data import distributed

    source = inspect.getsource(distributed._connect)
    assert "LocalCluster(" in source and "host=LOOPBACK" in source and 'dashboard_address=f"{LOOPBACK}:' in source
    assert distributed.LOOPBACK == "127.0.0.1"
    doc = (ROOT / "docs" / "multi-node.md").read_text(encoding="utf-8")
    assert "--protocol tls" in doc and "--tls-ca-file" in doc and "REQUIRE_ENCRYPTION=True" in doc

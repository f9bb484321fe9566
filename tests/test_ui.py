"""`emo ui`: MLflow's web UI on the tracking store, or one line saying how to install it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from emo.cli import main as cli_main
from emo.cli import ui


def test_without_the_server_it_says_how_to_add_it_without_moving_mlflow(monkeypatch, capsys):
    """Issue 47: the hint was the `ui` extra, whose unpinned mlflow made pip downgrade mlflow-skinny
    when the registry lacked the full package at its version; the store it wrote was then refused."""
    import importlib.metadata

    monkeypatch.setattr(ui, "server_installed", lambda: False)
    assert cli_main(["ui"]) == 2
    err = capsys.readouterr().err.strip()
    skinny = importlib.metadata.version("mlflow-skinny")
    assert "\n" not in err and f"pip install 'mlflow=={skinny}'" in err and ".[ui]" not in err


def test_it_serves_the_store_emo_run_logs_into(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(ui, "server_installed", lambda: True)
    monkeypatch.setattr(ui, "serve", lambda cmd: calls.append(cmd) or 0)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert cli_main(["ui", "--port", "5055", f"results={tmp_path}"]) == 0
    assert calls == [
        [
            sys.executable,
            "-m",
            "mlflow",
            "ui",
            "--backend-store-uri",
            f"sqlite:///{tmp_path}/mlflow.db",
            "--host",
            "127.0.0.1",
            "--port",
            "5055",
        ]
    ]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking:5000")  # a tracking server wins
    assert cli_main(["ui"]) == 0 and calls[-1][5] == "http://tracking:5000"


def test_stopping_emo_ui_stops_the_server_and_its_workers(tmp_path):
    """`mlflow ui` serves from a child with workers of its own; SIGTERM to emo ui must end them all."""
    pids = tmp_path / "pids"
    server = (
        "import os, subprocess, sys, time; w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{w.pid}}'); time.sleep(60)"
    )
    emo_ui = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import sys; from emo.cli.ui import serve; sys.exit(serve([sys.executable, '-c', {server!r}]))",
        ],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        stderr=subprocess.PIPE,
        text=True,
    )
    for _ in range(200):
        if pids.exists() and len(pids.read_text().split()) == 2:
            break
        time.sleep(0.05)
    started = [int(p) for p in pids.read_text().split()]
    emo_ui.send_signal(signal.SIGTERM)
    assert emo_ui.wait(timeout=30) == 128 + signal.SIGTERM and "emo ui: stopped" in emo_ui.stderr.read()
    for pid in started:
        for _ in range(100):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"process {pid} of the server outlived emo ui")

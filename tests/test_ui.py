"""`emo ui`: MLflow's web UI on the tracking store, or one line saying which extra to install."""
from __future__ import annotations

import sys

from emo import ui
from emo.cli import main as cli_main


def test_without_the_server_it_says_which_extra_to_install(monkeypatch, capsys):
    monkeypatch.setattr(ui, "server_installed", lambda: False)
    assert cli_main(["ui"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "pip install -e '.[ui]'" in err


def test_it_serves_the_store_emo_run_logs_into(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(ui, "server_installed", lambda: True)
    monkeypatch.setattr(ui.subprocess, "call", lambda cmd: calls.append(cmd) or 0)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert cli_main(["ui", "--port", "5055", f"results={tmp_path}"]) == 0
    assert calls == [[sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", f"sqlite:///{tmp_path}/mlflow.db",
                      "--host", "127.0.0.1", "--port", "5055"]]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking:5000")  # a tracking server wins
    assert cli_main(["ui"]) == 0 and calls[-1][5] == "http://tracking:5000"

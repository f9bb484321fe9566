"""Any NVIDIA GPU: the configuration discovered from NVML (fake at the pynvml boundary), `emo
gpu-config`, gpu=nvml, calibration cost/progress, and calibrations exported and imported."""

from __future__ import annotations

import json
import logging
import sys
import zipfile
from pathlib import Path

import pandas as pd
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))
import nvml_fake  # noqa: E402

from emo.cli import main  # noqa: E402
from emo.cli.calibration import export_calibration, import_calibration, read_calibration  # noqa: E402
from emo.device import Measurement, ProfileResult  # noqa: E402
from emo.device.nvml import discover_gpu_config, gpu_key  # noqa: E402


def test_gpu_key_names_models_as_config_keys():
    assert gpu_key("NVIDIA H200") == "h200"
    assert gpu_key("NVIDIA GeForce RTX 4090") == "rtx4090"
    assert gpu_key("NVIDIA A100-SXM4-40GB") == "a100_sxm4_40gb"
    assert gpu_key("NVIDIA L40S") == "l40s"


def test_discovered_config_is_what_nvml_reports():
    cfg = discover_gpu_config(nvml_fake.FakeNVML(2))
    assert cfg["name"] == "a100_sxm4_40gb" and cfg["backend"] == "nvml"
    assert cfg["clocks_mhz"] == sorted(nvml_fake.GRAPHICS[1593]) and cfg["default_mhz"] == 1410
    assert cfg["memory_mhz"] == 1593 and cfg["tdp_w"] == 400.0
    assert cfg["physics"]["driver"] == "580.65.06" and cfg["physics"]["power_limit_min_w"] == 100.0


def test_gpu_config_command_writes_a_file_that_composes(monkeypatch, tmp_path, capsys):
    fake = nvml_fake.install(monkeypatch, gpus=1)
    out = tmp_path / "conf" / "gpu" / "mine.yaml"
    assert main(["gpu-config", "--out", str(out)]) == 2  # into no folder: one line, nothing made
    assert "no folder" in capsys.readouterr().err and not (tmp_path / "conf").exists()
    out.parent.mkdir(parents=True)
    assert main(["gpu-config", "--out", str(out)]) == 0
    assert "gpu=a100_sxm4_40gb" in capsys.readouterr().out
    body = yaml.safe_load(out.read_text())
    assert body["defaults"] == ["gpu_schema", "_self_"] and body["clocks_mhz"][-1] == 1410
    assert not any(c[0] in ("lock", "power") for c in fake.calls)  # reads only
    assert main(["gpu-config", "--out", str(out)]) == 2  # exists: one line, file kept
    assert "exists" in capsys.readouterr().err and yaml.safe_load(out.read_text()) == body
    # it composes against the real schema
    import shutil

    from emo.workflow.plan import ROOT, compose

    conf = tmp_path / "conf2"
    shutil.copytree(ROOT / "conf", conf)
    shutil.copy(out, conf / "gpu" / "mine.yaml")
    cfg = compose(["gpu=mine", "workload=command", "tracking.enabled=false"], config_dir=conf)
    assert cfg["gpu"]["backend"] == "nvml" and cfg["gpu"]["tdp_w"] == 400.0


def test_gpu_nvml_names_the_gpu_from_nvml(monkeypatch):
    from emo.device.nvml import NvmlDevice
    from emo.workflow.plan import compose

    nvml_fake.install(monkeypatch, gpus=2)
    cfg = compose(["gpu=nvml", "workload=command", "tracking.enabled=false"])["gpu"]
    dev = NvmlDevice(cfg)
    assert dev.name == "a100_sxm4_40gb" and dev.driver == "580.65.06"
    assert dev.supported_clocks()[-1] == dev.default_clock() == 1410


class _Dev:
    """A device that answers calibrate's questions (what a real backend reports, nothing else)."""

    name, model, driver = "x100", "NVIDIA X100", "999.1"

    def __init__(self):
        self.t = 0.0

    def time_s(self):
        return self.t

    def supported_clocks(self):
        return [600, 900, 1200, 1500]

    def default_clock(self):
        return 1500

    def profile_range(self, kernels):
        from emo.device import COUNTERS

        return ProfileResult({c: 1.0 for c in COUNTERS}, passes=2, cost_s=0.1)

    def run_microbenchmark(self, name, mhz, min_seconds):
        self.t += min_seconds
        return Measurement(1e-3 * 1500 / mhz, 0.2, mhz)

    def close(self):
        pass


def test_calibrate_states_its_cost_and_reports_progress(caplog):
    from emo.model.bench import calibrate

    with caplog.at_level(logging.INFO, logger="emo"):
        bench, m = calibrate(_Dev, ["a", "b"], 0.3, 2, 2)
    text = caplog.text
    assert "2 benchmarks x 2 clocks x 2 repeats = 8 measurements" in text and "0.0 minutes" in text
    assert "calibrate: 8/8" in text  # the progress log line of the last tenth
    assert m["gpu_model"] == "NVIDIA X100" and m["driver"] == "999.1" and len(bench) == 8


def _stage_folder(tmp_path) -> Path:
    d = tmp_path / "cal"
    d.mkdir()
    pd.DataFrame({"bench": ["a"], "sm_mhz": [1500], "time_s": [1e-3], "energy_j": [0.2]}).to_parquet(
        d / "bench.parquet"
    )
    (d / "calibration.json").write_text(json.dumps({"gpu": "x100", "gpu_model": "NVIDIA X100", "driver": "999.1"}))
    return d


def test_calibration_export_import_round_trip(tmp_path):
    src = _stage_folder(tmp_path)
    m = export_calibration(src, tmp_path / "x100.emocal")
    assert m["gpu_model"] == "NVIDIA X100" and m["driver"] == "999.1" and len(m["id"]) == 16
    dst = tmp_path / "elsewhere"
    got = import_calibration(tmp_path / "x100.emocal", dst, "x100")
    assert got["id"] == m["id"]
    assert (dst / "bench.parquet").read_bytes() == (src / "bench.parquet").read_bytes()
    assert json.loads((dst / "calibration.json").read_text())["imported_from"] == m["id"]
    with pytest.raises(ValueError, match="a calibration of gpu=x100 .* this configuration is gpu=a100"):
        import_calibration(tmp_path / "x100.emocal", tmp_path / "other", "a100")
    assert not (tmp_path / "other" / "bench.parquet").exists()


def test_an_edited_calibration_is_refused(tmp_path):
    src = _stage_folder(tmp_path)
    export_calibration(src, tmp_path / "a.emocal")
    with zipfile.ZipFile(tmp_path / "a.emocal") as z:
        manifest = json.loads(z.read("manifest.json"))
    manifest["driver"] = "1.0"  # claims another driver
    with zipfile.ZipFile(tmp_path / "b.emocal", "w") as z:
        z.writestr("manifest.json", json.dumps(manifest))
        z.writestr("bench.parquet", (src / "bench.parquet").read_bytes())
    with pytest.raises(ValueError, match="does not match its manifest's hash"):
        read_calibration(tmp_path / "b.emocal")
    (tmp_path / "c.emocal").write_text("nope")
    with pytest.raises(ValueError, match="not an EMO calibration"):
        read_calibration(tmp_path / "c.emocal")

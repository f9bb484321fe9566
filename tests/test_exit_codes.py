"""The error tree decides the exit status by type (docs/design.md, "Exit status"): ConfigError and
InputError exit 2, DeviceError 3, anything else 1; through `emo`'s own main, `emo run`'s stage lines
and the stage runner's reports."""

import json

import pytest

from emo import errors
from emo.cli import main
from emo.errors import ConfigError, DeviceError, EmoError, InputError
from emo.workflow import run as pipeline


def test_each_type_carries_its_exit_code_and_keeps_its_builtin():
    assert (ConfigError.exit_code, InputError.exit_code, DeviceError.exit_code) == (2, 2, 3)
    assert issubclass(ConfigError, ValueError) and issubclass(InputError, ValueError)
    assert issubclass(DeviceError, RuntimeError)
    for cls in (ConfigError, InputError, DeviceError):
        assert issubclass(cls, EmoError)


@pytest.mark.parametrize(
    "e, code",
    [
        (ConfigError("k"), 2),
        (InputError("f"), 2),
        (DeviceError("gpu"), 3),
        (ValueError("untyped"), 2),
        (OSError(28, "No space left on device"), 2),
        (RuntimeError("a bug"), 1),
        (KeyboardInterrupt(), 130),
    ],
)
def test_exit_code_is_decided_by_type(e, code):
    assert errors.exit_code(e) == code


def test_the_device_modules_errors_are_device_errors():
    from emo.device.control import GpuAccessError
    from emo.device.zeusd import ZeusdError
    from emo.runtime import ClockRequestFailed

    for cls in (GpuAccessError, ZeusdError, ClockRequestFailed):
        assert issubclass(cls, DeviceError), cls
    assert issubclass(GpuAccessError, ValueError)  # as before the tree, for callers that catch that


def test_a_config_error_exits_2_through_the_cli(tmp_path, capsys):
    assert main(["run", "-n", "budget=1.5", f"results={tmp_path / 'r'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "budget must be in [0, 1)" in err


def test_an_input_error_exits_2_through_the_cli(tmp_path, capsys):
    bad = tmp_path / "t.json"
    bad.write_text("{}")
    assert main(["analyze", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"emo: error: {bad}: ")


def test_a_device_error_exits_3_through_the_cli(monkeypatch, capsys):
    import emo.cli.reset_clocks as rc

    def broken(args):
        raise DeviceError("cannot initialise NVML (NVML_ERROR_DRIVER_NOT_LOADED): no NVIDIA driver or GPU")

    monkeypatch.setattr(rc, "_cmd", broken)
    assert main(["reset-clocks"]) == 3
    err = capsys.readouterr().err
    assert err == "emo: error: cannot initialise NVML (NVML_ERROR_DRIVER_NOT_LOADED): no NVIDIA driver or GPU\n"


def test_an_untyped_failure_is_not_turned_into_one_line(monkeypatch):
    import emo.cli.reset_clocks as rc

    def bug(args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(rc, "_cmd", bug)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["reset-clocks"])


@pytest.mark.parametrize(
    "e, status", [(InputError("t"), 2), (ConfigError("k"), 2), (DeviceError("g"), 3), (ValueError("x"), 1)]
)
def test_a_stage_reports_the_status_of_its_type(e, status, tmp_path, monkeypatch):
    from emo.stages import _failed

    path = tmp_path / "errors.jsonl"
    monkeypatch.setenv(errors.ERRORS_ENV, str(path))
    _failed("optimize", {"hash": "h"}, e, tmp_path / ".tmp", tmp_path / "out", None)
    assert [r["status"] for r in map(json.loads, path.read_text().splitlines())] == [status]


@pytest.mark.parametrize("statuses, code", [([2, 2], 2), ([3], 3), ([3, 3], 3), ([2, 3], 1), ([1, 2], 1)])
def test_emo_run_exits_with_the_status_every_failed_stage_asked_for(statuses, code, monkeypatch, capsys):
    monkeypatch.setattr(errors, "caught", [])
    reports = [{"stage": f"s{i}", "error": "e", "log": None, "status": s} for i, s in enumerate(statuses)]
    pipeline.failure(reports)
    assert pipeline.failed_status[0] == code

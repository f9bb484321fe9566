"""`pynvml` for the processes a test launches (put this folder first on PYTHONPATH): the real
module's errors and constants with tests/nvml_fake.FakeNVML behind them, EMO_FAKE_NVML_GPUS GPUs,
EMO_FAKE_NVML_INIT_ERROR makes nvmlInit fail with that code (no driver),
every call appended to EMO_FAKE_NVML_LOG (one JSON line each) so the test can read what each rank did."""

import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
del sys.modules["pynvml"]
import pynvml as _real  # noqa: E402,F401 - the real one, which nvml_fake builds on

sys.path.insert(0, os.path.dirname(_here))
import nvml_fake  # noqa: E402

sys.modules["pynvml"] = nvml_fake.FakeNVML(
    gpus=int(os.environ.get("EMO_FAKE_NVML_GPUS", "2")),
    log_path=os.environ.get("EMO_FAKE_NVML_LOG"),
    init_error=(int(os.environ["EMO_FAKE_NVML_INIT_ERROR"]) if "EMO_FAKE_NVML_INIT_ERROR" in os.environ else None),
)

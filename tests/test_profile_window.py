"""Profiling sees every kernel of the iteration, whichever thread launches it: the profile run's
window is cudaProfilerStart/Stop (process-wide), opened and closed by the injected hooks at the
iteration markers, with Nsight Compute in kernel replay and --profile-from-start off. Checked end to
end with a fake `ncu` (tests/fake_ncu: it asserts its command line and stands in for the CUDA
context) over a real CPU-torch program whose backward pass runs on another thread, as autograd's
device threads do on a GPU."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import nvml_fake  # noqa: E402

from emo.device import KernelRange  # noqa: E402
from emo.device import nvml as nv  # noqa: E402
from emo.workloads.command import CommandWorkload  # noqa: E402

torch = pytest.importorskip("torch")
FAKE_NCU = Path(__file__).parent / "fake_ncu"

PROGRAM = textwrap.dedent("""
    import sys, threading, torch, fake_cuda
    m = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m.weight.register_hook(lambda g: fake_cuda.launch("wgrad"))  # runs where the backward pass runs
    x = torch.randn(4, 8)
    for i in range(int(sys.argv[1])):
        fake_cuda.launch("fwd")
        loss = m(x).pow(2).mean()
        t = threading.Thread(target=loss.backward, name="autograd-device-0")
        t.start(); t.join()
        fake_cuda.launch("sgd")
        opt.step(); opt.zero_grad()
    print("ran to the end")
""")


def test_the_window_holds_the_kernels_the_backward_thread_launches(monkeypatch, tmp_path):
    (tmp_path / "train.py").write_text(PROGRAM)
    log = tmp_path / "ncu.log"
    monkeypatch.setenv("PATH", f"{FAKE_NCU}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_NCU_LOG", str(log))
    nvml_fake.install(monkeypatch)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    dev = nv.NvmlDevice({"name": "a100"})
    wl = CommandWorkload(command=[sys.executable, str(tmp_path / "train.py"), "100"], wait=2, warmup=1, active=2)
    (res,) = dev.profile_ranges(wl, [KernelRange(0, (0, 1, 2))])
    assert res.counters["sm_active_cycles"] == 1 + 2 + 3 and res.passes == 4
    events = [json.loads(x) for x in log.read_text().splitlines()]
    inside = [(e["name"], e["thread"]) for e in events if e["event"] == "kernel" and e["profiled"]]
    assert inside == [("fwd", "MainThread"), ("wgrad", "autograd-device-0"), ("sgd", "MainThread")]
    assert [e["event"] for e in events if e["event"] != "kernel"] == ["start", "stop"]
    # the window is the iteration after wait + warmup (counted from the arming marker), as the trace's
    kernels = [e for e in events if e["event"] == "kernel"]
    first = next(i for i, e in enumerate(kernels) if e["profiled"])
    assert first == 3 * (1 + wl.wait + wl.warmup)
    assert len(kernels) == 3 * (wl.wait + wl.warmup + 2)  # EMO ended the program right after the window


def test_an_emo_failure_at_a_later_marker_is_one_line_and_exit_3(monkeypatch, capsys):
    """A clock EMO was asked to set that cannot be (a later segment's policy, a strict applier) ends
    the program with EMO's one line, not a traceback from inside the user's optimizer step."""
    from emo import capture
    from emo.device.nvml import GpuAccessError

    class Refused:
        def step(self):
            raise GpuAccessError("GPU 0: lock SM clock at 900 MHz: permission denied")

    monkeypatch.setattr(capture, "_ARMED", True)
    monkeypatch.setattr(capture, "_HOOKS", [Refused()])
    with pytest.raises(SystemExit) as e:
        capture._marker()
    assert e.value.code == 3  # a GpuAccessError is a DeviceError (docs/design.md, "Exit status")
    assert capsys.readouterr().err == "emo: error: GPU 0: lock SM clock at 900 MHz: permission denied\n"

"""An EMO job holding one GPU's clock (run by tests/test_gpu_locks.py).

usage: python lock_job.py LOG GPU SECONDS [STOP]. Its clock owner uses the NVML fake logging to LOG
(nvml_fake.owner_env in the environment, whose lock folder is the node's). It applies a two-step
policy on NVML GPU `GPU` for SECONDS (or until the file STOP exists), printing `ready <owner pid>` once a request landed, writes
["closing", GPU] to LOG, closes, and prints its summary as JSON. A refusal at its start is one line
on stderr and exit status 3 (a DeviceError), as a rank under `emo apply` ends.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nvml_fake  # noqa: E402

log, gpu, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
stop = sys.argv[4] if len(sys.argv) > 4 else None
sys.modules["pynvml"] = nvml_fake.FakeNVML(gpus=2)  # this process only reads; its owner changes clocks

from emo.device import clock_owner  # noqa: E402
from emo.device.control import GpuAccessError  # noqa: E402
from emo.device.nvml_control import nvml_applier  # noqa: E402
from emo.policy import FrequencyPolicy, Step  # noqa: E402

policy = FrequencyPolicy(gpu="a100", steps={0: [Step(0, 1410), Step(5, 900)]}, period_ms=10)
try:
    ap = nvml_applier(policy, devices={0: gpu}, lead_ms=0)
except GpuAccessError as e:
    print(f"emo: error: {e}", file=sys.stderr)
    sys.exit(e.exit_code)  # as emo.capture ends a rank: by its type (errors.exit_code)
said = False
end = time.monotonic() + seconds
while time.monotonic() < end and not (stop and os.path.exists(stop)):
    ap.step()
    if ap.landed and not said:
        print("ready", clock_owner._OWNER.proc.pid, flush=True)
        said = True
    time.sleep(0.01)
with open(log, "a") as f:
    f.write(json.dumps(["closing", gpu]) + "\n")
ap.close()
print(json.dumps(ap.summary()), flush=True)

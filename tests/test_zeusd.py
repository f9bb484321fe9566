"""zeusd as it is today: EMO's relay (emo.device.zeusd, through zeus's own client) against a fake
zeusd that serves zeusd 0.5's real route table (tests/zeusd_fake.py cites the zeus sources: commit
75a8b9398034eb9baf74ca0a830c2c31bcce52cd, zeusd/src/routes/gpu.rs, routes/server.rs, auth.rs, error.rs).

Each failure is one line with its cause and what to do; an incompatible daemon names the version EMO
needs; a stuck daemon is a timeout, not a hang; and the whole path (trainer -> clock owner -> zeusd)
works, is loud when it fails (each case REPEATS times), under strict ends the job with a non-zero
status, and resets every GPU through zeusd when the trainer dies violently (REPEATS runs per death).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from emo.device import nvml as nv
from emo.device import zeusd

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import nvml_fake  # noqa: E402
import zeusd_fake  # noqa: E402

pytest.importorskip("zeus.utils.zeusd")


class _QuietGuard(nv._RestoreGuard):
    def _install(self):
        self._installed = True


@pytest.fixture
def short_dir():
    d = tempfile.mkdtemp(prefix="emoz")  # a unix socket path must stay under 108 bytes
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    monkeypatch.setattr(nv, "_GUARD", _QuietGuard())
    for k in (zeusd.SOCK_ENV, zeusd.HOST_ENV, zeusd.TOKEN_ENV, zeusd.TOKEN_FILE_ENV, "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(k, raising=False)


@pytest.fixture
def daemon(short_dir, monkeypatch):
    servers = []

    def start(**kw) -> zeusd_fake.FakeZeusd:
        z = zeusd_fake.FakeZeusd(short_dir / f"z{len(servers)}.sock", **kw)
        servers.append(z)
        monkeypatch.setenv(zeusd.SOCK_ENV, z.path)
        return z

    yield start
    for z in servers:
        z.close()


def _controller(monkeypatch, **nvml_kw):
    """The controller a user who is not root gets (NVML itself would refuse every change)."""
    fake = nvml_fake.install(monkeypatch, permission=False, **nvml_kw)
    return nv.ClockController.auto(fake)


def test_clock_and_power_requests_follow_zeusd_05_routes(daemon, monkeypatch):
    z = daemon()
    ctl = _controller(monkeypatch)
    assert ctl.via == "zeusd"
    ctl.set_clock(1, 705)
    ctl.reset_clock(1)
    ctl.set_power_limit(0, 300)
    assert z.writes() == [
        (
            "/gpu/set_gpu_locked_clocks",
            {"gpu_ids": "1", "min_clock_mhz": "705", "max_clock_mhz": "705", "block": "true"},
        ),
        ("/gpu/reset_gpu_locked_clocks", {"gpu_ids": "1", "block": "true"}),
        ("/gpu/set_power_limit", {"gpu_ids": "0", "power_limit_mw": "300000", "block": "true"}),
    ]
    assert [c for c in z.nvml.calls if c[0] in ("lock", "reset", "power")] == [  # zeusd's NVML did it
        ("lock", 1, 705, 705),
        ("reset", 1),
        ("power", 0, 300000),
    ]
    assert ("GET", "/discover", {}) in z.requests


@pytest.mark.parametrize("how", ["env", "file"])
def test_token_from_the_environment_or_a_file(daemon, monkeypatch, short_dir, how):
    z = daemon(token="s3cret")
    if how == "env":
        monkeypatch.setenv(zeusd.TOKEN_ENV, "s3cret")
    else:
        (short_dir / "tok").write_text("s3cret\n")
        os.chmod(short_dir / "tok", 0o600)
        monkeypatch.setenv(zeusd.TOKEN_FILE_ENV, str(short_dir / "tok"))
    _controller(monkeypatch).set_clock(0, 900)
    assert z.nvml.locked[0] == (900, 900)


@pytest.mark.parametrize("mode", [0o666, 0o644, 0o640])
def test_a_token_file_others_can_read_is_refused_in_one_line(daemon, monkeypatch, short_dir, mode):
    z = daemon(token="s3cret")
    tok = short_dir / "tok"
    tok.write_text("s3cret\n")
    os.chmod(tok, mode)
    monkeypatch.setenv(zeusd.TOKEN_FILE_ENV, str(tok))
    with pytest.raises(nv.GpuAccessError) as e:
        _controller(monkeypatch).set_clock(0, 900)
    assert e.value.cause == zeusd.PERMISSION and f"{mode:04o}" in str(e.value) and "chmod 600" in str(e.value)
    assert "\n" not in str(e.value) and z.nvml.locked[0] is None


@pytest.mark.parametrize(
    "token, scopes, words",
    [
        (None, ("gpu-read", "gpu-control"), "no token was provided"),
        ("wrong", ("gpu-read", "gpu-control"), "Token rejected"),
        ("s3cret", ("gpu-read",), "lacks required scope 'gpu-control'"),
    ],
)
def test_a_token_zeusd_refuses_is_one_line_that_says_so(daemon, monkeypatch, token, scopes, words):
    daemon(token="s3cret", scopes=scopes)
    if token:
        monkeypatch.setenv(zeusd.TOKEN_ENV, token)
    with pytest.raises(nv.GpuAccessError) as e:
        _controller(monkeypatch)
    assert e.value.cause == zeusd.PERMISSION and words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "nvml_kw, gpu, mhz, cause, words",
    [
        ({"lock_supported": False}, 0, 900, zeusd.NOT_SUPPORTED, "not available on the target device"),
        ({}, 7, 900, zeusd.OUT_OF_RANGE, "GPU index 7 does not exist"),
    ],
)
def test_zeusd_errors_name_their_cause(daemon, monkeypatch, nvml_kw, gpu, mhz, cause, words):
    daemon(nvml=nvml_fake.FakeNVML(gpus=2, **nvml_kw))
    ctl = _controller(monkeypatch)
    with pytest.raises(nv.GpuAccessError) as e:
        ctl.set_clock(gpu, mhz)
    assert e.value.cause == cause and words in str(e.value) and f"GPU {gpu}" in str(e.value)


def test_nvml_permission_refused_behind_zeusd_is_no_permission(daemon, monkeypatch):
    daemon(nvml=nvml_fake.FakeNVML(gpus=2, permission=False))
    with pytest.raises(nv.GpuAccessError) as e:
        _controller(monkeypatch).set_clock(0, 900)
    assert e.value.cause == zeusd.PERMISSION and "does not have permission" in str(e.value)


@pytest.mark.parametrize(
    "version, groups",
    [("0.2", ("gpu-read", "gpu-control")), ("0.4", ("gpu-read", "gpu-control")), ("0.5", ("gpu-read",))],
)
def test_an_incompatible_daemon_is_one_line_naming_the_version_needed(daemon, monkeypatch, version, groups):
    daemon(version=version, groups=groups)
    with pytest.raises(nv.GpuAccessError) as e:
        _controller(monkeypatch)
    msg = str(e.value)
    assert e.value.cause == zeusd.INCOMPATIBLE and "zeusd 0.5" in msg and "\n" not in msg, msg


def test_a_stale_socket_is_unreachable_at_once(short_dir, monkeypatch):
    path = str(short_dir / "stale.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.close()  # the file stays, nobody listens: what a crashed zeusd leaves behind
    monkeypatch.setenv(zeusd.SOCK_ENV, path)
    with pytest.raises(nv.GpuAccessError) as e:
        _controller(monkeypatch)
    assert e.value.cause == zeusd.UNREACHABLE and path in str(e.value) and "start zeusd" in str(e.value)


def test_every_call_has_a_timeout(daemon, monkeypatch):
    daemon(hang=True)
    relay = zeusd.ZeusdRelay.from_env(timeout_s=0.3)
    t0 = time.monotonic()
    with pytest.raises(zeusd.ZeusdError) as e:
        relay.set_gpu_locked_clocks(0, 900, 900)
    assert time.monotonic() - t0 < 3 and e.value.cause == zeusd.UNREACHABLE


def test_a_daemon_that_stops_answering_mid_run_is_unreachable(daemon, monkeypatch):
    z = daemon()
    ctl = _controller(monkeypatch)
    ctl.set_clock(0, 900)
    z.close()
    os.unlink(z.path)
    with pytest.raises(nv.GpuAccessError) as e:
        ctl.set_clock(0, 705)
    assert e.value.cause == zeusd.UNREACHABLE


# --------------------------------------------------------------------------- a training job through zeusd
TRAINER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {here!r})
    import nvml_fake
    sys.modules["pynvml"] = nvml_fake.FakeNVML(gpus=2, permission=False)  # not root: only zeusd may change clocks
    from emo.policy import FrequencyPolicy, Step
    from emo.device.nvml_control import nvml_applier
    steps = [Step(0, 1410), Step(2, 900)]
    ap = nvml_applier(FrequencyPolicy(gpu="a100", steps={{0: steps, 1: steps}}, period_ms=5), lead_ms=0,
                      strict={strict})
    for _ in range({iterations}):
        ap.step()
        time.sleep(0.005)
    ap.close()
    print(ap.summary()["landed"], ap.summary()["failed"], flush=True)
""")


REPEATS = 10  # each case, run at once


def _train(strict: bool, env: dict, n: int = 1, iterations: int = 40) -> list[subprocess.CompletedProcess]:
    """n runs of TRAINER at once."""
    cmd = [sys.executable, "-c", TRAINER.format(here=str(HERE), strict=strict, iterations=iterations)]
    short = tempfile.mkdtemp(prefix="emo-locks-")
    ps = [
        subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # each run a node of its own: its own GPU lock records (one node would refuse the others)
            env={**os.environ, "CUDA_VISIBLE_DEVICES": "", **env, "EMO_GPU_LOCK_DIR": tempfile.mkdtemp(dir=short)},
        )
        for _ in range(n)
    ]
    out = []
    for p in ps:
        o, e = p.communicate(timeout=120)
        out.append(subprocess.CompletedProcess(cmd, p.returncode, o, e))
    return out


def test_a_job_sets_its_clocks_through_zeusd_and_they_come_back(daemon):
    z = daemon()
    (r,) = _train(True, {zeusd.SOCK_ENV: z.path, **nvml_fake.owner_env(None, gpus=2, permission=False)})
    assert r.returncode == 0, r.stderr
    landed, failed = map(int, r.stdout.split())
    assert landed > 0 and failed == 0
    last = {}
    for p, q in z.writes():
        last[q["gpu_ids"]] = p
    assert last == {"0": "/gpu/reset_gpu_locked_clocks", "1": "/gpu/reset_gpu_locked_clocks"}
    assert re.search(rf"{landed} landed( \(\d+ late: after the next request was due\))?, 0 failed", r.stderr), r.stderr


def test_a_daemon_slower_than_the_schedule_is_counted_late_not_called_applied(daemon):
    """Issue 48 item 6: zeusd taking 50 ms per change under a 5 ms schedule, for 1 s: the requests
    land, but after the next was due; the summary says how many, and those the early markers cut off."""
    z = daemon(slow_s=0.05)
    env = {zeusd.SOCK_ENV: z.path, **nvml_fake.owner_env(None, gpus=2, permission=False)}
    (r,) = _train(False, env, iterations=200)
    assert r.returncode == 0, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    m = re.search(r"(\d+) landed \((\d+) late: after the next request was due\), 0 failed, (\d+) skipped", line)
    assert m and int(m[2]) >= 3 and int(m[3]) >= 3, line


def _stale(short_dir) -> str:
    path = str(short_dir / "stale.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.close()
    return path


@pytest.mark.parametrize("case", ["stale socket", "old zeusd", "no root, no zeusd"])
def test_silent_failures_are_one_line_and_strict_exits_non_zero(daemon, short_dir, case):
    if case == "stale socket":
        env, words = {zeusd.SOCK_ENV: _stale(short_dir)}, "unreachable"
    elif case == "old zeusd":
        env, words = {zeusd.SOCK_ENV: daemon(version="0.2").path}, "zeusd 0.5"
    else:
        env, words = {}, "permission denied"
    env.update(nvml_fake.owner_env(None, gpus=2, permission=False))  # the owner is not root either
    for r in _train(False, env, REPEATS):  # not strict: the job runs on, but says so once, and what landed
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("emo: ")]
        assert r.returncode == 0 and len(lines) == 2, r.stderr
        assert words in lines[0] and ("GPU 0" in lines[0] or "GPU 1" in lines[0]), lines
        assert lines[1].startswith("emo: clock requests: 0 landed") and "saved nothing" in lines[1]
    for r in _train(True, env, REPEATS):
        assert r.returncode != 0 and words in r.stderr, r.stderr


# --------------------------------------------------------------------------- deaths, through zeusd
ZEUSD_DEATHS = ["SIGKILL", "TERM+KILL 2 s grace, main thread blocked in C", "os.abort"]  # graceful ends: above


@pytest.mark.parametrize("death", ZEUSD_DEATHS)
def test_a_dying_trainer_s_gpus_are_reset_through_zeusd(tmp_path, short_dir, death):
    """The owner relays to zeusd (its own NVML would refuse): when the trainer dies, zeusd's NVML sees
    a reset last for every GPU touched, within the bound, in each of REPEATS runs."""
    import test_clock_owner as deaths

    mode, action, status = deaths.DEATHS[death]
    daemons = [
        zeusd_fake.FakeZeusd(
            short_dir / f"d{i}.sock",
            nvml=nvml_fake.FakeNVML(gpus=2, log_path=str(tmp_path / f"{mode}-{i}.jsonl"), stamp=True),
        )
        for i in range(deaths.REPEATS)
    ]
    try:
        runs = deaths._run_all(
            tmp_path,
            mode,
            action,
            env=lambda i: {zeusd.SOCK_ENV: daemons[i].path, **nvml_fake.owner_env(None, gpus=2, permission=False)},
        )
    finally:
        for z in daemons:
            z.close()
    for i, r in enumerate(runs):
        assert r.p.returncode == status, (i, r.p.returncode)
        last = deaths._last_clock_calls(nvml_fake.read_log(r.log))
        assert last == {0: "reset", 1: "reset"}, f"run {i}: {last}"
        assert r.reset_s <= deaths.RESET_BOUND_S
        assert daemons[i].writes()[-1][0] == "/gpu/reset_gpu_locked_clocks"
    print(f"\n{death} (zeusd): slowest reset {1000 * max(r.reset_s for r in runs):.0f} ms after the death")

"""The clock-request latency: measured through the device protocol (NVML through tests/nvml_fake.py),
stored by calibrate, and planned with by optimize (issue 11 item 2)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from emo.config import OptimizerConfig, typed
from emo.device import nvml as nv

sys.path.insert(0, str(Path(__file__).parent))
import nvml_fake  # noqa: E402


class VirtualTime:
    """perf_counter and sleep on one virtual clock, shared with the fake NVML's landing clock."""

    def __init__(self):
        self.t = 100.0

    def perf_counter(self):
        return self.t

    def sleep(self, s):
        assert s >= 0
        self.t += s

    def time(self):
        return self.t


@pytest.fixture
def nvml_device(monkeypatch):
    class Quiet(nv._RestoreGuard):
        def _install(self):
            self._installed = True

    monkeypatch.setattr(nv, "_GUARD", Quiet())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("ZEUSD_SOCK_PATH", raising=False)
    monkeypatch.setattr(nv.os, "geteuid", lambda: 0)
    vt = VirtualTime()
    monkeypatch.setattr(nv, "time", vt)

    def make(delay):
        fake = nvml_fake.install(monkeypatch, clock_delay_ms=delay, now=vt.perf_counter)
        return fake, nv.NvmlDevice({"name": "a100", "backend": "nvml"})

    return make


def test_nvml_times_each_step_until_the_clock_reads_it(nvml_device):
    # up-steps land in 7.3 ms, down-steps in 21.6 ms: each is resolved to the next 1 ms read
    fake, dev = nvml_device(lambda a, b: 7.3 if b > a else 21.6)
    got = dev.clock_step_latencies_ms([(705, 1410), (1410, 210), (900, 1395)], poll_ms=1.0)
    assert got == pytest.approx([8.0, 22.0, 8.0])
    locks = [c[2] for c in fake.calls if c[0] == "lock"]
    assert locks == [705, 1410, 1410, 210, 900, 1395]  # from, then to, for every pair
    assert fake.locked[0] == (1395, 1395) and fake.sm_clock[0] == 1395
    dev.close()
    assert fake.locked[0] is None  # close restores


def test_nvml_poll_period_sets_the_resolution(nvml_device):
    _, dev = nvml_device(7.3)
    assert dev.clock_step_latencies_ms([(705, 1410)], poll_ms=5.0) == pytest.approx([10.0])
    assert dev.clock_step_latencies_ms([(705, 1410)], poll_ms=0.5) == pytest.approx([7.5])


def test_nvml_clock_that_never_lands_is_one_clear_error(nvml_device):
    _, dev = nvml_device(1e9)
    with pytest.raises(nv.GpuAccessError, match=r"did not reach 705 MHz within \d+ reads"):
        dev.clock_step_latencies_ms([(705, 1410)], poll_ms=1.0)


def test_nvml_rejects_unsupported_clock_and_bad_poll(nvml_device):
    _, dev = nvml_device(1.0)
    with pytest.raises(nv.GpuAccessError, match="1000 MHz is not a supported SM clock"):
        dev.clock_step_latencies_ms([(1000, 1410)], poll_ms=1.0)
    with pytest.raises(ValueError, match="poll_ms"):
        dev.clock_step_latencies_ms([(705, 1410)], poll_ms=0)


# --------------------------------------------------------------------------- calibrate
from emo.model import bench as cal  # noqa: E402
from emo.model.calibration import latency_summary  # noqa: E402
from emo.stages import optimize as opt_stage  # noqa: E402
from emo.stages import run_in_place  # noqa: E402
from emo.workflow.plan import compose, plan  # noqa: E402

CLOCKS = [705, 1005, 1410]


class LatencyDevice:
    """A device whose clock requests land after `up_ms` (clock going up) or `down_ms` (going down),
    seen by a poller every poll_ms: the protocol method as a GPU answers it, and nothing else."""

    name = "a100"

    def __init__(self, up_ms: float, down_ms: float):
        self.up_ms, self.down_ms, self.asked, self.closed = up_ms, down_ms, [], False

    def supported_clocks(self):
        return list(CLOCKS)

    def default_clock(self):
        return CLOCKS[-1]

    def clock_step_latencies_ms(self, pairs, poll_ms):
        import math

        self.asked.append((list(pairs), poll_ms))
        return [math.ceil((self.up_ms if b > a else self.down_ms) / poll_ms) * poll_ms for a, b in pairs]

    def close(self):
        self.closed = True


def test_clock_steps_go_up_and_down_in_several_sizes():
    clocks = list(range(210, 1411, 15))
    pairs = cal.clock_steps(clocks, 1410, 48)
    assert len(pairs) == 48 and all(a != b and a in clocks and b in clocks for a, b in pairs)
    ups = sum(b > a for a, b in pairs)
    assert ups == 24  # half up, half down
    sizes = {abs(clocks.index(a) - clocks.index(b)) for a, b in pairs}
    assert {1, 2, 4, 8, 16, 32, 64, 80} <= sizes  # one clock step up to the whole range
    assert len({min(a, b) for a, b in pairs}) > 8  # at several places in the range
    assert cal.clock_steps(clocks, 1410, 48) == pairs  # deterministic
    assert all(b <= 900 for _, b in cal.clock_steps(clocks, 900, 10))  # never above the default
    with pytest.raises(ValueError, match=">= 2 supported clocks"):
        cal.clock_steps([1410], 1410, 4)


def test_latency_summary_quantiles_and_samples():
    pairs = [(705, 1410)] * 10
    s = latency_summary([float(x) for x in range(1, 11)], pairs, 1.0)
    assert (s["p10"], s["p50"], s["p90"], s["mean"], s["n"]) == (1.9, 5.5, 9.1, 5.5, 10)
    assert s["p99"] == pytest.approx(9.91) and s["samples"][0] == 1.0 and s["pairs"][0] == [705, 1410]
    with pytest.raises(ValueError, match="2 samples for 10"):
        latency_summary([1.0, 2.0], pairs, 1.0)


def _fake_calibrate(monkeypatch, dev):
    """The calibrate stage with its benchmark sweep cut to one row: what it stores about latency."""
    import pandas as pd

    bench = pd.DataFrame({"bench": ["idle"], "sm_mhz": [1410], "repeat": [0], "time_s": [1.0], "energy_j": [1.0]})
    monkeypatch.setattr(
        cal, "calibrate", lambda *a: (bench, {"benchmarks": 1, "gpu": "a100", "gpu_model": "fake", "driver": "x"})
    )
    monkeypatch.setattr("emo.device.backends.open_device", lambda gpu: dev)


def test_calibrate_stores_the_measured_distribution(monkeypatch, tmp_path, caplog):
    import json
    import logging

    dev = LatencyDevice(up_ms=7.2, down_ms=23.9)
    _fake_calibrate(monkeypatch, dev)
    cfg = compose(["model.clock_latency_steps=40", "model.clock_poll_ms=0.5"])
    with caplog.at_level(logging.INFO, logger="emo"):
        metrics = run_in_place("calibrate", cfg, {}, tmp_path)
    ((pairs, poll),) = dev.asked
    assert len(pairs) == 40 and poll == 0.5 and dev.closed
    lat = json.loads((tmp_path / "calibration.json").read_text())["clock_latency_ms"]
    assert lat["n"] == 40 and lat["pairs"] == [list(p) for p in pairs]
    assert sorted(set(lat["samples"])) == [7.5, 24.0]  # up and down, on the 0.5 ms read grid
    assert lat["p10"] == 7.5 and lat["p90"] == 24.0 and lat["mean"] == pytest.approx(15.75)
    assert metrics["clock_latency_p50_ms"] == lat["p50"]
    assert any("clock-request latency over 40 steps" in r.message for r in caplog.records)


def test_a_device_that_cannot_time_clocks_stores_none_and_says_so(monkeypatch, tmp_path, caplog):
    import json
    import logging

    class Mute(LatencyDevice):
        clock_step_latencies_ms = None

    _fake_calibrate(monkeypatch, Mute(1, 1))
    with caplog.at_level(logging.WARNING, logger="emo"):
        run_in_place("calibrate", compose([]), {}, tmp_path)
    assert json.loads((tmp_path / "calibration.json").read_text())["clock_latency_ms"] is None
    assert [r.message for r in caplog.records if "cannot time clock requests" in r.message]


# --------------------------------------------------------------------------- optimize
def _tables():
    from test_optimize_verify import _tables as small

    return small()


def _calibration(tmp_path, monkeypatch, up_ms, down_ms, name):
    _fake_calibrate(monkeypatch, LatencyDevice(up_ms, down_ms))
    out = tmp_path / name
    run_in_place("calibrate", compose([]), {}, out)
    return out / "calibration.json"


def _optimize(tmp_path, monkeypatch, calibration, overrides=(), name="opt"):
    import json

    monkeypatch.setattr("emo.model.predict.load_pack_tables", lambda *a: _tables())
    cfg = compose(["optimizer.change_points=grid", "budget=0", *overrides])
    inputs = {"packs": tmp_path / "packs.parquet", "model": tmp_path / "model.parquet"}
    if calibration is not None:
        inputs["calibration"] = calibration
    run_in_place("optimize", cfg, inputs, tmp_path / name)
    return (
        json.loads((tmp_path / name / "summary.json").read_text())["emo"],
        json.loads((tmp_path / name / "policy.json").read_text()),
    )


def test_optimizer_plans_with_the_calibrated_latency(tmp_path, monkeypatch):
    fast = _calibration(tmp_path, monkeypatch, 2.0, 4.0, "fast")
    slow = _calibration(tmp_path, monkeypatch, 20.0, 40.0, "slow")
    s_fast, p_fast = _optimize(tmp_path, monkeypatch, fast, name="o_fast")
    s_slow, p_slow = _optimize(tmp_path, monkeypatch, slow, name="o_slow")
    # raises plan with the steps up (2 / 20 ms), lowerings with the steps down (4 / 40 ms)
    assert s_fast["transition_ms"] == [2.0, 2.0, 2.0] and s_slow["transition_ms"] == [20.0, 20.0, 20.0]
    assert s_fast["transition_source"].startswith(
        "measured p10-p90 of 400 clock steps, raises on the steps up, lowerings on the steps down, expectation over"
    )
    # the applier issues each step the planned max ahead: the measurement moves the policy
    assert p_fast["meta"]["transition_ms"] == [2.0, 2.0] and p_slow["meta"]["transition_ms"] == [20.0, 20.0]
    assert p_fast["lead_ms"] == 2.0 and p_slow["lead_ms"] == 20.0


def test_override_wins_over_the_measurement(tmp_path, monkeypatch):
    fast = _calibration(tmp_path, monkeypatch, 2.0, 4.0, "fast")
    s, p = _optimize(tmp_path, monkeypatch, fast, ["optimizer.transition_ms=[6,18]"])
    assert s["transition_ms"] == [6.0, 12.0, 18.0] and s["transition_source"] == "optimizer.transition_ms"
    assert p["lead_ms"] == 18.0
    s, _ = _optimize(tmp_path, monkeypatch, fast, ["optimizer.transition_percentiles=[0,100]"], name="o2")
    assert s["transition_ms"] == [2.0, 2.0, 2.0]  # every step up takes 2 ms: the percentiles are of those samples


def test_no_measurement_and_no_override_is_one_line_naming_what_to_run(tmp_path, monkeypatch):
    import json

    old = tmp_path / "old" / "calibration.json"
    old.parent.mkdir()
    old.write_text(json.dumps({"gpu": "a100", "gpu_model": "NVIDIA A100", "driver": "x"}))  # before EMO measured it
    for cal_file in (old, None):
        with pytest.raises(ValueError) as e:
            _optimize(tmp_path, monkeypatch, cal_file)
        msg = str(e.value)
        assert "\n" not in msg and "no clock-request latency measurement" in msg
        assert "re-run the calibrate stage" in msg and "optimizer.transition_ms=[min,max]" in msg
        assert msg.startswith(f"{cal_file}: " if cal_file else "calibration: ")  # names the file it read
    assert not (tmp_path / "opt").exists() or not list((tmp_path / "opt").iterdir())  # nothing written
    s, _ = _optimize(tmp_path, monkeypatch, old, ["optimizer.transition_ms=[5,15]"], name="o3")
    assert s["transition_source"] == "optimizer.transition_ms"


@pytest.mark.parametrize(
    "override,key",
    [
        ("optimizer.transition_ms=[15,5]", "optimizer.transition_ms"),
        ("optimizer.transition_ms=[-1,5]", "optimizer.transition_ms"),
        ("optimizer.transition_ms=oops", "optimizer.transition_ms"),
        ("optimizer.transition_percentiles=[50,120]", "optimizer.transition_percentiles"),
        ("model.clock_latency_steps=0", "model.clock_latency_steps"),
        ("model.clock_poll_ms=0", "model.clock_poll_ms"),
    ],
)
def test_bad_latency_setting_is_one_line_naming_the_key(override, key):
    with pytest.raises(ValueError) as e:
        compose([override])
    assert key in str(e.value) and "\n" not in str(e.value)


def test_optimize_folder_follows_the_calibration():
    base = plan(compose([]))
    assert base["optimize"].covers["inputs"]["calibrate"] == base["calibrate"].hash
    more = plan(compose(["model.clock_latency_steps=60"]))  # a different latency measurement
    assert more["calibrate"].hash != base["calibrate"].hash
    assert more["optimize"].hash != base["optimize"].hash and more["validate"].hash != base["validate"].hash
    assert all(more[s].hash == base[s].hash for s in ("trace", "graph", "pack"))
    over = plan(compose(["optimizer.transition_ms=[5,15]"]))
    assert over["optimize"].hash != base["optimize"].hash and over["calibrate"].hash == base["calibrate"].hash


# --------------------------------------------------------------------------- emo calibration
def _cal_folder(tmp_path, lat):
    import json

    import pandas as pd

    d = tmp_path / "cal"
    d.mkdir()
    pd.DataFrame({"bench": ["a"], "sm_mhz": [1410], "time_s": [1e-3], "energy_j": [0.2]}).to_parquet(
        d / "bench.parquet"
    )
    (d / "calibration.json").write_text(
        json.dumps(
            {
                "gpu": "a100",
                "gpu_model": "NVIDIA A100",
                "driver": "1",
                "clocks_mhz": [705, 1410],
                "benchmarks": 1,
                "clock_latency_ms": lat,
            }
        )
    )
    return d


def test_exported_calibration_carries_the_latency_and_its_hash_covers_it(tmp_path):
    import json
    import zipfile

    from emo.cli.calibration import describe, export_calibration, import_calibration, read_calibration

    lat = latency_summary([5.0, 7.0, 30.0], [(705, 1410), (1410, 705), (705, 1410)], 0.5)
    m = export_calibration(_cal_folder(tmp_path, lat), tmp_path / "a.emocal")
    got = import_calibration(tmp_path / "a.emocal", tmp_path / "dst", "a100")
    assert (
        json.loads((tmp_path / "dst/calibration.json").read_text())["clock_latency_ms"]
        == lat
        == got["clock_latency_ms"]
    )
    assert "clock-request latency over 3 steps" in describe(got) and "p99 29.5" in describe(got)
    with zipfile.ZipFile(tmp_path / "a.emocal") as z:
        manifest, data = json.loads(z.read("manifest.json")), z.read("bench.parquet")
    manifest["clock_latency_ms"]["p90"] = 1.0  # a faster GPU than measured
    with zipfile.ZipFile(tmp_path / "b.emocal", "w") as z:
        z.writestr("manifest.json", json.dumps(manifest))
        z.writestr("bench.parquet", data)
    with pytest.raises(ValueError, match="does not match its manifest's hash"):
        read_calibration(tmp_path / "b.emocal")
    (tmp_path / "x").mkdir()
    unmeasured = export_calibration(_cal_folder(tmp_path / "x", None), tmp_path / "c.emocal")
    assert unmeasured["id"] != m["id"]  # the same benchmarks without the latency: another calibration


def test_calibration_show_prints_the_latency(tmp_path, capsys):
    import json

    from emo.cli import main
    from emo.cli.calibration import describe

    lat = latency_summary([5.0, 7.0, 30.0], [(705, 1410), (1410, 705), (705, 1410)], 0.5)
    folder = plan(compose([f"results={tmp_path}"]))["calibrate"].dir
    folder.mkdir(parents=True)
    (folder / "calibration.json").write_text(
        json.dumps(
            {
                "gpu": "a100",
                "gpu_model": "NVIDIA A100",
                "driver": "1",
                "clocks_mhz": [705, 1410],
                "benchmarks": 1,
                "clock_latency_ms": lat,
            }
        )
    )
    assert main(["calibration", "show", f"results={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA A100" in out and "p10 5.4, p50 7.0, p90 25.4, p99 29.5, mean 14.0 ms" in out
    assert "no clock-request latency measurement" in describe({"gpu": "a100"})


def test_peers_plan_with_the_latest_of_their_raises():
    import numpy as np

    from emo.optimize.pipeline.check import latest_of, planning_latencies

    PLAN = {"transition_ms": None, "transition_percentiles": [10.0, 90.0]}

    x = np.linspace(0.0, 10.0, 10001)
    assert latest_of(x, 1) is x
    four = latest_of(x, 4)  # the max of 4 uniform draws on [0, 10]: mean 8, median 10 * 0.5 ** (1/4)
    assert np.mean(four) == pytest.approx(8.0, abs=0.01) and np.median(four) == pytest.approx(8.409, abs=0.01)
    measured = {"samples": list(x[::10]), "pairs": [[1, 2]] * 1001}
    one, _ = planning_latencies(typed(OptimizerConfig, PLAN), measured)
    many, source = planning_latencies(typed(OptimizerConfig, PLAN), measured, peers=4)
    # the range the policy is built for (its lead) stays one GPU's; the expectation judges the latest
    assert (many.lo, many.hi) == (one.lo, one.hi) and many.mean > one.mean + 2.5
    assert source.endswith("the latest of 4 GPUs' raises")


@pytest.mark.parametrize(
    "name, read", [("calibration.json", opt_stage.clock_latency), ("check.json", opt_stage.iteration_sd)]
)
def test_a_broken_stage_file_is_one_line_naming_it(tmp_path, name, read):
    """The optimize stage reads calibrate's and fit's JSON through one reader: a missing file is
    "not measured", a broken one a ValueError naming it."""
    path = tmp_path / name
    assert read(path) is None
    path.write_text('{"clock_latency_ms": ')
    with pytest.raises(ValueError, match=rf"{name}: not valid JSON"):
        read(path)


# --------------------------------------------------------------------------- the virtual A100's latency, from hardware
# benchmarks/perseus_clock_latency.py on Perseus's SOSP'24 A100 runs (docs/virtual-gpu.md, "Clock-request
# latency"): the fit conf/gpu/a100.yaml carries, and what the sampled virtual latency must reproduce.
PERSEUS_A100 = {"p5": 1.49, "p50": 3.67, "p95": 9.06, "slope": 3.37, "stall": 0.0033}
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _bench(name: str):
    """A benchmarks/ script as a module (benchmarks/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _a100_latencies(target_mhz: int, n: int, seed: int = 0):
    import numpy as np
    import yaml

    from emo.device.sim import SimDevice

    cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / "conf" / "gpu" / "a100.yaml").read_text())
    cfg.pop("defaults", None)
    dev = SimDevice(cfg)
    rng = np.random.default_rng(seed)
    ci = dev.clocks.index(target_mhz)
    return np.array([dev.gp.clock_delay_ns(rng, ci) for _ in range(n)]) / 1e6, dev


def test_virtual_a100_latency_is_the_one_perseus_runs_show():
    import numpy as np

    low, dev = _a100_latencies(1050, 60000)  # below the knee, as Perseus's steps down (to 960-1065 MHz)
    assert np.percentile(low, 5) == pytest.approx(PERSEUS_A100["p5"], rel=0.05)
    assert np.percentile(low, 50) == pytest.approx(PERSEUS_A100["p50"], rel=0.05)
    assert np.percentile(low, 95) == pytest.approx(PERSEUS_A100["p95"], rel=0.05)
    # stalls (>= 20 ms on top of the body): beyond 25 ms the body has ~0.02 %, so the share there is theirs
    assert np.mean(low > 25.0) == pytest.approx(PERSEUS_A100["stall"], rel=0.25)
    # the steps up (to 1365-1380 MHz) took several times as long: the target above the knee
    high, _ = _a100_latencies(1380, 20000, seed=1)
    share = (1380 - dev.gp.p.knee_mhz) / (1410 - dev.gp.p.knee_mhz)
    want = PERSEUS_A100["p50"] * (1 + PERSEUS_A100["slope"] * share)
    assert np.median(high) == pytest.approx(want, rel=0.05)
    assert 12.0 < np.median(high) < 18.0  # Perseus's steps up: 13.2 ms raw median, 14.0 fitted alone


def test_merak_order_has_one_instruction_per_power_state():
    merak_order = _bench("perseus_clock_latency").merak_order

    # Perseus's 4-stage gpt3-xl run (128 micro-batches) holds 518, 520, 518, 516 power states per rank
    orders = [merak_order(4, s, 128) for s in range(4)]
    assert [len(o) for o in orders] == [518, 520, 518, 516]
    for s, o in enumerate(orders):
        assert o.count("F") == o.count("B") == 128 and o[-3:] == ["C", "C", "O"]
        assert o.count("L") == (128 if s in (0, 3) else 0)
        assert o.index("B") > o.index("F") + 2 * (3 - s) - 1  # 1F1B: 3 - s warm-up forwards before the first backward
    assert merak_order(2, 0, 2) == ["L", "F", "P", "L", "F", "P", "B", "P", "B", "C", "C", "O"]


def _fake_merak_runs(root: Path, m0: float, sigma: float, slope: float, seed: int = 0) -> None:
    """Perseus-format runs (2 stages, 32 micro-batches, 4 plans of random clocks) whose clock requests
    land after a known latency: lognormal, median m0 (1 + slope x) for a target x of the way from the
    knee to the max clock."""
    import gzip
    import json

    import numpy as np

    pcl = _bench("perseus_clock_latency")
    FMAX_MHZ, KNEE_MHZ, RUNS, merak_order = pcl.FMAX_MHZ, pcl.KNEE_MHZ, pcl.RUNS, pcl.merak_order

    rng = np.random.default_rng(seed)
    folder = root / RUNS / "merak+toy+custom+dp1+pp2+tp1+mbs1+nmb32+PointSolution"
    folder.mkdir(parents=True)
    base = {"F": 40.0, "B": 100.0}  # ms at the max clock; compute-bound: x fmax / f
    clocks = [1050, 1380]
    for n in range(4):
        sched, prof = [], []
        for stage in range(2):
            order = merak_order(2, stage, 32)
            ps, last = [], 1410
            for k in order:  # compute instructions draw a clock, the rest keep the one before
                last = int(rng.choice(clocks)) if k in "FB" else last
                ps.append(last)
            times = {"forward": [], "backward": []}
            for _ in range(4):  # iterations; the first is the warm-up
                it = {"F": [], "B": []}
                for i, k in enumerate(order):
                    if k not in "FB":
                        continue
                    t_new, t_old = base[k] * FMAX_MHZ / ps[i], base[k] * FMAX_MHZ / ps[i - 1]
                    t = t_new
                    if ps[i] != ps[i - 1]:
                        x = max(0.0, (ps[i] - KNEE_MHZ) / (FMAX_MHZ - KNEE_MHZ))
                        lat = m0 * (1 + slope * x) * np.exp(sigma * rng.standard_normal())
                        t = t_new - lat * (t_new / t_old - 1)
                    it[k].append((t + rng.normal(0, 0.05)) / 1e3)
                times["forward"].append(it["F"])
                times["backward"].append(it["B"])
            sched.append({"rank": stage, "power_states": ps})
            prof.append({"rank": stage, "time_breakdown": times})
        (folder / f"{n}.sched.json.gz").write_bytes(gzip.compress(json.dumps(sched).encode()))
        (folder / f"{n}.prof.json.gz").write_bytes(gzip.compress(json.dumps(prof).encode()))


def test_latency_estimate_recovers_a_known_latency(tmp_path, capsys):
    import json

    pcl = _bench("perseus_clock_latency")

    _fake_merak_runs(tmp_path, m0=4.0, sigma=0.4, slope=2.5)
    assert pcl.main(["--data", str(tmp_path), "--json", str(tmp_path / "fit.json")]) == 0
    fit = json.loads((tmp_path / "fit.json").read_text())["fit"]
    assert fit["n"] > 300
    assert fit["m0_ms"] == pytest.approx(4.0, rel=0.1)
    assert fit["sigma"] == pytest.approx(0.4, rel=0.15)
    assert fit["slope"] == pytest.approx(2.5, rel=0.15)
    assert fit["outlier_share"] < 0.01
    out = capsys.readouterr().out
    assert out.startswith("toy: ") and "fit: m0 " in out


def test_latency_estimate_without_runs_is_one_line(tmp_path, capsys):
    pcl = _bench("perseus_clock_latency")

    assert pcl.main(["--data", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no Merak runs" in err and str(tmp_path) in err


def test_crossing_is_where_perseus_stops_leading_within_budget():
    lc = _bench("latency_crossing")
    assert lc.counted(10.0, 0.4, 0.0) == 10.0 and lc.counted(10.0, 0.6, 0.0) is None  # budget + 0.5 tolerance
    assert lc.crossing([0, 1, 2, 5], [2.0, 1.0, -1.0, -3.0]) == (1.5, 1.5)  # linear between 1 and 2 ms
    assert lc.crossing([0, 1, 2], [2.0, None, None]) == (0, 1)  # leaves the budget between 0 and 1 ms
    assert lc.crossing([0, 1], [None, None]) is None  # never within budget
    assert lc.crossing([0, 1], [-1.0, -2.0]) is None  # never ahead
    assert lc.crossing([0, 1], [1.0, 2.0]) is None  # ahead throughout

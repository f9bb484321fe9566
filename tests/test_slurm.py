"""A sweep through Snakemake's slurm executor on a single-node SLURM cluster on this machine (Debian's
slurmctld, slurmd and munge). Uses a cluster that already answers `sinfo`; else starts one (configless,
so jobs find the configuration through slurmd) and stops what it started. Skips with the reason when
the packages are missing or the daemons do not come up."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from emo.cli import main as cli_main

pytestmark = pytest.mark.slow
SMALL = [
    "workload=tp",
    "workload.tp=2",
    "workload.model.layers=1",
    "model.clocks_stride=8",
    "model.repeats=1",
    "model.min_seconds=0.2",
    "trace.iterations=2",
    "validate.min_seconds=0.5",
]


def sinfo_partition(env=None) -> str | None:
    try:
        r = subprocess.run(["sinfo", "-h", "-o", "%P %t"], capture_output=True, text=True, timeout=10, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    rows = [ln.split() for ln in r.stdout.splitlines() if len(ln.split()) == 2]
    up = [p.rstrip("*") for p, state in rows if state in ("idle", "mix", "alloc")]
    return up[0] if r.returncode == 0 and up else None


def start_cluster(work: Path) -> list[int]:
    """munged (when its socket is missing), slurmctld, slurmd on this host; the pids it started."""
    host = socket.gethostname()
    for d in ("state", "spool", "log"):
        (work / d).mkdir(parents=True, exist_ok=True)
    conf = work / "slurm.conf"
    conf.write_text(
        "\n".join(
            [
                "ClusterName=emotest",
                f"SlurmctldHost={host}",
                "SlurmUser=root",
                "SlurmdUser=root",
                "AuthType=auth/munge",
                f"StateSaveLocation={work}/state",
                f"SlurmdSpoolDir={work}/spool",
                f"SlurmctldPidFile={work}/slurmctld.pid",
                f"SlurmdPidFile={work}/slurmd.pid",
                f"SlurmctldLogFile={work}/log/slurmctld.log",
                f"SlurmdLogFile={work}/log/slurmd.log",
                "SlurmctldPort=16917",
                "SlurmdPort=16918",
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core",
                "ReturnToService=2",
                "MpiDefault=none",
                "JobAcctGatherType=jobacct_gather/none",
                "AccountingStorageType=accounting_storage/none",
                "SlurmctldParameters=enable_configless",
                f"NodeName={host} CPUs={os.cpu_count()} RealMemory=4000 State=UNKNOWN",
                "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
                "",
            ]
        )
    )
    started = []
    if not Path("/run/munge/munge.socket.2").exists():
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        subprocess.run(["munged", "--force"], capture_output=True, timeout=20)
        started += [int(Path("/run/munge/munged.pid").read_text())] if Path("/run/munge/munged.pid").exists() else []
    subprocess.run(["slurmctld", "-f", str(conf)], capture_output=True, timeout=30)
    time.sleep(2)
    subprocess.run(["slurmd", "--conf-server", f"{host}:16917"], capture_output=True, timeout=30)
    for name in ("slurmctld", "slurmd"):
        pid = work / f"{name}.pid"
        for _ in range(50):
            if pid.exists() and pid.read_text().strip():
                break
            time.sleep(0.2)
        if pid.exists() and pid.read_text().strip():
            started.append(int(pid.read_text()))
    return started


@pytest.fixture
def slurm_partition(tmp_path_factory):
    missing = [c for c in ("slurmctld", "slurmd", "munged", "sbatch", "squeue", "sinfo") if shutil.which(c) is None]
    if missing:
        pytest.skip(f"SLURM is not installed ({', '.join(missing)} missing: apt-get install slurmctld slurmd munge)")
    pytest.importorskip(
        "snakemake_executor_plugin_slurm", reason="pip install snakemake-executor-plugin-slurm (extra slurm)"
    )
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    partition = sinfo_partition(env)
    started: list[int] = []
    if partition is None:
        started = start_cluster(tmp_path_factory.mktemp("slurm"))
        for _ in range(30):
            partition = sinfo_partition(env)
            if partition:
                break
            time.sleep(1)
    try:
        if partition is None:
            pytest.skip("the SLURM daemons did not come up here (sinfo shows no usable partition)")
        yield partition
    finally:
        for pid in reversed(started):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


def test_a_sweep_runs_through_the_slurm_executor(slurm_partition, tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("SLURM_CONF", raising=False)  # the plugin clears SLURM_* in jobs: configless slurmd serves it
    profile = tmp_path / "profile"
    profile.mkdir()
    # profiles/slurm with this cluster's partition, no accounting (squeue for status) and no GPUs (the virtual GPU)
    (profile / "config.yaml").write_text(
        "\n".join(
            [
                "executor: slurm",
                "jobs: 4",
                "latency-wait: 5",
                "slurm-status-command: squeue",
                "slurm-no-account: true",
                "slurm-keep-successful-logs: true",
                "slurm-init-seconds-before-status-checks: 1",
                "seconds-between-status-checks: 2",
                "default-resources:",
                f"  slurm_partition: {slurm_partition}",
                "  runtime: 30",
                "  mem_mb: 1000",
                "  cpus_per_task: 1",
                "set-resources:",
                *[f"  {r}: {{gpu: 0}}" for r in ("trace", "calibrate", "profile", "validate")],
                "",
            ]
        )
    )
    results = tmp_path / "results"
    assert cli_main(["run", "--profile", str(profile), "-m", f"results={results}", *SMALL, "optimizer=emo,zeus"]) == 0
    assert len([ln for ln in capfd.readouterr().out.splitlines() if ln.startswith("emo: optimizer=")]) == 2
    slurm_logs = list((tmp_path / ".snakemake" / "slurm_logs").glob("rule_*/*/*.log"))
    assert {p.parts[-3] for p in slurm_logs} >= {"rule_calibrate", "rule_trace", "rule_optimize", "rule_validate"}
    assert {json.loads(p.read_text())["method"] for p in results.glob("validate/*/result.json")} == {"emo", "zeus"}

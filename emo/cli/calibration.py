"""`emo calibration show|export|import`: a calibration as a file a team shares per GPU model.

    emo calibration show [overrides...]                         # what this configuration's calibration holds
    emo calibration export [overrides...] --out a100.emocal     # the calibrate stage's result
    emo calibration import a100.emocal [overrides...]           # install it for this configuration

The file is a zip of bench.parquet and manifest.json: the GPU model and driver that measured it,
its clocks and benchmarks, the measured clock-request latency distribution (`clock_latency_ms`), and
the sha256 of bench.parquet. Its id (printed, and in the manifest) is a hash of the GPU model, the
driver, that content and the latency measurement, so two files with the same id hold the same
measurements of the same GPU (a file from before EMO measured the latency keeps its id). Import checks the content against the hash and the GPU model
against the configuration's, then writes it where the calibrate stage of this configuration would,
so the pipeline reuses it instead of measuring (about 35-40 minutes on an A100 at every clock).
"""

from __future__ import annotations

import hashlib
import json
import sys
import zipfile
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
BENCH = "bench.parquet"


# What an .emocal may hold, checked before it is inflated (a 3 MB file once took 6.4 GB): a bench
# table of every microbenchmark at every clock is a few MB.
MAX_MEMBER_BYTES = {MANIFEST: 1 << 20, BENCH: 256 << 20}


def calibration_id(
    gpu_model: str, driver: str, bench_sha256: str, clock_latency: dict | None = None, gpu: str | None = None
) -> str:
    """The hash of what a calibration is: the GPU (its model and the configuration name `gpu` it
    installs into, so a relabelled file no longer matches), the driver, the content, the latency.
    `gpu` None: the id of files exported before it was covered (read, but installed only with --force)."""
    key = f"{gpu_model}\n{driver}\n{bench_sha256}"
    if clock_latency is not None:
        key += "\n" + json.dumps(clock_latency, sort_keys=True)
    if gpu is not None:
        key += f"\ngpu={gpu}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def describe(meta: dict) -> str:
    """What a calibration holds, in two lines: the GPU and its sweep, then the clock-request latency."""
    from emo.model.calibration import latency_line

    clocks = meta.get("clocks_mhz") or []
    head = (
        f"{meta.get('gpu_model', 'unknown')} (gpu={meta.get('gpu', 'unknown')}, driver {meta.get('driver', 'unknown')}): "
        f"{meta.get('benchmarks', '?')} benchmarks at {len(clocks)} clocks"
        + (f" ({clocks[0]}-{clocks[-1]} MHz)" if clocks else "")
    )
    lat = meta.get("clock_latency_ms")
    tail = (
        latency_line(lat)
        if lat
        else (
            "no clock-request latency measurement (made before EMO measured it, or on a "
            "device that cannot): optimize needs optimizer.transition_ms=[min,max]"
        )
    )
    return f"{head}\n{tail}"


def export_calibration(folder: Path, out: Path) -> dict:
    """Pack a calibrate stage folder (bench.parquet + calibration.json) into `out`; the manifest."""
    bench, info = folder / BENCH, folder / "calibration.json"
    if not bench.is_file():
        raise FileNotFoundError(f"{bench}: no calibration here (run the calibrate stage first: emo run)")
    meta: dict[str, Any] = (
        json.loads(info.read_text())
        if info.is_file()
        else {"gpu": "unknown", "gpu_model": "unknown", "driver": "unknown"}
    )
    data = bench.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    manifest = {
        **meta,
        "bench_sha256": sha,
        "id": calibration_id(meta["gpu_model"], meta["driver"], sha, meta.get("clock_latency_ms"), str(meta["gpu"])),
    }
    from emo.io import atomic_path

    with atomic_path(out) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(MANIFEST, json.dumps(manifest, indent=2, sort_keys=True))
        z.writestr(BENCH, data)
    return manifest


def read_calibration(path: Path) -> tuple[dict, bytes]:
    """(manifest, bench.parquet bytes) of an exported file, checked against its hashes."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        with zipfile.ZipFile(path) as z:
            for name, limit in MAX_MEMBER_BYTES.items():  # the sizes it declares; a read stops there
                if z.getinfo(name).file_size > limit:
                    raise ValueError(
                        f"{path}: its {name} inflates to {z.getinfo(name).file_size >> 20} MiB "
                        f"(more than {limit >> 20} MiB): not an EMO calibration"
                    )
            manifest = json.loads(z.read(MANIFEST))
            data = z.read(BENCH)
    except (
        zipfile.BadZipFile,
        KeyError,
        json.JSONDecodeError,
        UnicodeDecodeError,
        RecursionError,
        OSError,
        EOFError,
        NotImplementedError,
        RuntimeError,
    ):  # (OSError/EOFError: a cut stream; the others: an odd zip)
        raise ValueError(f"{path}: not an EMO calibration (want a zip with {MANIFEST} and {BENCH})") from None
    if not isinstance(manifest, dict):
        raise ValueError(f"{path}: not an EMO calibration ({MANIFEST} is not an object)")
    sha = hashlib.sha256(data).hexdigest()
    fields = (
        str(manifest.get("gpu_model", "")),
        str(manifest.get("driver", "")),
        sha,
        manifest.get("clock_latency_ms"),
    )
    if sha != manifest.get("bench_sha256") or manifest.get("id") not in (
        calibration_id(*fields, str(manifest.get("gpu"))),
        calibration_id(*fields),
    ):
        raise ValueError(f"{path}: content does not match its manifest's hash (corrupted or edited)")
    manifest["legacy_id"] = manifest["id"] != calibration_id(*fields, str(manifest.get("gpu")))
    return manifest, data


def import_calibration(path: Path, folder: Path, gpu_name: str, force: bool = False) -> dict:
    """Install an exported calibration as the calibrate stage's output in `folder`. A file whose
    GPU is unknown, or whose id does not cover its gpu field (exported before it did), could be any
    GPU's: installed only with `force`."""
    manifest, data = read_calibration(path)
    if gpu_name != "auto" and manifest.get("gpu") != gpu_name and manifest.get("gpu") != "unknown":
        raise ValueError(
            f"{path}: a calibration of gpu={manifest.get('gpu')} ({manifest.get('gpu_model')}), "
            f"but this configuration is gpu={gpu_name}"
        )
    if not force and manifest.get("gpu") == "unknown":
        raise ValueError(
            f"{path}: a calibration of an unknown GPU ({manifest.get('gpu_model')}): it could be any GPU's; "
            f"pass --force to install it for gpu={gpu_name} anyway"
        )
    if not force and manifest["legacy_id"]:
        raise ValueError(
            f"{path}: exported before a calibration's id covered its gpu field, so gpu={manifest.get('gpu')} "
            f"is not checked ({manifest.get('gpu_model')}); export it again with this EMO, or pass --force"
        )
    manifest = {k: v for k, v in manifest.items() if k != "legacy_id"}
    from emo.io import atomic_path, write_json

    with atomic_path(folder / BENCH) as tmp:
        tmp.write_bytes(data)
    write_json(
        folder / "calibration.json",
        {k: v for k, v in manifest.items() if k != "id"} | {"imported_from": manifest["id"]},
    )
    return manifest


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "calibration", help="show, export or import a calibration (one file per GPU model)", description=__doc__
    )
    sub = p.add_subparsers(dest="calibration_command", required=True)
    s = sub.add_parser("show", help="what this configuration's calibration holds (clock-request latency included)")
    s.add_argument("overrides", nargs="*", help="configuration overrides, as for emo run (e.g. gpu=h100)")
    s.set_defaults(func=_cmd_show)
    e = sub.add_parser("export", help="pack this configuration's calibration into a file")
    e.add_argument("overrides", nargs="*", help="configuration overrides, as for emo run (e.g. gpu=h100)")
    e.add_argument("--out", required=True, help="file to write")
    e.add_argument("--force", action="store_true", help="replace an existing file")
    e.set_defaults(func=_cmd_export)
    i = sub.add_parser("import", help="install a calibration file for this configuration")
    i.add_argument("file")
    i.add_argument("overrides", nargs="*", help="configuration overrides, as for emo run")
    i.add_argument("--force", action="store_true", help="install a file whose GPU is unknown or not covered by its id")
    i.set_defaults(func=_cmd_import)


def _folder(overrides: list[str]) -> tuple[Path, dict]:
    from emo.workflow.plan import compose, plan

    cfg = compose(overrides)
    return plan(cfg)["calibrate"].dir, cfg


def _cmd_show(args) -> int:
    folder, _ = _folder(args.overrides)
    info = folder / "calibration.json"
    if not info.is_file():
        raise FileNotFoundError(f"{info}: no calibration here (run the calibrate stage first: emo run)")
    print(f"{folder}: {describe(json.loads(info.read_text()))}")
    return 0


def _cmd_export(args) -> int:
    from emo.io import check_output

    check_output(args.out, "--out", force=args.force)
    folder, _ = _folder(args.overrides)
    m = export_calibration(folder, Path(args.out))
    print(f"wrote {args.out}: calibration {m['id']} of {describe(m)}")
    return 0


def _cmd_import(args) -> int:
    from emo.workflow import locks

    folder, cfg = _folder(args.overrides)
    # under the results folder's lock: a running `emo run` would overwrite it in its calibrate stage
    with locks.hold([Path(cfg["results"])], f"emo calibration import {args.file}"):
        locks.refuse_future(Path(cfg["results"]), "emo calibration import")
        m = import_calibration(Path(args.file), folder, cfg["gpu"]["name"], force=args.force)
    print(f"installed calibration {m['id']} in {folder}: {describe(m)}", file=sys.stdout)
    return 0

"""`emo ui`: MLflow's web UI on the store `emo run` logs into (the tracking config's URI, or
MLFLOW_TRACKING_URI). The default install has only `mlflow-skinny` (no web server): `emo ui` says how
to add the server of the installed mlflow-skinny's version (never the `ui` extra after the fact, which
moves mlflow-skinny to whatever version of the full package the registry can install).

    emo ui [--port 5000] [--host 127.0.0.1] [KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ui", help="MLflow's web UI on the runs `emo run` logged (needs the `ui` extra)")
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("overrides", nargs="*", help="Hydra overrides selecting the tracking config, e.g. results=out")
    p.set_defaults(func=main)


def server_installed() -> bool:
    """The full `mlflow` distribution (mlflow-skinny ships mlflow.server but not what it imports)."""
    try:
        importlib.metadata.distribution("mlflow")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def install_hint() -> str:
    """The install that adds the server without moving the MLflow the store was written with: the full
    package pinned to mlflow-skinny's version, which pip installs or refuses (when the registry lacks that
    release), never replacing mlflow-skinny by another version as an unpinned `mlflow` (the `ui` extra) may."""
    skinny = importlib.metadata.version("mlflow-skinny")
    return (
        f"python3 -m pip install 'mlflow=={skinny}' (the installed mlflow-skinny's version; if pip finds no such "
        f"release, run `mlflow ui` from another environment with mlflow>={skinny})"
    )


def in_step() -> None:
    """mlflow (the server) and mlflow-skinny (the client EMO logs with) of one version: an install of
    the `ui` extra that found no mlflow of the installed skinny's version downgraded skinny to match,
    and a store the newer one had written became unreadable. Said in one line with the fix."""
    import importlib.metadata as md

    try:
        full, skinny = md.version("mlflow"), md.version("mlflow-skinny")
    except md.PackageNotFoundError:
        return
    if full != skinny:
        raise ValueError(
            f"mlflow {full} and mlflow-skinny {skinny} differ: install one version of both "
            f"(python3 -m pip install 'mlflow=={skinny}' 'mlflow-skinny=={skinny}')"
        )


def command(uri: str, host: str, port: int) -> list[str]:
    return [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", host, "--port", str(port)]


def main(args: argparse.Namespace) -> int:
    from emo.sections import TrackingConfig, typed
    from emo.workflow.plan import compose
    from emo.workflow.tracking import tracking_uri

    if not server_installed():
        raise ValueError(f"emo ui needs MLflow's web server, which the default install leaves out: {install_hint()}")
    in_step()
    uri = tracking_uri(typed(TrackingConfig, compose(args.overrides)["tracking"]))
    if uri.startswith("sqlite:///"):
        from emo.workflow.tracking import check_schema

        check_schema(Path(uri.removeprefix("sqlite:///")))
    print(f"emo ui: {uri} on http://{args.host}:{args.port}", file=sys.stderr)
    return serve(command(uri, args.host, args.port))


def serve(cmd: list[str]) -> int:
    """Run the server until it ends or emo ui is stopped (Ctrl-C, SIGTERM, SIGHUP), then stop all of
    it: `mlflow ui` runs its web server as a child with worker processes of its own, which a signal
    to emo alone (a scheduler's, a `kill`) would leave behind, serving on the port."""
    import os
    import signal

    from emo import errors

    proc = subprocess.Popen(cmd, start_new_session=True)  # its own process group: stopped as one
    try:
        with errors.signals_raise():
            return proc.wait()
    except KeyboardInterrupt as e:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=10)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        print("emo ui: stopped", file=sys.stderr)
        return errors.exit_status(e)

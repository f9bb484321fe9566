"""The fake CUDA context of tests/fake_ncu: a process-wide profiler flag and a launch log."""

import json
import os
import threading

_ON = False


def _log(**rec) -> None:
    with open(os.environ["FAKE_NCU_LOG"], "a") as f:
        f.write(json.dumps({"pid": os.getpid(), **rec}) + "\n")


def profiler_start() -> None:
    global _ON
    _ON = True
    _log(event="start", thread=threading.current_thread().name)


def profiler_stop() -> None:
    global _ON
    _ON = False
    _log(event="stop", thread=threading.current_thread().name)


def launch(name: str) -> None:
    _log(event="kernel", name=name, thread=threading.current_thread().name, profiled=_ON)

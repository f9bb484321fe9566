"""Trace readers: every supported format becomes one normalised event table (see emo.trace.schema).

`read_trace(path)` takes a Kineto JSON file (plain or .gz), a folder of per-rank Kineto files, or
an Nsight Systems SQLite export, and refuses what EMO cannot analyse with a one-line ValueError."""

from __future__ import annotations

from emo.trace.kineto import load_json as load_kineto_document
from emo.trace.read import FORMATS, TraceFormat, read_trace, register_trace_format, trace_files, validate_events
from emo.trace.schema import COLUMNS, KINDS
from emo.trace.window import clip_window

__all__ = [
    "read_trace",
    "validate_events",
    "clip_window",
    "COLUMNS",
    "KINDS",
    "FORMATS",
    "TraceFormat",
    "register_trace_format",
    "trace_files",
    "load_kineto_document",
]

"""Columns of a Kineto trace's events straight from its JSON text, with no Python object per event.

One compiled (numba) pass over the `traceEvents` array writes, per event, the codes and numbers EMO
reads (phase, category and name as codes into their distinct values, ts and dur, pid, tid, a flow's
id, the integer args) into numpy columns; only the distinct names and categories, and the few args
that are not integers (a sync's kind, a collective's process group), become Python objects.

It is the fast path of emo.trace.kineto's reader and gives exactly what its msgspec path gives, or
nothing: the text is first checked by msgspec (skipping every value, the check the typed decode
makes of the parts it skips), and any event the scan cannot take as the typed decode would (a
duplicate or escaped key, a value of an unusual type, an integer of more than 18 digits) makes it
return None, so that the msgspec path reads the file and says what is wrong with it. Numbers: an
integer is exact; a decimal with at most 18 significant digits and a power of ten within 10^±22 is
one correctly rounded IEEE operation (as msgspec rounds); any other is handed to msgspec."""

from __future__ import annotations

from typing import Any

import msgspec
import numba
import numpy as np

# int64 columns (-1: absent or not an integer, as emo.trace.kineto._ints reads them)
PID, TID, ID, CORR, EXT, DEVICE, STREAM, WAIT_CORR, WAIT_STREAM, BYTES = range(10)
N_INT = 10
ARG_INTS = (CORR, EXT, DEVICE, STREAM, WAIT_CORR, WAIT_STREAM, BYTES)  # in kineto._ARG_INTS' order
# int32 columns
PH, CAT, NAME, TS_STATE, DUR_STATE = range(5)
N_CODE = 5
# PH: -1 absent or null, 0 a string that is no phase, 1 "X", 2 another phase
# CAT, NAME: code into the distinct strings; -1 absent or null
# TS_STATE, DUR_STATE: 0 absent, 1 a number in the float column, 2 a number left to msgspec (in `extra`),
# 3 null
# `extra` rows (event, field, start, end): a value's text, decoded by msgspec
SYNC_KIND, PG_LONG, PG_NAME, PG_RANKS, TS_TEXT, DUR_TEXT = range(6)

_PHASES = np.zeros(256, np.bool_)
_PHASES[np.frombuffer(b"BEXiIbnesftPONDMVvRcCSTpF()", np.uint8)] = True
_POW10 = np.array([10.0**k for k in range(23)])  # exact doubles


def _keys(*names: bytes) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.cumsum([0, *map(len, names)]).astype(np.int64)
    return np.frombuffer(b"".join(names), np.uint8).copy(), offsets


# event keys, in this order: 0 ph, 1 cat, 2 name, 3 ts, 4 dur, 5 pid, 6 tid, 7 id, 8 args
_EV_KEYS, _EV_OFF = _keys(b"ph", b"cat", b"name", b"ts", b"dur", b"pid", b"tid", b"id", b"args")
# args keys: 0-6 the integers (ARG_INTS' order), 7-10 the text/any ones (SYNC_KIND..PG_RANKS)
_ARG_KEYS, _ARG_OFF = _keys(
    b"correlation",
    b"External id",
    b"device",
    b"stream",
    b"wait_on_cuda_event_record_corr_id",
    b"wait_on_stream",
    b"bytes",
    b"cuda_sync_kind",
    b"Process Group Name",
    b"pg_name",
    b"Process Group Ranks",
)

_QUOTE, _BSLASH = 34, 92
_STOP = np.zeros(256, np.bool_)  # what ends a string's plain run
_STOP[[_QUOTE, _BSLASH]] = True


@numba.njit(cache=True, inline="always")
def _ws(b, i, n):
    while i < n and (b[i] == 32 or b[i] == 10 or b[i] == 13 or b[i] == 9):
        i += 1
    return i


@numba.njit(cache=True)
def _string(b, i, n):
    """b[i] opens a string: (the index after its closing quote, has an escape, has a non-ASCII byte)."""
    i += 1
    esc = False
    high = 0
    while i < n:
        c = b[i]
        high |= c
        if _STOP[c]:
            if c == _QUOTE:
                return i + 1, esc, high >= 128
            esc = True
            i += 1  # (past the escaped character)
        i += 1
    return n, esc, high >= 128


@numba.njit(cache=True)
def _skip(b, i, n):
    """The index after the (valid JSON) value starting at b[i]."""
    c = b[i]
    if c == _QUOTE:
        return _string(b, i, n)[0]
    if c != 123 and c != 91:  # a number or literal: up to the next delimiter
        while i < n:
            c = b[i]
            if c == 44 or c == 93 or c == 125 or c == 32 or c == 10 or c == 13 or c == 9:
                return i
            i += 1
        return n
    depth = 0
    while i < n:
        c = b[i]
        if c == _QUOTE:
            i = _string(b, i, n)[0]
            continue
        if c == 123 or c == 91:
            depth += 1
        elif c == 125 or c == 93:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return n


@numba.njit(cache=True, inline="always")
def _digits(b, i, n, m, digits):
    """The digits from b[i] on, into mantissa m: (end, m, significant digits so far, digits kept in
    m; only the first 18 significant ones are)."""
    kept = 0
    while i < n and 48 <= b[i] <= 57:
        if m != 0 or b[i] != 48:
            digits += 1
        if digits <= 18:
            m = m * 10 + (b[i] - 48)
            kept += 1
        i += 1
    return i, m, digits, kept


@numba.njit(cache=True, inline="always")
def _exponent(b, i, n):
    """An exponent's sign and digits from b[i] on (past the e): (end, exponent, fits: < 10^4)."""
    eneg = False
    if b[i] == 45 or b[i] == 43:
        eneg = b[i] == 45
        i += 1
    e = 0
    ed = 0
    while i < n and 48 <= b[i] <= 57:
        if ed < 5:
            e = e * 10 + (b[i] - 48)
        ed += 1
        i += 1
    return i, -e if eneg else e, ed <= 4


@numba.njit(cache=True)
def _number(b, i, n):
    """A number at b[i]: (end, is an integer, fits (<= 18 digits; exponent < 10^4), mantissa with
    sign, power of ten)."""
    neg = b[i] == 45
    if neg:
        i += 1
    i, m, digits, _ = _digits(b, i, n, 0, 0)
    is_int = True
    frac = 0
    if i < n and b[i] == 46:
        is_int = False
        i, m, digits, frac = _digits(b, i + 1, n, m, digits)
    e = 0
    fits = True
    if i < n and (b[i] == 101 or b[i] == 69):
        is_int = False
        i, e, fits = _exponent(b, i + 1, n)
    return i, is_int, fits and digits <= 18, -m if neg else m, e - frac


@numba.njit(cache=True)
def _int_value(b, i, n):
    """An event's or arg's value read as kineto._int reads it: (end, value, ok); not ok: a value
    the scan leaves to msgspec (an escaped or non-ASCII string, an array or object, a long integer)."""
    c = b[i]
    if c == _QUOTE:
        end, esc, high = _string(b, i, n)
        return end, -1, not (esc or high)
    if c == 45 or 48 <= c <= 57:
        end, is_int, fits, m, _ = _number(b, i, n)
        if not is_int:
            return end, -1, fits
        return end, m, fits
    if c == 116:  # true (operator.index(True) == 1)
        return i + 4, 1, True
    if c == 102:
        return i + 5, 0, True
    if c == 110:
        return i + 4, -1, True
    return _skip(b, i, n), -1, False


@numba.njit(cache=True)
def _key(b, s, e, keys, off):
    """The index of b[s:e] among the keys, -1 if none."""
    m = e - s
    for k in range(len(off) - 1):
        if off[k + 1] - off[k] != m:
            continue
        o = off[k]
        same = True
        for j in range(m):
            if b[s + j] != keys[o + j]:
                same = False
                break
        if same:
            return k
    return -1


@numba.njit(cache=True)
def _hash(b, s, e):
    """A hash of b[s:e] from its length and its first and last 16 bytes (equal ones are compared)."""
    h = np.uint64(e - s) * np.uint64(0x9E3779B97F4A7C15)
    if e - s <= 32:
        for j in range(s, e):
            h = (h ^ np.uint64(b[j])) * np.uint64(1099511628211)
    else:
        for j in range(s, s + 16):
            h = (h ^ np.uint64(b[j])) * np.uint64(1099511628211)
        for j in range(e - 16, e):
            h = (h ^ np.uint64(b[j])) * np.uint64(1099511628211)
    return h ^ (h >> np.uint64(29))


@numba.njit(cache=True)
def _intern(b, s, e, table, starts, ends, count):
    """The code of string b[s:e] (quotes included) in an open-addressing table of the distinct ones
    (starts/ends: where each was first seen); (code, count) with count grown for a new string."""
    mask = np.uint64(len(table) - 1)
    j = _hash(b, s, e) & mask
    m = e - s
    while True:
        k = table[j]
        if k < 0:
            table[j] = count
            starts[count] = s
            ends[count] = e
            return count, count + 1
        if ends[k] - starts[k] == m:
            o = starts[k]
            same = True
            for t in range(m):
                if b[o + t] != b[s + t]:
                    same = False
                    break
            if same:
                return k, count
        j = (j + np.uint64(1)) & mask


@numba.njit(cache=True)
def _rehash(b, starts, ends, count, size):
    table = np.full(size, -1, np.int64)
    mask = np.uint64(size - 1)
    for k in range(count):
        j = _hash(b, starts[k], ends[k]) & mask
        while table[j] >= 0:
            j = (j + np.uint64(1)) & mask
        table[j] = k
    return table


@numba.njit(cache=True, nogil=True)  # (threads scan several ranks' files at once)
def _scan(b):
    """(ok, events, int columns, code columns, ts, dur, extra rows, distinct strings' (start, end))."""
    n = len(b)
    cap = max(1024, n // 256)
    ints = np.full((N_INT, cap), -1, np.int64)
    codes = np.full((N_CODE, cap), -1, np.int32)
    ts = np.zeros(cap, np.float64)
    dur = np.zeros(cap, np.float64)
    extra = np.zeros((1024, 4), np.int64)
    n_extra = 0
    table = np.full(1 << 12, -1, np.int64)
    starts = np.zeros(1 << 11, np.int64)
    ends = np.zeros(1 << 11, np.int64)
    count = 0
    ne = 0
    fail = (False, 0, ints[:, :0], codes[:, :0], ts[:0], dur[:0], extra[:0], starts[:0], ends[:0])
    i = _ws(b, 0, n)
    if i >= n or b[i] != 91:
        return fail
    i = _ws(b, i + 1, n)
    if i < n and b[i] == 93:
        return True, 0, ints[:, :0], codes[:, :0], ts[:0], dur[:0], extra[:0], starts[:0], ends[:0]
    while i < n:
        if b[i] != 123:
            return fail
        # room for one more event: a row, its extra rows (ts, dur and four args) and two strings
        if ne == cap:
            cap *= 2
            ints, codes, ts, dur = _grown_columns(ints, codes, ts, dur, ne, cap)
        if n_extra + 6 > len(extra):
            extra = _grown(extra, 2 * len(extra))
        if 2 * (count + 2) > len(table):  # (the intern table stays at most half full)
            table = _rehash(b, starts, ends, count, 2 * len(table))
        if count + 2 > len(starts):
            starts, ends = _grown(starts, 2 * len(starts)), _grown(ends, 2 * len(ends))
        i, ok, n_extra, count = _event(b, i, n, ne, ints, codes, ts, dur, extra, n_extra, table, starts, ends, count)
        if not ok:
            return fail
        ne += 1
        i = _ws(b, i, n)
        if i < n and b[i] == 44:
            i = _ws(b, i + 1, n)
        else:
            break
    return (
        True,
        ne,
        ints[:, :ne],
        codes[:, :ne],
        ts[:ne],
        dur[:ne],
        extra[:n_extra],
        starts[:count],
        ends[:count],
    )


@numba.njit(cache=True)
def _grown_columns(ints, codes, ts, dur, ne, cap):
    """The event columns with room for `cap` events, their first `ne` kept."""
    ints2 = np.full((N_INT, cap), -1, np.int64)
    ints2[:, :ne] = ints[:, :ne]
    codes2 = np.full((N_CODE, cap), -1, np.int32)
    codes2[:, :ne] = codes[:, :ne]
    ts2 = np.zeros(cap, np.float64)
    ts2[:ne] = ts[:ne]
    dur2 = np.zeros(cap, np.float64)
    dur2[:ne] = dur[:ne]
    return ints2, codes2, ts2, dur2


@numba.njit(cache=True)
def _grown(a, rows):
    """`a` with room for `rows` rows, its own kept (the rest zeros)."""
    out = np.zeros((rows,) + a.shape[1:], a.dtype)
    out[: len(a)] = a
    return out


# an event's steps are inlined into _scan: one compiled loop, no call per event or field
@numba.njit(cache=True, inline="always")
def _event(b, i, n, ne, ints, codes, ts, dur, extra, n_extra, table, starts, ends, count):
    """The event object at b[i] into row `ne` of the columns (with room for it): (end, ok, n_extra,
    count); not ok: one the scan leaves to msgspec."""
    codes[TS_STATE, ne] = 0
    codes[DUR_STATE, ne] = 0
    seen = 0
    i = _ws(b, i + 1, n)
    if i < n and b[i] == 125:
        return i + 1, True, n_extra, count
    while i < n:
        i, k, seen, ok = _member(b, i, n, _EV_KEYS, _EV_OFF, seen)
        if not ok:
            return i, False, n_extra, count
        if k == 0:
            i, ok = _phase(b, i, n, ne, codes)
        elif k == 1 or k == 2:
            i, ok, count = _text(b, i, n, k, ne, codes, table, starts, ends, count)
        elif k == 3 or k == 4:
            i, ok, n_extra = _time(b, i, n, k, ne, codes, ts, dur, extra, n_extra)
        elif k >= 5 and k <= 7:  # pid, tid, id
            i, v, ok = _int_value(b, i, n)
            ints[k - 5, ne] = v
        elif k == 8 and b[i] == 123:
            i, ok, n_extra = _args(b, i, n, ne, ints, extra, n_extra)
        elif k == 8:
            i, ok = _other_args(b, i, n)
        else:
            i = _skip(b, i, n)
        if not ok:
            return i, False, n_extra, count
        i = _ws(b, i, n)
        if i < n and b[i] == 44:
            i = _ws(b, i + 1, n)
        else:
            return i + 1, True, n_extra, count
    return i, True, n_extra, count


@numba.njit(cache=True, inline="always")
def _member(b, i, n, keys, off, seen):
    """The key of the object member at b[i]: (where its value starts, its index among the keys (-1:
    none), `seen` (a bit per key) with it, ok: the key is neither escaped nor seen before)."""
    ks = i
    i, esc, _ = _string(b, i, n)
    if esc:
        return i, -1, seen, False
    k = _key(b, ks + 1, i - 1, keys, off)
    i = _ws(b, _ws(b, i, n) + 1, n)  # past the colon
    if k >= 0:
        if seen & (1 << k):
            return i, k, seen, False
        seen |= 1 << k
    return i, k, seen, True


@numba.njit(cache=True, inline="always")
def _phase(b, i, n, ne, codes):
    """ph at b[i], a plain string or null, into codes[PH]: (end, ok)."""
    c = b[i]
    if c == 110:
        return i + 4, True
    if c != _QUOTE:
        return i, False
    s = i
    i, esc, high = _string(b, i, n)
    if esc or high:
        return i, False
    if i - s == 3:
        codes[PH, ne] = 1 if b[s + 1] == 88 else (2 if _PHASES[b[s + 1]] else 0)
    else:
        codes[PH, ne] = 0
    return i, True


@numba.njit(cache=True, inline="always")
def _text(b, i, n, k, ne, codes, table, starts, ends, count):
    """cat or name (k 1, 2) at b[i], a string (cat unescaped) or null, as the code of its distinct
    string: (end, ok, count)."""
    c = b[i]
    if c == 110:
        return i + 4, True, count
    if c != _QUOTE:
        return i, False, count
    s = i
    i, esc, _ = _string(b, i, n)
    if k == 1 and esc:
        return i, False, count
    code, count = _intern(b, s, i, table, starts, ends, count)
    codes[k, ne] = code
    return i, True, count


@numba.njit(cache=True, inline="always")
def _time(b, i, n, k, ne, codes, ts, dur, extra, n_extra):
    """ts or dur (k 3, 4) at b[i], a number or null, into its column and state (a number not read
    exactly here: an extra row, for msgspec): (end, ok, n_extra)."""
    col = TS_STATE if k == 3 else DUR_STATE
    c = b[i]
    if c == 110:
        codes[col, ne] = 3
        return i + 4, True, n_extra
    if not (c == 45 or 48 <= c <= 57):
        return i, False, n_extra
    s = i
    i, is_int, fits, m, e = _number(b, i, n)
    if is_int and not fits:
        return i, False, n_extra
    v, state = _float(is_int, fits, m, e)
    codes[col, ne] = state
    if k == 3:
        ts[ne] = v
    else:
        dur[ne] = v
    if state == 2:
        n_extra = _put(extra, n_extra, ne, TS_TEXT if k == 3 else DUR_TEXT, s, i)
    return i, True, n_extra


@numba.njit(cache=True, inline="always")
def _float(is_int, fits, m, e):
    """A number m * 10^e as (value, 1) where one IEEE operation rounds it correctly, else (0.0, 2)."""
    if fits and is_int:
        return float(m), 1
    if fits and -(2**53) <= m <= 2**53 and -22 <= e <= 22:
        return (float(m) * _POW10[e] if e >= 0 else float(m) / _POW10[-e]), 1
    return 0.0, 2


@numba.njit(cache=True, inline="always")
def _put(extra, n_extra, ne, field, s, e):
    """Extra row `n_extra` (there is room): event `ne`'s `field`, its text b[s:e]; the next row."""
    extra[n_extra, 0] = ne
    extra[n_extra, 1] = field
    extra[n_extra, 2] = s
    extra[n_extra, 3] = e
    return n_extra + 1


@numba.njit(cache=True, inline="always")
def _args(b, i, n, ne, ints, extra, n_extra):
    """The args object at b[i]: its integers into `ints`, its text or other values as extra rows:
    (end, ok, n_extra)."""
    aseen = 0
    i = _ws(b, i + 1, n)
    if i < n and b[i] == 125:
        return i + 1, True, n_extra
    while i < n:
        i, a, aseen, ok = _member(b, i, n, _ARG_KEYS, _ARG_OFF, aseen)
        if not ok:
            return i, False, n_extra
        if 0 <= a < 7:
            i, v, ok = _int_value(b, i, n)
            if not ok:
                return i, False, n_extra
            ints[CORR + a, ne] = v
        elif a >= 7:
            s = i
            i = _skip(b, i, n)
            n_extra = _put(extra, n_extra, ne, a - 7, s, i)
        else:
            i = _skip(b, i, n)
        i = _ws(b, i, n)
        if i < n and b[i] == 44:
            i = _ws(b, i + 1, n)
        else:
            return i + 1, True, n_extra  # (past the closing brace)
    return i, True, n_extra


@numba.njit(cache=True, inline="always")
def _other_args(b, i, n):
    """args that are no object at b[i]: nothing taken from a string, number or literal (an array, or
    a string escaped or not ASCII, is left to msgspec): (end, ok)."""
    c = b[i]
    if c == 91:
        return i, False
    if c == _QUOTE:
        i, esc, high = _string(b, i, n)
        return i, not (esc or high)
    return _skip(b, i, n), True


class _Skim(msgspec.Struct, gc=False):
    traceEvents: msgspec.Raw
    distributedInfo: Any = None


_SKIM = msgspec.json.Decoder(_Skim)
_RAW = msgspec.json.Decoder(msgspec.Raw)
_VALUES = msgspec.json.Decoder(list[Any])


class Scanned:
    """The columns of every event of one trace (see the constants above), and its distributedInfo."""

    def __init__(self, n, ints, codes, ts, dur, strings, values, info):
        self.n = n
        self.ints = ints
        self.codes = codes
        self.ts = ts
        self.dur = dur
        self.strings = strings  # the distinct category and name strings (codes index them)
        self.values = values  # field -> (events, their values as msgspec decodes them)
        self.info = info


def scan(text, bare: bool) -> Scanned | None:
    """The columns of the trace whose JSON text is `text` (bytes or a mapped file; `bare`: the
    bare-array form); None where the msgspec path must read it (or refuse it)."""
    try:
        if bare:
            raw = _RAW.decode(text)
            info: dict = {}
        else:
            doc = _SKIM.decode(text)
            raw = doc.traceEvents
            info = doc.distributedInfo if isinstance(doc.distributedInfo, dict) else {}
            del doc
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
    buf = np.frombuffer(raw, np.uint8)
    try:
        ok, n, ints, codes, ts, dur, extra, starts, ends = _scan(buf)
        if not ok:
            return None
        # the distinct strings (quotes included) and the texts left to msgspec, decoded by it in one go
        spans = [bytes(buf[s:e]) for s, e in zip(starts.tolist(), ends.tolist())]
        spans += [bytes(buf[s:e]) for s, e in extra[:, 2:].tolist()]
    finally:
        del buf, raw  # (no view of a mapped file may outlive it)
    try:
        decoded = _VALUES.decode(b"[" + b",".join(spans) + b"]")
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):  # invalid UTF-8, a lone surrogate
        return None
    strings = decoded[: len(starts)]
    if not all(type(s) is str for s in strings):
        return None
    if len(set(strings)) < len(strings):  # one string spelt with escapes and without: one code
        first: dict = {}
        lut = np.array([first.setdefault(s, len(first)) for s in strings], np.int32)
        strings = list(first)
        for col in (CAT, NAME):
            c = codes[col]
            codes[col] = np.where(c >= 0, lut[np.maximum(c, 0)], -1)
    values: dict[int, tuple[np.ndarray, list]] = {}
    rest = decoded[len(starts) :]
    for field in range(6):
        at = np.flatnonzero(extra[:, 1] == field)
        if len(at):
            values[field] = (extra[at, 0], [rest[j] for j in at.tolist()])
    for field, col, state in ((TS_TEXT, ts, TS_STATE), (DUR_TEXT, dur, DUR_STATE)):
        if field in values:
            rows, vals = values.pop(field)
            if not all(type(v) is float for v in vals):
                return None
            col[rows] = vals
            codes[state, rows] = 1
    return Scanned(n, ints, codes, ts, dur, strings, values, info)

"""A client for zeusd, Zeus's privileged daemon, so an unprivileged user can lock GPU clocks.

zeusd (github.com/ml-energy/zeus, `zeusd/`) serves HTTP over a unix socket; its GPU routes are
`POST /gpu/{index}/set_gpu_locked_clocks` `{min_clock_mhz, max_clock_mhz, block}`,
`POST /gpu/{index}/reset_gpu_locked_clocks` `{block}` and
`POST /gpu/{index}/set_power_limit` `{power_limit_mw, block}`; any status but 200 is a failure whose
body says why. The socket path comes from `ZEUSD_SOCK_PATH`, as in Zeus itself.

Plain `http.client` over an AF_UNIX socket: one small request per clock change, no extra dependency.
"""
from __future__ import annotations

import http.client
import json
import os
import socket

SOCK_ENV = "ZEUSD_SOCK_PATH"


class ZeusdError(RuntimeError):
    """zeusd refused a request or could not be reached."""


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("zeusd", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


class ZeusdClient:
    """Relays privileged NVML calls to zeusd. `gpu` is the NVML index zeusd sees (all GPUs)."""

    def __init__(self, sock_path: str, timeout: float = 5.0):
        self.sock_path = sock_path
        self.timeout = timeout

    @classmethod
    def from_env(cls) -> "ZeusdClient | None":
        path = os.environ.get(SOCK_ENV)
        return cls(path) if path else None

    def available(self) -> bool:
        return os.path.exists(self.sock_path)

    def _post(self, route: str, body: dict) -> None:
        conn = _UnixHTTPConnection(self.sock_path, self.timeout)
        try:
            conn.request("POST", route, body=json.dumps(body),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            text = resp.read().decode(errors="replace").strip()
        except OSError as e:
            raise ZeusdError(f"zeusd at {self.sock_path} ({SOCK_ENV}) unreachable: {e}") from e
        finally:
            conn.close()
        if resp.status != 200:
            raise ZeusdError(f"zeusd {route} answered {resp.status}: {text or resp.reason}")

    def set_gpu_locked_clocks(self, gpu: int, min_mhz: int, max_mhz: int, block: bool = True) -> None:
        self._post(f"/gpu/{gpu}/set_gpu_locked_clocks",
                   {"min_clock_mhz": int(min_mhz), "max_clock_mhz": int(max_mhz), "block": block})

    def reset_gpu_locked_clocks(self, gpu: int, block: bool = True) -> None:
        self._post(f"/gpu/{gpu}/reset_gpu_locked_clocks", {"block": block})

    def set_power_limit(self, gpu: int, milliwatts: int, block: bool = True) -> None:
        self._post(f"/gpu/{gpu}/set_power_limit", {"power_limit_mw": int(milliwatts), "block": block})

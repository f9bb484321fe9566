"""A stand-in for zeusd on a unix socket, following zeusd's real route table, with a FakeNVML behind it.

Routes, query fields and error bodies as in github.com/ml-energy/zeus at commit
75a8b9398034eb9baf74ca0a830c2c31bcce52cd (zeusd 0.5.0):
- zeusd/src/routes/gpu.rs: `POST /gpu/set_gpu_locked_clocks?gpu_ids&min_clock_mhz&max_clock_mhz&block`,
  `POST /gpu/reset_gpu_locked_clocks?gpu_ids&block`, `POST /gpu/set_power_limit?gpu_ids&power_limit_mw&block`
  (serde deny_unknown_fields: any other query field is a 400); a GPU index past the count is
  ZeusdError::GpuNotFoundError (400, "GPU index {i} does not exist."); per-GPU failures are
  aggregated as {"errors": {"<gpu>": "NVML error: <nvml-wrapper's text>"}} with the worst status
  (NoPermission 403, InvalidArg and NotSupported 400; zeusd/src/error.rs).
- zeusd/src/routes/server.rs: `GET /discover` -> {gpus: [{id, name, pci_address,
  cumulative_energy_available}], cpus, enabled_api_groups, auth_required}; `GET /auth/whoami`.
- zeusd/src/auth.rs: with a signing key every route but /discover and /time needs
  `Authorization: Bearer <token>` (401 {"error": ...} without or with a bad one, 403 for a missing
  scope); a disabled API group answers 404 {"error": "API group '<g>' is not enabled on this server."}.
`version="0.4"` answers /discover in 0.4's shape (gpu_ids, no gpus: zeus 0.16's client cannot read
it); `version="0.2"` serves only the old `/gpu/{i}/...` JSON routes (EMO's client before issue 33),
so /discover is an empty 404. `hang=True`: accept connections and never answer; `slow_s`: wait that
long before answering each change (POST).
"""

from __future__ import annotations

import json
import socketserver
import threading
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qsl, urlsplit

import nvml_fake

NVML_TEXT = {  # nvml-wrapper's Display of the NVML errors a clock request meets (its src/error.rs)
    nvml_fake._real.NVML_ERROR_NO_PERMISSION: (
        403,
        "the current user does not have permission to perform this operation",
    ),
    nvml_fake._real.NVML_ERROR_INVALID_ARGUMENT: (400, "a supplied argument was invalid"),
    nvml_fake._real.NVML_ERROR_NOT_SUPPORTED: (400, "the requested operation is not available on the target device"),
}
WRITE = {  # route -> its command fields besides gpu_ids and block
    "/gpu/set_gpu_locked_clocks": ("min_clock_mhz", "max_clock_mhz"),
    "/gpu/reset_gpu_locked_clocks": (),
    "/gpu/set_power_limit": ("power_limit_mw",),
}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        self.server.zeusd.conns.append(self.request)

    def log_message(self, *a):
        pass

    def address_string(self):
        return "unix"

    def _send(self, status: int, body=None) -> None:
        data = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        self.send_response(status)
        if body is not None and not isinstance(body, bytes):
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _auth(self, path: str) -> bool:
        z = self.server.zeusd
        group = "gpu-control" if path in WRITE else "gpu-read" if path.startswith("/gpu/") else None
        if group and group not in z.groups:
            self._send(404, {"error": f"API group '{group}' is not enabled on this server."})
            return False
        if z.token is None or path in ("/discover", "/time"):
            if z.token is None and path.startswith("/auth/"):
                self._send(404, {"error": "Authentication is not enabled on this server."})
                return False
            return True
        got = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
        if not self.headers.get("Authorization"):
            self._send(401, {"error": "Authentication required. Provide an Authorization: Bearer <token> header."})
            return False
        if got != z.token:
            self._send(401, {"error": "Invalid token: InvalidSignature"})
            return False
        if group and group not in z.scopes:
            self._send(
                403,
                {
                    "error": f"Token for user 'emo' lacks required scope '{group}'. Token scopes: "
                    f"[{', '.join(repr(s) for s in z.scopes)}]"
                },
            )
            return False
        return True

    def _route(self, method: str) -> None:
        z = self.server.zeusd
        if z.hang:
            z.hung.wait()
            return
        url = urlsplit(self.path)
        if method == "POST":
            time.sleep(z.slow_s)  # a daemon slow to answer each change
        query = dict(parse_qsl(url.query, keep_blank_values=True))
        z.requests.append((method, url.path, query))
        if z.version == "0.2":
            return self._send(404)
        if not self._auth(url.path):
            return
        if method == "GET" and url.path == "/discover":
            return self._send(200, z.discover())
        if method == "GET" and url.path == "/auth/whoami":
            return self._send(200, {"sub": "emo", "scopes": z.scopes})
        if method == "POST" and url.path in WRITE:
            return self._write(url.path, query)
        self._send(404)

    def _write(self, path: str, query: dict) -> None:
        z = self.server.zeusd
        fields = ("gpu_ids", *WRITE[path], "block")
        extra = sorted(set(query) - set(fields))
        missing = [f for f in fields if f not in query]
        if extra or missing:
            what = f"unknown field `{extra[0]}`" if extra else f"missing field `{missing[0]}`"
            return self._send(400, f"Query deserialize error: {what}".encode())
        try:
            ids = sorted({int(x) for x in query["gpu_ids"].split(",")})
        except ValueError:
            return self._send(400, {"error": f"Invalid GPU index: {query['gpu_ids']}"})
        for i in ids:
            if i >= z.nvml.gpus:
                return self._send(400, f"GPU index {i} does not exist.".encode())
        errors = {}
        for i in ids:
            h = z.nvml.nvmlDeviceGetHandleByIndex(i)
            try:
                if path == "/gpu/set_gpu_locked_clocks":
                    z.nvml.nvmlDeviceSetGpuLockedClocks(h, int(query["min_clock_mhz"]), int(query["max_clock_mhz"]))
                elif path == "/gpu/reset_gpu_locked_clocks":
                    z.nvml.nvmlDeviceResetGpuLockedClocks(h)
                else:
                    z.nvml.nvmlDeviceSetPowerManagementLimit(h, int(query["power_limit_mw"]))
            except nvml_fake._real.NVMLError as e:
                errors[i] = NVML_TEXT.get(e.value, (500, "an internal driver error occured"))
        if errors:
            status = max(s for s, _ in errors.values())
            return self._send(status, {"errors": {str(i): f"NVML error: {t}" for i, (_, t) in errors.items()}})
        self._send(200)

    def do_GET(self):
        self._route("GET")

    def do_POST(self):
        self._route("POST")


class FakeZeusd:
    """zeusd on `path`, run in a thread. `nvml` is the FakeNVML it drives (zeusd runs as root)."""

    def __init__(
        self,
        path: str,
        *,
        nvml: nvml_fake.FakeNVML | None = None,
        version: str = "0.5",
        token: str | None = None,
        scopes=("gpu-read", "gpu-control"),
        groups=("gpu-read", "gpu-control"),
        hang: bool = False,
        slow_s: float = 0.0,
    ):
        self.path, self.version, self.token, self.hang = str(path), version, token, hang
        self.slow_s = slow_s
        self.scopes, self.groups = list(scopes), list(groups)
        self.nvml = nvml or nvml_fake.FakeNVML(gpus=2)
        self.requests: list[tuple[str, str, dict]] = []
        self.hung = threading.Event()
        self.conns: list = []  # open connections, closed with the daemon (keep-alive would outlive it)
        self._server = socketserver.ThreadingUnixStreamServer(self.path, _Handler)
        self._server.daemon_threads = True
        self._server.zeusd = self
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def discover(self) -> dict:
        gpus = list(range(self.nvml.gpus))
        if self.version == "0.4":
            return {
                "gpu_ids": gpus,
                "cpu_ids": [],
                "dram_available": [],
                "enabled_api_groups": self.groups,
                "auth_required": self.token is not None,
            }
        return {
            "gpus": [
                {
                    "id": i,
                    "name": "NVIDIA A100-SXM4-40GB",
                    "pci_address": f"0000:0{i}:00.0",
                    "cumulative_energy_available": True,
                }
                for i in gpus
            ],
            "cpus": [],
            "enabled_api_groups": self.groups,
            "auth_required": self.token is not None,
        }

    def writes(self) -> list[tuple[str, dict]]:
        return [(p, q) for m, p, q in self.requests if m == "POST"]

    def close(self) -> None:
        self.hung.set()
        self._server.shutdown()
        self._server.server_close()
        for c in self.conns:
            try:
                c.shutdown(2)
            except OSError:
                pass

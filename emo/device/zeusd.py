"""zeusd, Zeus's privileged daemon, so that a user who is not root can lock GPU clocks.

Spoken through Zeus's own client (`zeus.utils.zeusd.ZeusdClient`, zeus>=0.16, the `zeusd` extra),
which follows zeusd 0.5's API (github.com/ml-energy/zeus, zeusd/src/routes/gpu.rs): `GET /discover`,
then `POST /gpu/set_gpu_locked_clocks?gpu_ids=0&min_clock_mhz=..&max_clock_mhz=..&block=true` (and
`reset_gpu_locked_clocks`, `set_power_limit`), a bearer token when the daemon asks for one, errors as
JSON `{"errors": {"<gpu>": "NVML error: ..."}}` or `{"error": "..."}`. The daemon is found by
`ZEUSD_SOCK_PATH` (unix socket) or `ZEUSD_HOST_PORT`, the token in `ZEUSD_TOKEN` or in the file named
by `ZEUSD_TOKEN_FILE`. Every call has a timeout (TIMEOUT_S), so a stuck daemon is an error, not a hang.

Every failure is a ZeusdError with a `cause` (see CAUSES) and a `reason` that says what to do.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from emo.errors import DeviceError

SOCK_ENV = "ZEUSD_SOCK_PATH"
HOST_ENV = "ZEUSD_HOST_PORT"
TOKEN_ENV = "ZEUSD_TOKEN"
TOKEN_FILE_ENV = "ZEUSD_TOKEN_FILE"
TIMEOUT_S = 5.0
NEEDS = "zeusd 0.5 (the API of zeus>=0.16's ZeusdClient)"

# What went wrong, in words a user can act on (GpuAccessError.cause uses the same words).
PERMISSION, UNREACHABLE, NOT_SUPPORTED, OUT_OF_RANGE, INCOMPATIBLE, OTHER = (
    "no permission",
    "zeusd unreachable",
    "not supported",
    "out of range",
    "incompatible zeusd",
    "error",
)
CAUSES = (PERMISSION, UNREACHABLE, NOT_SUPPORTED, OUT_OF_RANGE, INCOMPATIBLE, OTHER)


class ZeusdError(DeviceError):
    """zeusd refused a request or could not be reached: `cause` (one of CAUSES) and `reason`."""

    def __init__(self, reason: str, cause: str = OTHER):
        super().__init__(reason)
        self.reason, self.cause = reason, cause


def configured() -> bool:
    return bool(os.environ.get(SOCK_ENV) or os.environ.get(HOST_ENV))


def _token() -> str | None:
    path = os.environ.get(TOKEN_FILE_ENV)
    if path:
        try:
            with open(os.path.expanduser(path)) as f:
                mode = os.fstat(f.fileno()).st_mode & 0o777
                if mode & 0o077:  # as ssh refuses a private key others can read: the token sets any GPU's clocks
                    raise ZeusdError(
                        f"{TOKEN_FILE_ENV}={path}: the token file is open to others (mode {mode:04o}): "
                        f"`chmod 600 {path}`",
                        PERMISSION,
                    )
                return f.read().strip() or None
        except OSError as e:
            raise ZeusdError(f"{TOKEN_FILE_ENV}={path}: cannot read the token ({e.strerror})", PERMISSION) from e
    return os.environ.get(TOKEN_ENV) or None


def classify(text: str) -> str:
    """The cause of a zeusd error body (Zeus's client keeps the body, not the status)."""
    t = text.lower()
    if any(w in t for w in ("authentication", "token", "permission", "lacks required scope")):
        return PERMISSION
    if "not enabled on this server" in t or not t.strip() or "not found" in t and "gpu" not in t:
        return INCOMPATIBLE  # a route zeusd does not serve: empty 404 (an older API) or a disabled group
    if "not supported" in t or "not available" in t or "notsupported" in t:
        return NOT_SUPPORTED
    if "invalid" in t or "does not exist" in t or "out of range" in t:
        return OUT_OF_RANGE
    return OTHER


def _body(text: str) -> str:
    """zeusd's error body in words: {"errors": {"<gpu>": msg}} or {"error": msg}, else the text."""
    import json

    try:
        data = json.loads(text)
    except ValueError:
        return text.strip()
    if isinstance(data, dict) and isinstance(data.get("errors"), dict):
        return "; ".join(f"GPU {k}: {v}" for k, v in sorted(data["errors"].items()))
    if isinstance(data, dict) and "error" in data:
        return str(data["error"])
    return text.strip()


HINTS = {
    PERMISSION: f"give zeusd a token with the gpu-control scope ({TOKEN_ENV} or {TOKEN_FILE_ENV}), or run as root",
    UNREACHABLE: f"start zeusd, or fix/unset {SOCK_ENV}",
    NOT_SUPPORTED: "this GPU or driver cannot lock clocks (Volta or newer is needed)",
    OUT_OF_RANGE: "use a clock (and GPU index) the GPU supports (`emo gpu-config` lists them)",
    INCOMPATIBLE: f"EMO needs {NEEDS}; upgrade zeusd, and start it with the gpu-control API group",
    OTHER: "see zeusd's log",
}


@dataclass(frozen=True)
class _Config:
    """A ZeusdConfig whose HTTP client has a timeout on every call (Zeus's has httpx's default)."""

    endpoint: str
    uds: bool
    token: str | None
    timeout_s: float

    def zeus_config(self):
        from zeus.utils.zeusd import ZeusdConfig

        timeout = self.timeout_s

        class Timed(ZeusdConfig):
            def make_client(self):
                client = super().make_client()
                client.timeout = timeout  # httpx: connect, read, write and pool, each
                return client

        if self.uds:
            return Timed(socket_path=self.endpoint, token=self.token)
        return Timed(host_port=self.endpoint, token=self.token)


class ZeusdRelay:
    """Relays privileged NVML calls to zeusd. `gpu` is the NVML index zeusd sees (all GPUs)."""

    def __init__(self, endpoint: str, *, uds: bool = True, token: str | None = None, timeout_s: float = TIMEOUT_S):
        self.endpoint = endpoint
        self._config = _Config(endpoint, uds, token, timeout_s)
        self._client = None

    @classmethod
    def from_env(cls, timeout_s: float = TIMEOUT_S) -> ZeusdRelay | None:
        sock, host = os.environ.get(SOCK_ENV), os.environ.get(HOST_ENV)
        if not (sock or host):
            return None
        endpoint = sock or host
        assert endpoint is not None  # one of them is set (checked above)
        return cls(endpoint, uds=bool(sock), token=_token(), timeout_s=timeout_s)

    def _where(self) -> str:
        return f"zeusd at {self.endpoint} ({SOCK_ENV if self._config.uds else HOST_ENV})"

    def connect(self):
        """Discover the daemon and check it lets us control GPUs; raises ZeusdError in one line."""
        if self._client is not None:
            return self._client
        try:
            from zeus.utils import zeusd as z
        except ImportError as e:
            raise ZeusdError(
                f"{SOCK_ENV}/{HOST_ENV} is set but Zeus is not installed: pip install 'emo[zeusd]'", INCOMPATIBLE
            ) from e
        try:
            client = z.ZeusdClient(self._config.zeus_config())
        except z.ZeusdConnectionError as e:
            text = str(e).rstrip(": ")
            if "on /discover" in text:  # it answered, but not zeusd 0.5's discovery route
                raise ZeusdError(f"{self._where()} is not {NEEDS}: {text}", INCOMPATIBLE) from e
            raise ZeusdError(f"{self._where()} unreachable ({text}): {HINTS[UNREACHABLE]}", UNREACHABLE) from e
        except (KeyError, TypeError, ValueError) as e:  # /discover without 0.5's fields: zeusd 0.3 or 0.4
            raise ZeusdError(
                f"{self._where()} is older than {NEEDS} (its /discover lacks {e}): upgrade zeusd", INCOMPATIBLE
            ) from e
        try:
            z.require_capabilities(client, control_gpu=True)
        except z.ZeusdAuthError as e:
            raise ZeusdError(f"{self._where()}: {e}", PERMISSION) from e
        except z.ZeusdCapabilityError as e:
            cause = PERMISSION if "scope" in str(e) else INCOMPATIBLE
            raise ZeusdError(f"{self._where()}: {e}: {HINTS[cause]}", cause) from e
        self._client = client
        return client

    def _call(self, name: str, *args) -> None:
        import httpx
        from zeus.device.exception import ZeusdError as ZeusError

        client = self.connect()
        try:
            getattr(client, name)(*args)
        except httpx.HTTPError as e:  # the transport: refused, reset, timed out
            raise ZeusdError(
                f"{self._where()} unreachable ({type(e).__name__}: {e or 'timeout'}): {HINTS[UNREACHABLE]}", UNREACHABLE
            ) from e
        except ZeusError as e:
            text = _body(str(e).split(": ", 1)[-1])  # Zeus's client: "Failed to <op>: <body>"
            cause = classify(text)
            raise ZeusdError(f"zeusd refused ({text or 'HTTP 404, no such route'}): {HINTS[cause]}", cause) from e

    def set_gpu_locked_clocks(self, gpu: int, min_mhz: int, max_mhz: int, block: bool = True) -> None:
        self._call("set_gpu_locked_clocks", [int(gpu)], int(min_mhz), int(max_mhz), block)

    def reset_gpu_locked_clocks(self, gpu: int, block: bool = True) -> None:
        self._call("reset_gpu_locked_clocks", [int(gpu)], block)

    def set_power_limit(self, gpu: int, milliwatts: int, block: bool = True) -> None:
        self._call("set_power_limit", [int(gpu)], int(milliwatts), block)

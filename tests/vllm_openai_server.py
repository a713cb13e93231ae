"""vLLM's real OpenAI-compatible server for slow tests: start it on loopback, wait until it
serves, kill it (the whole process group, engine core included) and start it again on the
same port, and read which requests reached it.

    with VLLMServer(model_dir, served_name="smollm2", log_dir=tmp_path) as server:
        server.url              # "http://127.0.0.1:PORT/v1"
        server.kill()           # SIGKILL to the API server and its engine process
        server.start()          # the same port again; blocks until /v1/models lists the model
        server.requests()       # every chat request that reached it, across restarts

Requests are recorded by ``record_requests``, an ASGI middleware loaded into the server with
vLLM's own ``--middleware`` option: it appends the request body to a JSONL file on arrival and
the status once the answer is ready, so the record is the server's, not the client's. This
module imports only the standard library at the top: the server process imports it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REQUEST_LOG_ENV = "LABELRL_TEST_VLLM_REQUEST_LOG"
_counter = iter(range(1 << 62))
_write_lock = threading.Lock()


async def record_requests(request, call_next):
    """vLLM ``--middleware``: log each POST's body on arrival and its status when answered."""
    path = os.environ.get(REQUEST_LOG_ENV)
    if not path or request.method != "POST":
        return await call_next(request)
    key = f"{os.getpid()}-{next(_counter)}"
    body = await request.body()  # Starlette caches it, so the endpoint still reads it
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    _append(path, {"event": "arrived", "key": key, "path": request.url.path, "body": parsed, "time": time.time()})
    response = await call_next(request)
    _append(path, {"event": "answered", "key": key, "status": response.status_code, "time": time.time()})
    return response


def _append(path: str, record: dict) -> None:
    line = (json.dumps(record) + "\n").encode("utf-8")
    with _write_lock:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)  # one write per line: a kill never leaves half a record
        finally:
            os.close(fd)


@dataclass(frozen=True)
class ServedRequest:
    """One request the server received; ``status`` is None if it was never answered (the
    server died while generating it)."""

    key: str
    path: str
    body: dict
    status: int | None

    @property
    def user_text(self) -> str:
        return next(m["content"] for m in self.body["messages"] if m["role"] == "user")


def smollm2_dir() -> Path:
    """The HF directory labelrl converts the offline SmolLM2 GGUF into (built once, cached)."""
    from labelrl.models import load

    # load_model("smollm2-135m-instruct") reads this directory; no public function returns it.
    return load._smollm2_model_dir()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class VLLMServer:
    """``python -m vllm.entrypoints.openai.api_server`` on 127.0.0.1 (see the module docstring).

    The CPU engine runs in bf16 with eager execution, 2 GiB of KV cache and no prefix cache;
    ``--seed`` fixes sampling. Each start gets its own log file in ``log_dir``; a start that fails or times out
    raises with the log's tail.
    """

    def __init__(self, model_dir: Path, *, served_name: str, log_dir: Path, port: int | None = None,
                 max_model_len: int = 2048, ready_timeout_s: float = 420.0, extra_args: tuple[str, ...] = ()) -> None:
        self.model_dir = Path(model_dir)
        self.served_name = served_name
        self.log_dir = Path(log_dir)
        self.port = port or free_port()
        self.max_model_len = max_model_len
        self.ready_timeout_s = ready_timeout_s
        self.extra_args = extra_args
        self.request_log = self.log_dir / "vllm-requests.jsonl"
        self.proc: subprocess.Popen | None = None
        self.starts: list[float] = []  # seconds from launch to ready, one per start
        self._log_handle = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_dir),
                "--served-model-name", self.served_name, "--host", "127.0.0.1", "--port", str(self.port),
                "--dtype", "bfloat16", "--enforce-eager", "--max-model-len", str(self.max_model_len),
                "--seed", "0", "--disable-log-stats", "--uvicorn-log-level", "warning",
                # A cached prefix changes the shapes of a repeated prompt's products; in bf16 with
                # AMX that changes the rounding, and greedy replies to the same prompt diverged
                # after ~75 characters. Every request computes its whole prompt: equal requests,
                # equal bytes, across requests and across server restarts.
                "--no-enable-prefix-caching",
                "--middleware", f"{__name__}.record_requests", *self.extra_args]

    def env(self) -> dict[str, str]:
        here = str(Path(__file__).resolve().parent)
        return {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])),
                REQUEST_LOG_ENV: str(self.request_log), "PYTHONUNBUFFERED": "1"}

    def start(self) -> "VLLMServer":
        """Launch the server (in its own process group) and block until it serves the model."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"vLLM server on port {self.port} is already running (pid {self.proc.pid})")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"vllm-server-{len(self.starts) + 1}.log"
        self._log_handle = open(log_path, "wb")
        launched = time.monotonic()
        self.proc = subprocess.Popen(self.argv(), env=self.env(), stdout=self._log_handle, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            self._wait_ready(log_path)
        except BaseException:
            self.kill()
            raise
        self.starts.append(time.monotonic() - launched)
        return self

    def _wait_ready(self, log_path: Path) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited with code {self.proc.returncode} before serving; "
                                   f"log tail:\n{_tail(log_path)}")
            try:
                with urllib.request.urlopen(f"{self.url}/models", timeout=5) as response:
                    served = [m["id"] for m in json.loads(response.read())["data"]]
                if self.served_name in served:
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.5)
        raise TimeoutError(f"vLLM server not ready on port {self.port} after {self.ready_timeout_s:g} s; "
                           f"log tail:\n{_tail(log_path)}")

    def group_alive(self) -> list[int]:
        """Pids of the server's process group that are still running (zombies excluded)."""
        if self.proc is None:
            return []
        alive = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            state, pgrp = fields[0], int(fields[2])
            if pgrp == self.proc.pid and state != "Z":
                alive.append(int(entry.name))
        return alive

    def kill(self) -> None:
        """SIGKILL the whole process group (API server and engine core) and wait until it is gone."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        deadline = time.monotonic() + 30
        while self.group_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None
        left = self.group_alive()
        if left:
            raise RuntimeError(f"vLLM server processes {left} survived SIGKILL to their group")

    def requests(self) -> list[ServedRequest]:
        """Every POST the server received, in arrival order, with its status (None: unanswered)."""
        try:
            lines = [json.loads(line) for line in self.request_log.read_text(encoding="utf-8").splitlines() if line]
        except FileNotFoundError:
            return []
        status = {r["key"]: r["status"] for r in lines if r["event"] == "answered"}
        return [ServedRequest(r["key"], r["path"], r["body"], status.get(r["key"]))
                for r in lines if r["event"] == "arrived"]

    def __enter__(self) -> "VLLMServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.kill()


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(Path(path).read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"

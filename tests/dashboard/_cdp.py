"""A small Chrome DevTools Protocol client: headless Chromium driven over one websocket.

    with Browser.launch(tmp_path) as browser:
        page = browser.page()
        page.navigate(url)
        page.evaluate("document.title")
        page.screenshot(path)

Only what the dashboard tests need. The browser picks its own debugging port
(--remote-debugging-port=0) and writes it to DevToolsActivePort in its profile directory, so no
port is guessed.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def find_chromium() -> str | None:
    """$SARA_CHROMIUM, else the first Chromium-like browser on PATH."""
    explicit = os.environ.get("SARA_CHROMIUM")
    if explicit:
        return explicit
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str,
               poll_s: float = 0.05) -> Any:
    """Call ``predicate`` until it returns something truthy; raise after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(poll_s)


class CdpError(RuntimeError):
    pass


class Page:
    """One page target, over its own websocket."""

    def __init__(self, ws_url: str) -> None:
        from websockets.sync.client import connect

        self._stack = contextlib.ExitStack()
        self.ws = self._stack.enter_context(connect(ws_url, max_size=None, open_timeout=10))
        self._next_id = 0
        self.events: list[dict] = []

    def close(self) -> None:
        self._stack.close()

    def send(self, method: str, timeout_s: float = 15.0, **params: Any) -> dict:
        self._next_id += 1
        call_id = self._next_id
        self.ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no answer to {method} within {timeout_s} s")
            message = json.loads(self.ws.recv(timeout=remaining))
            if message.get("id") == call_id:
                if "error" in message:
                    raise CdpError(f"{method}: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)

    def navigate(self, url: str, timeout_s: float = 15.0) -> None:
        self.send("Page.enable")
        self.send("Runtime.enable")
        self.send("Log.enable")
        self.send("Page.navigate", url=url)
        wait_until(lambda: self.evaluate("document.readyState") == "complete", timeout_s,
                   f"{url} to load")

    def evaluate(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression (await-ed if it is a promise)."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise CdpError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def errors(self) -> list[str]:
        """Uncaught exceptions, console errors and browser log errors seen so far."""
        out = []
        for e in self.events:
            method, params = e["method"], e.get("params", {})
            if method == "Runtime.exceptionThrown":
                out.append(json.dumps(params.get("exceptionDetails", {}))[:500])
            elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
                out.append(json.dumps(params.get("args", []))[:500])
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                out.append(params["entry"].get("text", "")[:500])
        return out

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.send("Page.getLayoutMetrics")["cssContentSize"]
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": size["width"],
                                "height": size["height"], "scale": 1})
        data = self.send("Page.captureScreenshot", **params)["data"]
        path.write_bytes(base64.b64decode(data))
        return path


class Browser:
    """A headless Chromium process with a fresh profile under ``workdir``."""

    def __init__(self, proc: subprocess.Popen, profile: Path, port: int, log_path: Path) -> None:
        self.proc, self.profile, self.port, self.log_path = proc, profile, port, log_path
        self.pages: list[Page] = []

    @classmethod
    def launch(cls, workdir: Path, executable: str | None = None,
               window: tuple[int, int] = (1400, 1000), timeout_s: float = 20.0) -> Browser:
        exe = executable or find_chromium()
        if exe is None:
            raise FileNotFoundError("no chromium on PATH (set SARA_CHROMIUM)")
        profile = workdir / "chromium-profile"
        profile.mkdir(parents=True, exist_ok=True)
        log_path = workdir / "chromium.log"
        args = [exe, "--headless", "--no-sandbox", "--disable-gpu",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run", "--no-default-browser-check",
                "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
                f"--user-data-dir={profile}", "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0", f"--window-size={window[0]},{window[1]}",
                "about:blank"]
        log = log_path.open("wb")
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        log.close()
        active = profile / "DevToolsActivePort"

        def port_file() -> int | None:
            if proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {proc.returncode}: "
                                   f"{log_path.read_text(errors='replace')[-2000:]}")
            lines = active.read_text().split() if active.exists() else []
            return int(lines[0]) if lines and lines[0].isdigit() else None

        try:
            port = wait_until(port_file, timeout_s, "chromium's DevToolsActivePort")
        except BaseException:
            proc.kill()
            proc.wait(10)
            raise
        return cls(proc, profile, port, log_path)

    def page(self) -> Page:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=10) as r:
            targets = json.load(r)
        target = next(t for t in targets if t.get("type") == "page")
        page = Page(target["webSocketDebuggerUrl"])
        self.pages.append(page)
        return page

    def close(self) -> None:
        for page in self.pages:
            try:
                page.close()
            except Exception:
                pass
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

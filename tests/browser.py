"""Headless Chromium for tests: open a page, record what a user's browser would complain about,
query the DOM and take a screenshot, over the Chrome DevTools protocol.

Chromium (the Debian package) is started with its own fresh profile and no network services;
`--remote-debugging-port=0` makes it pick a free port, which it writes to DevToolsActivePort in
the profile. One websocket (websocket-client) carries the browser session; the page is a target
attached in flat mode, so its commands and events share that socket.

Recorded as problems: console messages of level error or assert, uncaught exceptions, log
entries of level error (failed loads among them), failed network loads, and any request to
something other than the page's own file or a data: URL (the report must need no network).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

START_TIMEOUT_S = 30.0
COMMAND_TIMEOUT_S = 60.0
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    """The browser's path: $DNNSCALE_CHROMIUM, else the first of CHROMIUM_NAMES on PATH."""
    given = os.environ.get("DNNSCALE_CHROMIUM")
    if given:
        return given if shutil.which(given) else None
    return next((path for path in map(shutil.which, CHROMIUM_NAMES) if path), None)


@dataclass
class PageReport:
    """What happened while a page loaded."""

    problems: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    console: list[str] = field(default_factory=list)


class Browser:
    """`with Browser() as b: report = b.open(path); b.evaluate("...")`."""

    def __init__(self, width: int = 1200, height: int = 900) -> None:
        self.width, self.height = width, height
        self._next_id = 0
        self._events: list[dict[str, Any]] = []

    def __enter__(self) -> "Browser":
        import websocket

        binary = find_chromium()
        if binary is None:
            raise RuntimeError("no chromium on PATH")
        self._profile = tempfile.mkdtemp(prefix="dnnscale-chromium-")
        self._process = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-background-networking", "--disable-component-update", "--no-first-run",
             "--disable-extensions", "--disable-sync", "--hide-scrollbars", "--mute-audio",
             f"--user-data-dir={self._profile}", "--remote-debugging-port=0",
             f"--window-size={self.width},{self.height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            port, path = self._devtools_address()
            self._socket = websocket.create_connection(f"ws://127.0.0.1:{port}{path}",
                                                       timeout=COMMAND_TIMEOUT_S,
                                                       suppress_origin=True)
            target = self._call("Target.createTarget", {"url": "about:blank"})["targetId"]
            self._session = self._call("Target.attachToTarget",
                                       {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                self._call(f"{domain}.enable", session=True)
            self._call("Emulation.setDeviceMetricsOverride",
                       {"width": self.width, "height": self.height, "deviceScaleFactor": 1,
                        "mobile": False}, session=True)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        sock = getattr(self, "_socket", None)
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=10)
        shutil.rmtree(self._profile, ignore_errors=True)

    def _devtools_address(self) -> tuple[str, str]:
        marker = Path(self._profile) / "DevToolsActivePort"
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"chromium exited with {self._process.returncode}")
            if marker.exists():
                lines = marker.read_text().split()
                if len(lines) >= 2:
                    return lines[0], lines[1]
            time.sleep(0.05)
        raise RuntimeError("chromium did not open its DevTools port")

    def _call(self, method: str, params: dict[str, Any] | None = None,
              session: bool = False) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self._session
        self._socket.send(json.dumps(message))
        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        while time.monotonic() < deadline:
            reply = json.loads(self._socket.recv())
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self._events.append(reply)
        raise TimeoutError(method)

    def _wait_for(self, event: str, timeout_s: float = COMMAND_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(e.get("method") == event for e in self._events):
            if time.monotonic() > deadline:
                raise TimeoutError(event)
            reply = json.loads(self._socket.recv())
            if "method" in reply:
                self._events.append(reply)

    def open(self, path: Path) -> PageReport:
        """Load the file and return its problems, requests and console lines."""
        url = path.resolve().as_uri()
        self._events.clear()
        self._call("Page.navigate", {"url": url}, session=True)
        self._wait_for("Page.loadEventFired")
        self.evaluate("new Promise(r => requestAnimationFrame(() => setTimeout(r, 100)))",
                      await_promise=True)
        report = PageReport()
        for event in self._events:
            method, params = event["method"], event.get("params", {})
            if method == "Runtime.consoleAPICalled":
                text = " ".join(str(arg.get("value", arg.get("description", "")))
                                for arg in params.get("args", []))
                report.console.append(f"{params.get('type')}: {text}")
                if params.get("type") in ("error", "assert"):
                    report.problems.append(f"console.{params['type']}: {text}")
            elif method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                report.problems.append(f"exception: {details.get('text')} "
                                       f"{details.get('exception', {}).get('description', '')}")
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                entry = params["entry"]
                report.problems.append(f"log: {entry.get('text')} {entry.get('url', '')}")
            elif method == "Network.loadingFailed":
                report.problems.append(f"load failed: {params.get('errorText')}")
            elif method == "Network.requestWillBeSent":
                request_url = params.get("request", {}).get("url", "")
                report.requests.append(request_url)
                if request_url != url and not request_url.startswith("data:"):
                    report.problems.append(f"request beyond the page: {request_url}")
        return report

    def evaluate(self, expression: str, await_promise: bool = False) -> Any:
        """The JSON value of a JavaScript expression in the page."""
        result = self._call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                 "awaitPromise": await_promise}, session=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails'].get('text')}")
        return result.get("result", {}).get("value")

    def screenshot(self, full_page: bool = True) -> bytes:
        """A PNG of the page (all of it when `full_page`)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            height = int(self.evaluate("document.documentElement.scrollHeight"))
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": self.width, "height": height,
                                "scale": 1})
        data = self._call("Page.captureScreenshot", params, session=True)["data"]
        return base64.b64decode(data)


def picture_stats(png: bytes) -> tuple[int, int, float]:
    """(width, height, fraction of pixels darker than the page's white) of a PNG."""
    import io

    from PIL import Image

    image = Image.open(io.BytesIO(png))
    width, height = image.size
    histogram = image.convert("L").histogram()  # 256 counts of grey levels
    return width, height, sum(histogram[:235]) / max(1, width * height)

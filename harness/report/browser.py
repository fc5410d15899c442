"""Open a report in headless Chromium and ask the page questions: for tests and benchmarks.

A minimal client of the Chrome DevTools Protocol over ``--remote-debugging-pipe`` (JSON
messages separated by NUL bytes on file descriptors 3 and 4), so that no WebSocket library and
no network port are needed. It records every script error the page raises (uncaught
exceptions, ``console.error``, error log entries), evaluates expressions in the page, and takes
screenshots. Standard library only; :func:`find_chromium` says whether a browser is installed.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.plain import JsonObject

__all__ = ["Chromium", "find_chromium", "BrowserError"]

_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class BrowserError(RuntimeError):
    """The browser did not answer, or answered a command with an error."""


def find_chromium() -> str | None:
    """The path of an installed Chromium (``$CHROMIUM`` first), or ``None``."""
    explicit = os.environ.get("CHROMIUM")
    if explicit and shutil.which(explicit):
        return shutil.which(explicit)
    return next((shutil.which(name) for name in _CANDIDATES if shutil.which(name)), None)


class Chromium:
    """One headless browser with one page. Use as a context manager."""

    def __init__(self, executable: str | None = None, *, width: int = 1400, height: int = 1000,
                 timeout: float = 120.0) -> None:
        found = executable or find_chromium()
        if found is None:
            raise BrowserError("no chromium executable found")
        self.executable: str = found
        self.width, self.height, self.timeout = width, height, timeout
        self.errors: list[str] = []  # script errors the page raised, as text
        self._next_id = 0
        self._buffer = b""
        self._events: list[JsonObject] = []
        self._session: str | None = None
        self._log_tail = ""

    # -- process -------------------------------------------------------------------------------
    def __enter__(self) -> "Chromium":
        try:
            return self._start()
        except BrowserError:  # a browser that dies while starting on a loaded machine: once more
            return self._start()

    def _start(self) -> "Chromium":
        self._next_id, self._buffer, self._events, self._session = 0, b"", [], None
        self._profile = tempfile.mkdtemp(prefix="gh-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        args = [self.executable, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
                "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio", "--remote-debugging-pipe",
                f"--user-data-dir={self._profile}", f"--window-size={self.width},{self.height}", "about:blank"]

        def wire_pipes() -> None:
            # In the child: the protocol wants fds 3 (commands in) and 4 (answers out). Copies
            # first, so that neither end is overwritten when the pipes already sit on 3 or 4.
            commands, answers = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(commands, 3)
            os.dup2(answers, 4)

        # close_fds=False: the fds that wire_pipes makes must survive into the browser (Python's
        # own fds are close-on-exec anyway).
        self._log = open(Path(self._profile) / "stderr.log", "wb")  # noqa: SIM115 - closed in __exit__
        self._process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=self._log, preexec_fn=wire_pipes, close_fds=False)
        os.close(to_browser_r)
        os.close(from_browser_w)
        try:
            target = self.send("Target.createTarget", url="about:blank")["targetId"]
        except (BrowserError, OSError) as error:
            self.__exit__()
            raise BrowserError(f"chromium did not start: {error}; its log ends: {self._log_tail}") from None
        self._session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable")
        self.send("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height,
                  deviceScaleFactor=1, mobile=False)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._session = None
            self.send("Browser.close", timeout=10)
        except (BrowserError, OSError):
            pass
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        self._log.close()
        self._log_tail = (Path(self._profile) / "stderr.log").read_text(errors="replace")[-1500:]
        shutil.rmtree(self._profile, ignore_errors=True)

    # -- protocol ------------------------------------------------------------------------------
    def _read_message(self, deadline: float) -> JsonObject:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError("chromium did not answer in time")
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if ready:
                chunk = os.read(self._from_browser, 1 << 20)
                if not chunk:
                    raise BrowserError("chromium closed the debugging pipe")
                self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def _note(self, message: JsonObject) -> None:
        method, params = message.get("method"), message.get("params") or {}
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails") or {}
            description = (details.get("exception") or {}).get("description") or details.get("text")
            self.errors.append(f"uncaught: {description}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.errors.append("console.error: " + " ".join(str(a.get("value", a.get("description")))
                                                             for a in params.get("args") or []))
        elif method == "Log.entryAdded" and (params.get("entry") or {}).get("level") == "error":
            entry = params["entry"]
            self.errors.append(f"log ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}".strip())
        self._events.append(message)

    def send(self, method: str, timeout: float | None = None, **params: object) -> JsonObject:
        """Send one command and wait for its answer (events meanwhile are recorded)."""
        self._next_id += 1
        message: JsonObject = {"id": self._next_id, "method": method, "params": params}
        if self._session and not method.startswith(("Target.", "Browser.")):
            message["sessionId"] = self._session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            answer = self._read_message(deadline)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise BrowserError(f"{method}: {answer['error'].get('message')}")
                return answer.get("result") or {}
            self._note(answer)

    def wait_for(self, method: str, timeout: float | None = None) -> JsonObject:
        """Wait for (or find already recorded) an event such as ``Page.loadEventFired``."""
        for i, event in enumerate(self._events):
            if event.get("method") == method:
                return self._events.pop(i)
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            message = self._read_message(deadline)
            if message.get("method") == method:
                self._note(message)
                self._events.remove(message)
                return message
            self._note(message)

    # -- page ----------------------------------------------------------------------------------
    def open(self, path_or_url: str | Path) -> float:
        """Load a page and wait for its load event; returns the seconds it took."""
        url = str(path_or_url)
        if "://" not in url:
            url = Path(url).resolve().as_uri()
        self._events = [e for e in self._events if e.get("method") != "Page.loadEventFired"]
        started = time.monotonic()
        self.send("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired")
        return time.monotonic() - started

    def evaluate(self, expression: str) -> Any:  # a JSON value: the expression, the caller's, decides its shape
        """The value of a JavaScript expression in the page (promises are awaited)."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise BrowserError(f"evaluate: {(details.get('exception') or {}).get('description') or details.get('text')}")
        return (result.get("result") or {}).get("value")

    def screenshot(self, path: str | Path, *, full_page: bool = False) -> Path:
        """A PNG of the viewport (or of the whole page, up to 10,000 px tall)."""
        params: JsonObject = {"format": "png"}
        if full_page:
            height = min(10_000, int(self.evaluate("document.documentElement.scrollHeight") or self.height))
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": self.width, "height": height, "scale": 1})
        data = self.send("Page.captureScreenshot", **params)["data"]
        path = Path(path)
        path.write_bytes(base64.b64decode(data))
        return path

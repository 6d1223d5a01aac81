"""Headless Chromium over the DevTools pipe: open a page, evaluate JavaScript, take screenshots.

The viewer's tests and its benchmark drive a real browser with this; the
README's screenshot is made with it too. Standard library only: Chromium
speaks the DevTools protocol over file descriptors 3 (commands in) and 4
(replies out) with ``--remote-debugging-pipe``, each message a JSON object
ended by a NUL byte, so no websocket client or browser download is needed.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

# The flags a locked-down machine needs: no sandbox (root in a container), no GPU, and nothing
# that reaches the network (component updates, sync, QUIC, first-run pages).
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio")
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class BrowserError(RuntimeError):
    """The browser died, timed out, or a page's JavaScript threw."""


def find_chromium() -> str | None:
    """Path of a Chromium/Chrome executable (``FAE_VIEW_CHROMIUM`` first), or None."""
    env = os.environ.get("FAE_VIEW_CHROMIUM")
    if env:
        return env if Path(env).is_file() else None
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def _high_fds(*fds: int) -> list[int]:
    """The same pipe ends moved to descriptors >= 10, so moving them onto 3 and 4 in the child clobbers nothing."""
    import fcntl

    out = []
    for fd in fds:
        out.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10))
        os.close(fd)
    return out


class Chromium:
    """One headless browser with one page; use as a context manager.

    >>> with Chromium() as b:                                   # doctest: +SKIP
    ...     b.open("file:///tmp/site/index.html")
    ...     b.evaluate("document.title")
    """

    def __init__(self, executable: str | None = None, width: int = 1280, height: int = 900,
                 timeout: float = 60.0):
        self.executable = executable or find_chromium()
        if not self.executable:
            raise BrowserError("no Chromium found (install the `chromium` package or set FAE_VIEW_CHROMIUM)")
        self.width, self.height, self.timeout = width, height, timeout
        self._next_id = 0
        self._buffer = b""
        self._events: list[dict] = []
        self._profile = tempfile.mkdtemp(prefix="fae-view-chromium-")
        to_browser_r, self._to_browser = _high_fds(*os.pipe())
        self._from_browser, from_browser_w = _high_fds(*os.pipe())
        # Chromium reads fd 3 and writes fd 4: posix_spawn moves the pipe ends there.
        cmd = [self.executable, *CHROMIUM_FLAGS, "--remote-debugging-pipe",
               f"--user-data-dir={self._profile}", f"--window-size={width},{height}", "about:blank"]
        devnull = os.devnull
        self.pid = os.posix_spawn(self.executable, cmd, dict(os.environ), setsid=True, file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, devnull, os.O_WRONLY, 0),
            (os.POSIX_SPAWN_OPEN, 2, devnull, os.O_WRONLY, 0),
            (os.POSIX_SPAWN_DUP2, to_browser_r, 3),
            (os.POSIX_SPAWN_DUP2, from_browser_w, 4),
        ])
        self.returncode: int | None = None
        os.close(to_browser_r)
        os.close(from_browser_w)
        try:
            target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            self.send("Page.enable", session=True)
            self.send("Runtime.enable", session=True)
            self.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                             "deviceScaleFactor": 1, "mobile": False}, session=True)
        except BaseException:
            self.close()
            raise

    # -- protocol ------------------------------------------------------------
    def send(self, method: str, params: dict | None = None, *, session: bool = False,
             timeout: float | None = None) -> dict:
        """Send one command and wait for its reply (events that arrive meanwhile are kept)."""
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result", {})
            if "method" in reply:
                self._events.append(reply)

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"no reply from Chromium within {self.timeout:.0f} s")
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if ready:
                chunk = os.read(self._from_browser, 1 << 20)
                if not chunk:
                    raise BrowserError(f"Chromium exited (code {self.poll()})")
                self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def page_errors(self) -> list[str]:
        """Uncaught JavaScript exceptions of the page so far (read from the events received)."""
        return [((ev["params"].get("exceptionDetails") or {}).get("exception") or {}).get("description")
                or ev["params"]["exceptionDetails"].get("text", "?")
                for ev in self._events if ev.get("method") == "Runtime.exceptionThrown"]

    def wait_event(self, method: str, timeout: float | None = None) -> dict:
        """The first event named ``method`` (taken off the queue; others stay queued), waiting up to ``timeout``
        seconds (the browser's own when None); :class:`BrowserError` when none comes or Chromium exits."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            for k, ev in enumerate(self._events):
                if ev.get("method") == method:
                    return self._events.pop(k)
            self._events.append(self._read(deadline))

    # -- page ----------------------------------------------------------------
    def open(self, url: str) -> None:
        """Navigate and wait for the load event (earlier events, page errors included, are dropped)."""
        self._events.clear()
        reply = self.send("Page.navigate", {"url": url}, session=True)
        if reply.get("errorText"):
            raise BrowserError(f"cannot open {url}: {reply['errorText']}")
        self.wait_event("Page.loadEventFired")

    def evaluate(self, expression: str, timeout: float | None = None) -> Any:
        """The value of a JavaScript expression (a Promise is awaited); a thrown error is a BrowserError."""
        reply = self.send("Runtime.evaluate", {"expression": expression, "awaitPromise": True,
                                               "returnByValue": True}, session=True, timeout=timeout)
        if "exceptionDetails" in reply:
            details = reply["exceptionDetails"]
            text = (details.get("exception") or {}).get("description") or details.get("text")
            raise BrowserError(f"JavaScript error: {text}")
        return reply["result"].get("value")

    def wait_for(self, condition: str, timeout: float | None = None) -> Any:
        """Poll a JavaScript expression until it is truthy; its value."""
        limit = timeout or self.timeout
        js = ("new Promise((ok, fail) => { const t0 = performance.now(); (function poll() {"
              f" let v; try {{ v = ({condition}); }} catch (e) {{ v = undefined; }}"
              f" if (v) ok(v); else if (performance.now() - t0 > {1000 * limit}) fail(new Error("
              f"{json.dumps('timed out waiting for ' + condition)})); else setTimeout(poll, 10); }})(); }})")
        return self.evaluate(js, timeout=limit + 5)

    def screenshot(self, path: str | os.PathLike, full_page: bool = True) -> Path:
        """A PNG of the page (the whole scrollable page when ``full_page``)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": max(size[0], self.width),
                                "height": max(size[1], 1), "scale": 1})
        data = self.send("Page.captureScreenshot", params, session=True)["data"]
        path = Path(path)
        path.write_bytes(base64.b64decode(data))
        return path

    # -- lifetime ------------------------------------------------------------
    def cpu_seconds(self) -> float:
        """CPU time (user + system) used so far by the browser's processes (its session): the work a
        step costs, which a busy machine does not inflate the way it inflates wall time."""
        tick, total = os.sysconf("SC_CLK_TCK"), 0
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == self.pid:  # session id; utime and stime follow
                total += int(fields[11]) + int(fields[12])
        return total / tick

    def poll(self) -> int | None:
        """The browser's exit status, or None while it runs."""
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def close(self) -> None:
        """Ask the browser to quit; kill its process group if it does not within 10 s."""
        if self.poll() is None:
            try:
                os.write(self._to_browser, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
            except OSError:
                pass
            deadline = time.monotonic() + 10
            while self.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if self.poll() is None:
                os.killpg(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
                self.returncode = -signal.SIGKILL
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

"""A real ``kerman serve`` process on 127.0.0.1 and an SSE reader for the web tests."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import httpx

HERE = Path(__file__).parent
DEADLINE = 30.0


class Server:
    """``python -m kerman serve STORE ...`` in a child process; ``url`` once it listens."""

    def __init__(self, store: str, *args: str, env: Optional[dict] = None) -> None:
        full_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]), **(env or {})}
        full_env.pop("KERMAN_TOKEN", None) if "KERMAN_TOKEN" not in (env or {}) else None
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kerman", "serve", store, "--port", "0", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=full_env,
        )
        self.stderr: list[str] = []
        lines: queue.Queue = queue.Queue()

        def pump() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.stderr.append(line)
                lines.put(line)
            lines.put(None)

        self._pump = threading.Thread(target=pump, daemon=True)
        self._pump.start()
        while True:
            line = lines.get(timeout=DEADLINE)
            if line is None:
                raise AssertionError(f"kerman serve exited ({self.proc.wait()}): {''.join(self.stderr)}")
            if "serving" in line and "http://" in line:
                self.url = line.split("http://", 1)[1].strip().rstrip("/")
                self.url = "http://" + self.url
                break

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=DEADLINE, **kwargs)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("kerman serve did not stop on SIGTERM") from None
        finally:
            self._pump.join(DEADLINE)
            if self.proc.stderr is not None:
                self.proc.stderr.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Stream:
    """One SSE connection: ``next()`` gives (id, data) of each event in order, skipping comments
    (heartbeats are counted in ``comments``)."""

    def __init__(self, client: httpx.Client, path: str, last_event_id: Optional[str] = None, **headers: str) -> None:
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        self._cm = client.stream("GET", path, headers=headers)
        self.response = self._cm.__enter__()
        self.comments = 0
        self._lines: Iterator[str] = self.response.iter_lines()

    def next(self) -> Optional[tuple[Optional[str], str]]:
        """The next event, or ``None`` when the stream ended."""
        event_id: Optional[str] = None
        data: list[str] = []
        for line in self._lines:
            if line == "":
                if data:
                    return event_id, "\n".join(data)
                continue
            if line.startswith(":"):
                self.comments += 1
            elif line.startswith("id:"):
                event_id = line[3:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" ") if line[5:6] == " " else line[5:])
        return None

    def until(self, predicate: Any, limit: float = DEADLINE) -> list[tuple[Optional[str], Any]]:
        """Events up to and including the first whose parsed data satisfies ``predicate``."""
        seen = []
        end = time.monotonic() + limit
        while time.monotonic() < end:
            item = self.next()
            if item is None:
                raise AssertionError(f"the stream ended before the expected event; got {seen[-5:]}")
            parsed = json.loads(item[1]) if item[1] != "[DONE]" else item[1]
            seen.append((item[0], parsed))
            if predicate(parsed):
                return seen
        raise AssertionError("no expected event in time")

    def close(self) -> None:
        self._cm.__exit__(None, None, None)


def run_finished(data: Any) -> bool:
    return isinstance(data, dict) and data.get("type") in ("RUN_FINISHED", "RUN_ERROR")


def vercel_finished(data: Any) -> bool:
    return isinstance(data, dict) and data.get("type") in ("finish", "abort")


def kerman_turn_end(data: Any) -> bool:
    return isinstance(data, dict) and data.get("type") == "turn/end"

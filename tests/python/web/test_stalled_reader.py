"""A client that stops reading an SSE stream of a large session: the server holds a bounded part
of the backlog for it (its writes wait for the client), not a copy of the whole replay, and gives
it up after ``send_timeout``. The app runs in this process on uvicorn (with kerman serve's
protocol class), so the server side of each connection can be inspected: the bytes its transport
buffers and whether its writes are paused."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

import kerman

pytest.importorskip("starlette")
uvicorn = pytest.importorskip("uvicorn")

from kerman.web import create_app  # noqa: E402
from kerman.web._limits import guarded_protocol  # noqa: E402

DEADLINE = 30.0
EVENTS = 250
BLOB = 40_000  # bytes of text per event: a 10 MB session


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("big")
    log = kerman.FileStore(root).create("big")
    for i in range(EVENTS):
        log.append("test/blob", {"i": i, "text": "x" * BLOB})
    log.close()
    return root


class InProcess:
    """create_app(...) on uvicorn in a thread of this process."""

    def __init__(self, root, **options) -> None:
        app = create_app(kerman.FileStore(root), kerman.models.EchoModel, **options)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(app, lifespan="on", log_level="warning", http=guarded_protocol(10.0, 100))
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started, "the server to start")

    def connections(self) -> list:
        return list(self.server.server_state.connections)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(DEADLINE)
        self.sock.close()


def wait_until(condition, what: str, limit: float = DEADLINE):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.02)  # polling a condition with a bound
    raise AssertionError(f"timed out waiting for {what}")


def stalled_reader(port: int) -> socket.socket:
    """Asks for the session's stream and reads nothing (a small receive buffer, as a stalled
    browser tab's is full)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"GET /sessions/big/events?protocol=kerman HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    return sock


def dechunk(raw: bytes) -> bytes:
    """The body of a chunked HTTP/1.1 response (headers included in ``raw``), as far as it came."""
    rest = raw.split(b"\r\n\r\n", 1)[1]
    body = []
    while b"\r\n" in rest:
        size_line, rest = rest.split(b"\r\n", 1)
        size = int(size_line.split(b";")[0], 16)
        if size == 0 or len(rest) < size + 2:
            break
        body.append(rest[:size])
        rest = rest[size + 2 :]
    return b"".join(body)


def seqs_read(sock: socket.socket) -> list:
    """Reads the stream until the last event came; the seqs of its events, in order."""
    sock.settimeout(DEADLINE)
    parts, total = [], 0
    while True:
        chunk = sock.recv(1 << 20)
        assert chunk, "the stream ended early"
        parts.append(chunk)
        total += len(chunk)
        if total >= EVENTS * BLOB:
            lines = dechunk(b"".join(parts)).split(b"\n")
            seqs = [json.loads(line.split(b":", 1)[1])["seq"] for line in lines if line.startswith(b"data:")]
            if seqs and seqs[-1] == EVENTS - 1:
                return seqs


def paused(server: InProcess) -> list:
    return [c for c in server.connections() if c.flow is not None and c.flow.write_paused]


def test_a_stalled_reader_holds_a_bounded_part_of_the_backlog(store):
    server = InProcess(store)
    try:
        readers = [stalled_reader(server.port) for _ in range(3)]
        try:
            stuck = wait_until(lambda: len(paused(server)) == 3 and paused(server), "every stream to wait for its reader")
            held = [c.transport.get_write_buffer_size() for c in stuck]
            assert max(held) < 512 * 1024, held  # the session is 10 MB

            # the reader that resumes gets everything, in order, once
            assert seqs_read(readers[0]) == list(range(EVENTS))
        finally:
            for sock in readers:
                sock.close()
    finally:
        server.stop()


def test_a_reader_that_takes_nothing_is_given_up(store):
    server = InProcess(store, send_timeout=0.3)
    try:
        reader = stalled_reader(server.port)
        try:
            wait_until(lambda: paused(server), "the stream to wait for its reader")
            wait_until(lambda: not server.connections(), "the server to give the reader up")
        finally:
            reader.close()
    finally:
        server.stop()

"""Figures for docs/web.md ("Tests and figures"): what stalled and idle clients cost a real
``kerman serve`` process. Not a test (nothing asserted); run by hand:

    python tests/python/web/measure_serve.py [--megabytes 44] [--stalled 20] [--idle 1100]

1. A session of about ``--megabytes`` MB; ``--stalled`` clients ask for its replay and read
   nothing. Prints the server's resident memory before and once every stream waits for its
   reader (or after 20 s).
2. ``--idle`` connections that send half a request line and stop. Prints how many the server
   holds (its open sockets) right after, and 15 s later.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import kerman


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def sockets(pid: int) -> int:
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return count


def usual_limit() -> None:
    """The server starts with the usual soft descriptor limit, 1024 (this process raised its own)."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


def serve(root: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "kerman", "serve", root, "--model", "kerman.models:EchoModel", "--port", "0"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        preexec_fn=usual_limit,
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()
    return proc, int(line.rsplit(":", 1)[1].strip().rstrip("/"))


def stalled(megabytes: int, clients: int) -> None:
    with tempfile.TemporaryDirectory() as root:
        log = kerman.FileStore(root).create("big")
        blob = 40_000
        for i in range(megabytes * 1_000_000 // blob):
            log.append("test/blob", {"i": i, "text": "x" * blob})
        log.close()
        proc, port = serve(root)
        try:
            readers = []
            warm = socket.create_connection(("127.0.0.1", port))  # the feed built once, read whole by one client
            warm.sendall(b"GET /sessions/big/events?protocol=kerman HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            warm.settimeout(60)
            got = 0
            while got < megabytes * 1_000_000:
                got += len(warm.recv(1 << 20))
            warm.close()
            before = rss_mb(proc.pid)
            for _ in range(clients):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.connect(("127.0.0.1", port))
                sock.sendall(b"GET /sessions/big/events?protocol=kerman HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                readers.append(sock)
            peak, end = before, time.monotonic() + 20
            while time.monotonic() < end:
                peak = max(peak, rss_mb(proc.pid))
                time.sleep(0.2)
            print(
                f"stalled: session {megabytes} MB, {clients} readers: server RSS {before:.0f} MB before, "
                f"{peak:.0f} MB with them (+{peak - before:.0f} MB, {(peak - before) / clients:.1f} MB each)"
            )
            for sock in readers:
                sock.close()
        finally:
            proc.terminate()
            proc.wait(30)


def idle(count: int) -> None:
    with tempfile.TemporaryDirectory() as root:
        proc, port = serve(root)
        try:
            held = []
            refused = 0
            for _ in range(count):
                try:
                    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
                    sock.sendall(b"GET /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
                    held.append(sock)
                except OSError:
                    refused += 1
            time.sleep(1.0)
            now = sockets(proc.pid)
            time.sleep(14.0)
            later = sockets(proc.pid)
            code = f"import httpx; print(httpx.get('http://127.0.0.1:{port}/sessions', timeout=10).status_code)"
            probe = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
            print(
                f"idle: {count} half-sent requests ({refused} failed to connect): the server holds {now} sockets after 1 s, "
                f"{later} after 15 s; a real client then gets {probe.stdout.strip() or probe.stderr.strip()[-80:]}"
            )
            for sock in held:
                sock.close()
        finally:
            proc.terminate()
            proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=int, default=44)
    parser.add_argument("--stalled", type=int, default=20)
    parser.add_argument("--idle", type=int, default=1100)
    args = parser.parse_args()
    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    stalled(args.megabytes, args.stalled)
    idle(args.idle)


if __name__ == "__main__":
    main()

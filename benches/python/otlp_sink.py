"""A loopback OTLP/HTTP traces sink for the benchmarks: answers every POST with 200 over kept-alive
HTTP/1.1 connections and counts the bodies and bytes, in a process of its own (its CPU is not the
measured process's). Prints its URL on the first line of stdout, then serves until stdin closes.

    python3 benches/python/otlp_sink.py
"""

from __future__ import annotations

import contextlib
import http.server
import os
import subprocess
import sys
import threading
from typing import Any, Iterator


class Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    bodies = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        Sink.bodies += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def main() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"http://127.0.0.1:{server.server_address[1]}/v1/traces", flush=True)
    sys.stdin.read()  # until the parent closes it
    server.shutdown()


@contextlib.contextmanager
def serving() -> Iterator[str]:
    """This sink started in a process of its own, for a benchmark; yields its URL, and stops it
    on exit."""
    process = subprocess.Popen([sys.executable, os.path.abspath(__file__)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        yield process.stdout.readline().strip()
    finally:
        assert process.stdin is not None
        process.stdin.close()
        process.wait(10)


if __name__ == "__main__":
    main()

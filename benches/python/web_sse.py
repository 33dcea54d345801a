"""Issue 16's speed figures: one session, 100 concurrent SSE followers of ``kerman serve``.

For each protocol measured: the latency from a chunk being made (by the model, inside the
server) to it arriving at each client (p50/p99 over every chunk and client), and the server
process's CPU time per log event of the measured turn, as a ratio to a bare ``log.tail()`` in
the same run (a child process running the same model in an AgentLoop with as many in-process
``tail()`` consumers, no projection and no HTTP).

    python3 benches/python/web_sse.py [--clients 100] [--events 300] [--pace-ms 5]

Clients and server share the machine (2 cores here): the clients' own parsing competes with
the server, so the latency includes some client-side queueing. Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
TICK = os.sysconf("SC_CLK_TCK")


def pct(xs: list, p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p * (len(s) - 1))))] if s else float("nan")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def stamps(text: str) -> list:
    return [int(w) for w in text.split()]


_STAMPS = {
    "agui": re.compile(rb'"type":"TEXT_MESSAGE_CONTENT","timestamp":[0-9]+,"messageId":"msg-[0-9]+","delta":"([0-9 ]+)"'),
    "kerman": re.compile(rb'"chunk":[{]"type":"text-delta","text":"([0-9 ]+)"[}]'),
}
_ENDS = {"agui": (b'"type":"RUN_FINISHED"', b'"type":"RUN_ERROR"'), "kerman": (b'"type":"turn/end"',)}


async def follower(port: int, path: str, turns: int, latencies: list, connected: list, protocol: str) -> None:
    """One SSE client. A minimal reader on purpose: with httpx's streaming API, 100 clients in
    one process added tens of milliseconds of their own scheduling to every sample (p50 57-89 ms
    against 6-8 ms with this reader, with the server 13% busy), and it is the server that is
    measured here."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n".encode())
    await writer.drain()
    connected.append(1)
    pending = b""
    finished = 0
    stamps_re, ends = _STAMPS[protocol], _ENDS[protocol]
    try:
        while finished < turns:
            data = await reader.read(1 << 16)
            if not data:
                raise RuntimeError("the stream ended early")
            now = time.time_ns()
            frames, _, pending = (pending + data).rpartition(b"\n")  # whole lines only
            for match in stamps_re.finditer(frames):
                latencies.extend(now - int(t) for t in match.group(1).split())
            finished += sum(frames.count(end) for end in ends)
    finally:
        writer.close()


async def over_http(args: argparse.Namespace, protocol: str, root: str) -> dict:
    import httpx

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    server = subprocess.Popen(
        [sys.executable, "-m", "kerman", "serve", root, "--model", "web_bench_model:factory", "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert server.stderr is not None
        line = server.stderr.readline()
        url = "http://" + line.split("http://", 1)[1].strip().rstrip("/")
        limits = httpx.Limits(max_connections=args.clients + 10, max_keepalive_connections=args.clients + 10)
        async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
            session = (await client.post("/sessions", json={})).json()["id"]
            warm: list = []
            latencies: list = []
            connected: list = []
            port = int(url.rsplit(":", 1)[1])
            # each follower reads the warm-up turn and the measured one
            tasks = [
                asyncio.create_task(follower(port, f"/sessions/{session}/events?protocol={protocol}", 2, latencies, connected, protocol))
                for _ in range(args.clients)
            ]
            while len(connected) < args.clients:
                await asyncio.sleep(0.01)
            await client.post(f"/sessions/{session}/messages", json={"text": "stream 20 1"})
            deadline = time.monotonic() + 60
            while len(latencies) < 20 * args.clients:  # the warm-up turn reached everyone
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the warm-up turn reached the clients {len(latencies)} times, not {20 * args.clients}")
                await asyncio.sleep(0.01)
            warm, latencies[:] = list(latencies), []
            info = (await client.get(f"/sessions/{session}")).json()
            before_events = info["events"]
            cpu0 = cpu_seconds(server.pid)
            mine0, wall0 = time.process_time(), time.monotonic()
            await client.post(f"/sessions/{session}/messages", json={"text": f"stream {args.events} {args.pace_ms}"})
            await asyncio.wait_for(asyncio.gather(*tasks), 300)
            cpu1 = cpu_seconds(server.pid)
            mine1, wall1 = time.process_time(), time.monotonic()
            events = (await client.get(f"/sessions/{session}")).json()["events"] - before_events
    finally:
        server.terminate()
        server.wait(30)
    return {
        "protocol": protocol,
        "clients": args.clients,
        "events": events,
        "chunks": args.events,
        "p50_ms": pct(latencies, 0.5) / 1e6,
        "p99_ms": pct(latencies, 0.99) / 1e6,
        "cpu_per_event_ms": (cpu1 - cpu0) * 1000 / events,
        "samples": len(latencies),
        "warmup_samples": len(warm),
        "server_busy": (cpu1 - cpu0) / (wall1 - wall0),
        "clients_busy": (mine1 - mine0) / (wall1 - wall0),
    }


async def bare_tail(clients: int, events: int, pace_ms: float) -> None:
    """The child: the same model in an AgentLoop, ``clients`` in-process ``log.tail()`` consumers."""
    import kerman
    from web_bench_model import model

    with tempfile.TemporaryDirectory() as root:
        log = kerman.FileStore(root).create("bench")
        loop = kerman.AgentLoop(model, log=log)
        latencies: list = []

        async def consume(start: int) -> None:
            async for event in log.tail(start=start):
                if event.type == "assistant/chunk" and event.data["chunk"]["type"] == "text-delta":
                    now = time.time_ns()
                    latencies.extend(now - t for t in stamps(event.data["chunk"]["text"]))
                elif event.type == "turn/end":
                    return

        loop.followup("stream 20 1")
        await loop.when_idle()
        start = len(log)
        tasks = [asyncio.create_task(consume(start)) for _ in range(clients)]
        await asyncio.sleep(0)
        cpu0 = time.process_time()
        loop.followup(f"stream {events} {pace_ms}")
        await loop.when_idle()
        await asyncio.gather(*tasks)
        cpu1 = time.process_time()
        n = len(log) - start
        await loop.aclose()
    print(
        json.dumps(
            {
                "protocol": "log.tail()",
                "clients": clients,
                "events": n,
                "p50_ms": pct(latencies, 0.5) / 1e6,
                "p99_ms": pct(latencies, 0.99) / 1e6,
                "cpu_per_event_ms": (cpu1 - cpu0) * 1000 / n,
                "samples": len(latencies),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--events", type=int, default=300, help="chunks in the measured turn")
    parser.add_argument("--pace-ms", type=float, default=5.0, help="milliseconds between chunks")
    parser.add_argument("--protocols", default="agui,kerman")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        asyncio.run(bare_tail(args.clients, args.events, args.pace_ms))
        return
    child = subprocess.run(
        [sys.executable, __file__, "--child", "--clients", str(args.clients), "--events", str(args.events), "--pace-ms", str(args.pace_ms)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])},
    )
    if child.returncode:
        sys.exit(f"the log.tail() baseline failed: {child.stderr}")
    base = json.loads(child.stdout.strip().splitlines()[-1])
    rows = [base]
    with tempfile.TemporaryDirectory() as root:
        for protocol in args.protocols.split(","):
            rows.append(asyncio.run(over_http(args, protocol, os.path.join(root, protocol))))
    print(f"\n## web: one session, {args.clients} concurrent followers, {args.events} chunks {args.pace_ms:g} ms apart\n")
    print("| stream | p50 ms | p99 ms | server CPU / event | vs bare log.tail() | server busy | clients busy |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        ratio = row["cpu_per_event_ms"] / base["cpu_per_event_ms"]
        busy = f"{row['server_busy']:.0%} | {row['clients_busy']:.0%}" if "server_busy" in row else "(one process) | "
        print(
            f"| {row['protocol']} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | {row['cpu_per_event_ms']:.3f} ms | {ratio:.1f}x | {busy} |"
        )
    print(json.dumps({"web_sse": rows}))


if __name__ == "__main__":
    main()

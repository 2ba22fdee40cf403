"""``prescaler admit`` under load: checks per second on one core, and the latency it adds
through NGINX.

    .venv/bin/python benchmarks/admission.py [--seconds 10] [--rate 1000]

1. **Checks per second.** The check server (the same aiohttp application and handler as
   ``prescaler admit``, over a policy at ``critical`` held in memory; the ConfigMap watch
   is left out, as it is off the check's path) runs in its own process pinned to core 0;
   a closed-loop client on core 1 keeps 64 keep-alive connections busy with checks of
   every answer (shed, admitted, too long) for ``--seconds``.
2. **Latency added through NGINX.** NGINX configured as ``docs/degradation.md`` shows, in
   front of a static engine (an NGINX ``return 200``, so the engine adds no noise of its
   own), against the same NGINX without the check; an open-loop client sends
   ``--rate`` requests per second (interactive, admitted) for ``--seconds`` to each and
   prints p50 and p99 of both, and their difference.

The machine's other load shows in the numbers: run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from cluster import procs  # noqa: E402
from cluster.gateways import Gateway, doc_block  # noqa: E402

POOL = "bench/chat"
CHECKS = (
    b"GET /check HTTP/1.1\r\nHost: a\r\nx-prescaler-pool: bench/chat\r\n"
    b"x-priority-lane: batch\r\n\r\n",
    b"GET /check HTTP/1.1\r\nHost: a\r\nx-prescaler-pool: bench/chat\r\n"
    b"x-priority-lane: interactive\r\nx-context-tokens: 900\r\n\r\n",
    b"GET /check HTTP/1.1\r\nHost: a\r\nx-prescaler-pool: bench/chat\r\n"
    b"x-priority-lane: interactive\r\nx-context-tokens: 9000\r\n\r\n",
)


def serve(port: int) -> None:
    """The check server over a static critical policy (``--serve``)."""
    from aiohttp import web

    from prescaler.admission import CONFIG_MAP_KEYS, Routes
    from prescaler.admission.server import Admission, AdmissionMetrics, Policies, application
    from prescaler.kube import Listed

    data = dict.fromkeys(CONFIG_MAP_KEYS, "")
    data.update(contract="prescaler.io/degradation/v1", pool="chat", level="critical",
                retryAfterSeconds="37", maxContextTokens="4096", shedLanes="batch")  # fmt: skip
    meta = {"namespace": "bench", "name": "chat-degradation",
            "labels": {"prescaler.io/pool": "chat"}}  # fmt: skip
    policies = Policies(("bench",))
    policies.deliver("bench", Listed(({"metadata": meta, "data": data},), False))
    app = application(Admission(policies, Routes.parse([]), AdmissionMetrics()))
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None, backlog=1024)


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> int:
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    if length:
        await reader.readexactly(length)
    return status


async def closed_loop(
    port: int, seconds: float, connections: int = 64
) -> tuple[int, dict[int, int]]:
    """Checks answered in ``seconds`` by ``connections`` clients, each sending the next
    check when the last is answered; and the answers' statuses."""
    statuses: dict[int, int] = {}
    done = 0
    end = time.perf_counter() + seconds

    async def client(i: int) -> None:
        nonlocal done
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        n = i
        while time.perf_counter() < end:
            status = await _exchange(reader, writer, CHECKS[n % len(CHECKS)])
            statuses[status] = statuses.get(status, 0) + 1
            done += 1
            n += 1
        writer.close()
        await writer.wait_closed()

    await asyncio.gather(*(client(i) for i in range(connections)))
    return done, statuses


async def open_loop(port: int, rate: float, seconds: float) -> list[float]:
    """Latencies (seconds) of ``rate`` requests a second for ``seconds``, each sent on
    time whatever the others do, over a pool of keep-alive connections."""
    body = b'{"prompt": "hello", "max_tokens": 16}'
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        b"x-priority-lane: interactive\r\nx-context-tokens: 900\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    for _ in range(32):
        idle.append(await asyncio.open_connection("127.0.0.1", port))
    latencies: list[float] = []
    failures = 0

    async def one() -> None:
        nonlocal failures
        conn = idle.pop() if idle else await asyncio.open_connection("127.0.0.1", port)
        started = time.perf_counter()
        status = await _exchange(*conn, request)
        latencies.append(time.perf_counter() - started)
        failures += status != 200
        idle.append(conn)

    tasks = []
    start = time.perf_counter()
    total = int(rate * seconds)
    for i in range(total):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one()))
    await asyncio.gather(*tasks)
    for _, writer in idle:
        writer.close()
    if failures:
        raise RuntimeError(f"{failures} of {total} requests were not answered 200")
    return latencies


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[round(q * 1000) - 1]


ENGINE_SERVER = """
server {{
    listen 127.0.0.1:{port};
    location / {{
        return 200 '{{"id": "cmpl-static", "choices": [{{"text": " "}}]}}';
    }}
}}
"""
WITHOUT_CHECK = """
upstream llama_chat {
    server llama-chat.llm.svc:8000;
}

server {
    listen 8080;

    location /v1/ {
        proxy_pass http://llama_chat;
    }
}
# the baseline names the check's address too (unused): prescaler-admission.prescaler.svc:8081
# and its pool: llm/llama-chat
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return 0
    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="admission-bench-") as tmp:
        work = Path(tmp)
        port = procs.free_port()
        pin = ["taskset", "-c", "0"] if cores > 1 else []
        server = subprocess.Popen([*pin, sys.executable, __file__, "--serve", str(port)])
        try:
            if cores > 1:
                os.sched_setaffinity(0, {1})
            procs.wait_for("the check server", lambda: _up(port), 30)
            asyncio.run(closed_loop(port, 1.0))  # warm-up
            done, statuses = asyncio.run(closed_loop(port, args.seconds))
            per_second = done / args.seconds
            print(json.dumps({"checks_per_second_one_core": round(per_second),
                              "statuses": statuses}))  # fmt: skip

            results = {}
            for name, block in (("without check", WITHOUT_CHECK), ("with check", None)):
                engine_port = procs.free_port()
                engine_block = ENGINE_SERVER.format(port=engine_port)
                server_block = block if block is not None else doc_block("nginx")
                gateway = Gateway.nginx(
                    work / name.replace(" ", "-"),
                    admit_port=port,
                    engine_port=engine_port,
                    pool=POOL,
                    server=server_block + engine_block,
                    tie_to_parent=True,
                )
                try:
                    asyncio.run(open_loop(gateway.port, args.rate, 1.0))  # warm-up
                    lat = asyncio.run(open_loop(gateway.port, args.rate, args.seconds))
                finally:
                    gateway.stop()
                results[name] = {"p50_ms": quantile(lat, 0.5) * 1e3,
                                 "p99_ms": quantile(lat, 0.99) * 1e3, "n": len(lat)}  # fmt: skip
            base, check = results["without check"], results["with check"]
            added = {k: round(check[k] - base[k], 3) for k in ("p50_ms", "p99_ms")}
            print(json.dumps({"rate": args.rate, "seconds": args.seconds,
                              "without_check": {k: round(v, 3) for k, v in base.items()},
                              "with_check": {k: round(v, 3) for k, v in check.items()},
                              "added": added}))  # fmt: skip
        finally:
            server.terminate()
            server.wait(10)
    return 0


def _up(port: int) -> bool:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
        return bool(r.status == 200)


if __name__ == "__main__":
    raise SystemExit(main())

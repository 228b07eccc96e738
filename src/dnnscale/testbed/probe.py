"""Measuring programs that `testbed check` runs inside the hosts (``python -m dnnscale.testbed.probe``).

Standard library only (numpy for `cpu`), so they start fast even under a small CPU quota.

- ``serve --bind ADDR``: prints its port, then answers connections (each in its own thread, so
  several hosts can send to it at once). A connection's first byte says what it wants: ``P``
  ping-pong (echo fixed-size messages until the peer closes), ``S`` sink (an 8-byte length, then
  that many bytes; answers with one JSON line: the bytes, the size of the first read, the
  monotonic clock at the end of the first read and at the last byte, and (clock, bytes so far)
  samples every 5 ms).
- ``send --to ADDR[,ADDR…] --port P[,P…] --bytes N [--ping-count K] [--start-at T]``: K round
  trips with the first target (if K > 0), then N bytes to each target at once (from monotonic
  time T, so that flows from several processes start together); prints JSON with the RTTs (s),
  each sink's answer and the aggregate rate.
- ``cpu --seconds T``: prints ``ready``, waits for a line on stdin, then multiplies 256×256
  fp32 matrices on one thread for T seconds; prints JSON with the CPU share (CPU seconds per
  wall second) and the achieved FLOP/s.
- ``burst --gaps G,G,… --chunk-s C --rounds K``: prints ``ready``, waits for a line on stdin,
  then K times per gap sleeps the gap and times a chunk of matmuls worth C CPU seconds; prints
  JSON with each chunk's wall and CPU seconds (testbed/fidelity.py reads it).

Rates are TCP payload bytes per second from the first read's end to the last byte; several flows
are combined over the window in which all of them ran (`aggregate_rate`; the clock is
CLOCK_MONOTONIC, the same in every namespace, so flows measured by different processes combine).
They are about 4-5 % below a tbf's rate, which counts the headers too.
"""

from __future__ import annotations

import argparse
import bisect
import json
import socket
import struct
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

_PING_SIZE = 64
_CHUNK = 1 << 20
_SAMPLE_S = 0.005
_BUFFER_BYTES = 8 << 20


def _recv_exact(conn: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        part = conn.recv(size - len(data))
        if not part:
            raise ConnectionError("peer closed")
        data += part
    return bytes(data)


def _sink(conn: socket.socket) -> None:
    (total,) = struct.unpack("!Q", _recv_exact(conn, 8))
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    received, first_bytes = 0, 0
    t_first = t_last = 0.0
    samples: list[tuple[float, int]] = []  # (clock, bytes so far), every >= _SAMPLE_S
    while received < total:
        n = conn.recv_into(view, min(_CHUNK, total - received))
        if n == 0:
            break
        received += n
        t_last = time.monotonic()
        if first_bytes == 0:
            first_bytes, t_first = n, t_last
        if not samples or t_last - samples[-1][0] >= _SAMPLE_S or received == total:
            samples.append((t_last, received))
    reply = {"bytes": received, "first_bytes": first_bytes, "t_first": t_first, "t_last": t_last,
             "samples": samples}
    conn.sendall((json.dumps(reply) + "\n").encode())


def _bytes_at(flow: dict[str, Any], clock: float) -> float:
    """Bytes a flow had received at `clock`, interpolated between its samples."""
    samples = flow["samples"]
    times = [t for t, _ in samples]
    i = bisect.bisect_left(times, clock)
    if i == 0:
        return float(samples[0][1])
    if i == len(samples):
        return float(samples[-1][1])
    (t0, b0), (t1, b1) = samples[i - 1], samples[i]
    return b0 + (b1 - b0) * (clock - t0) / (t1 - t0) if t1 > t0 else float(b1)


def aggregate_rate(flows: Sequence[dict[str, Any]]) -> float | None:
    """Rate of several flows together, bytes/s.

    Over the window in which every flow was receiving, [latest first read, earliest last byte],
    when it covers at least half of the whole span (flows that start or end at different times
    would otherwise count their lone head and tail); else, and for one flow, the payload after
    each flow's first read over the whole span.
    """
    start, end = max(f["t_first"] for f in flows), min(f["t_last"] for f in flows)
    span = max(f["t_last"] for f in flows) - min(f["t_first"] for f in flows)
    if len(flows) > 1 and end - start >= 0.5 * span and all(f.get("samples") for f in flows):
        return sum(_bytes_at(f, end) - _bytes_at(f, start) for f in flows) / (end - start)
    payload = sum(f["bytes"] - f["first_bytes"] for f in flows)
    return payload / span if span > 0 and payload > 0 else None


def _echo(conn: socket.socket) -> None:
    while True:
        try:
            message = _recv_exact(conn, _PING_SIZE)
        except ConnectionError:
            return
        conn.sendall(message)


def _handle(conn: socket.socket, timeout_s: float) -> None:
    with conn:
        conn.settimeout(timeout_s)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            mode = _recv_exact(conn, 1)
            if mode == b"S":
                _sink(conn)
            elif mode == b"P":
                _echo(conn)
        except OSError:  # the peer went away: nothing to answer
            return


def _big_buffers(sock: socket.socket) -> None:
    """8 MiB socket buffers where allowed (root: *BUFFORCE), so that a probe process that is
    descheduled for a while (a busy machine) does not leave the link idle; else the default."""
    for option, fallback in (("SO_SNDBUFFORCE", 32), ("SO_RCVBUFFORCE", 33)):
        try:
            sock.setsockopt(socket.SOL_SOCKET, getattr(socket, option, fallback), _BUFFER_BYTES)
        except OSError:
            return


def serve(bind: str, max_seconds: float) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    _big_buffers(listener)  # before listen: accepted sockets inherit it, window scaling fits it
    listener.bind((bind, 0))
    listener.listen(64)
    listener.settimeout(1.0)
    print(listener.getsockname()[1], flush=True)
    deadline = time.monotonic() + max_seconds
    while time.monotonic() < deadline:
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            continue
        threading.Thread(target=_handle, args=(conn, max_seconds), daemon=True).start()


def _connect(to: str, port: int, mode: bytes) -> socket.socket:
    conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    _big_buffers(conn)
    conn.settimeout(60)
    conn.connect((to, port))
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.sendall(mode)
    return conn


def ping(to: str, port: int, count: int, warmup: int = 5) -> dict[str, object]:
    message = b"x" * _PING_SIZE
    rtts = []
    with _connect(to, port, b"P") as conn:
        for i in range(count + warmup):
            start = time.perf_counter()
            conn.sendall(message)
            _recv_exact(conn, _PING_SIZE)
            if i >= warmup:
                rtts.append(time.perf_counter() - start)
    return {"rtts_s": rtts}


def _send_all(conn: socket.socket, total: int, replies: list[dict[str, float]]) -> None:
    chunk = memoryview(bytes(_CHUNK))
    with conn:
        sent = 0
        while sent < total:
            n = min(_CHUNK, total - sent)
            conn.sendall(chunk[:n])
            sent += n
        replies.append(json.loads(conn.makefile().readline()))


def send(targets: Sequence[tuple[str, int]], total: int, ping_count: int = 0,
         start_at: float | None = None) -> dict[str, object]:
    """Optionally ping-pong with the first target, then send `total` bytes to every target at
    once, starting at monotonic time `start_at` if given (so flows of several processes start
    together)."""
    result: dict[str, object] = ping(*targets[0], ping_count) if ping_count > 0 else {}
    conns = []
    for to, port in targets:
        conn = _connect(to, port, b"S")
        conn.sendall(struct.pack("!Q", total))
        conns.append(conn)
    if start_at is not None:
        time.sleep(max(0.0, start_at - time.monotonic()))
    replies: list[dict[str, float]] = []
    threads = [threading.Thread(target=_send_all, args=(conn, total, replies)) for conn in conns]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if len(replies) != len(targets):
        raise ConnectionError(f"{len(targets) - len(replies)} of {len(targets)} flows failed")
    result["flows"] = replies
    result["rate_bytes_per_s"] = aggregate_rate(replies)
    return result


def cpu(seconds: float, size: int = 256) -> dict[str, object]:
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.random((size, size), dtype=np.float32)
    b = rng.random((size, size), dtype=np.float32)
    a @ b  # warm up
    print("ready", flush=True)
    sys.stdin.readline()
    calls = 0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - wall0 < seconds:
        a @ b
        calls += 1
    wall, cpu_s = time.perf_counter() - wall0, time.process_time() - cpu0
    return {"cpu_share": cpu_s / wall, "matmul_flops_per_s": 2.0 * size**3 * calls / wall,
            "wall_s": wall, "calls": calls}


def burst(gaps: Sequence[float], chunk_s: float, rounds: int, size: int = 256) -> dict[str, object]:
    """Compute after idle gaps: sleep `gap`, then run a fixed chunk of matmuls worth `chunk_s`
    of CPU time; each gap `rounds` times (gaps interleaved). Prints ``ready`` once the chunk is
    sized, waits for a line on stdin, then measures; returns each chunk's wall and CPU seconds.

    The chunk is sized by CPU time (process_time), which a CFS quota does not stretch, so the
    wall time over CPU time of a chunk is how much slower than a free core the host ran it.
    """
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.random((size, size), dtype=np.float32)
    b = rng.random((size, size), dtype=np.float32)
    a @ b
    cpu0 = time.process_time()
    probe_calls = 0
    while time.process_time() - cpu0 < 0.05:
        a @ b
        probe_calls += 1
    per_call_s = (time.process_time() - cpu0) / probe_calls
    calls = max(1, round(chunk_s / per_call_s))
    print("ready", flush=True)
    sys.stdin.readline()
    samples = []
    for _ in range(rounds):
        for gap in gaps:
            time.sleep(gap)
            wall0, cpu0 = time.perf_counter(), time.process_time()
            for _ in range(calls):
                a @ b
            samples.append({"gap_s": gap, "wall_s": time.perf_counter() - wall0,
                            "cpu_s": time.process_time() - cpu0})
    return {"calls": calls, "samples": samples}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dnnscale.testbed.probe")
    sub = parser.add_subparsers(dest="what", required=True)
    p_serve = sub.add_parser("serve")
    p_serve.add_argument("--bind", required=True)
    p_serve.add_argument("--max-seconds", type=float, default=600.0)
    p_ping = sub.add_parser("ping")
    p_ping.add_argument("--to", required=True)
    p_ping.add_argument("--port", type=int, required=True)
    p_ping.add_argument("--count", type=int, default=50)
    p_send = sub.add_parser("send")
    p_send.add_argument("--to", required=True, help="address[,address...]")
    p_send.add_argument("--port", required=True, help="port[,port...]")
    p_send.add_argument("--bytes", type=int, required=True)
    p_send.add_argument("--ping-count", type=int, default=0)
    p_send.add_argument("--start-at", type=float, default=None,
                        help="monotonic clock time at which to start sending")
    p_cpu = sub.add_parser("cpu")
    p_cpu.add_argument("--seconds", type=float, default=2.0)
    p_burst = sub.add_parser("burst")
    p_burst.add_argument("--gaps", default="0,0.01,0.05,0.2,0.5", help="idle gaps, seconds")
    p_burst.add_argument("--chunk-s", type=float, default=0.05, help="CPU seconds per chunk")
    p_burst.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.what == "serve":
        serve(args.bind, args.max_seconds)
        return
    if args.what == "ping":
        result = ping(args.to, args.port, args.count)
    elif args.what == "send":
        targets = list(zip(args.to.split(","), (int(p) for p in args.port.split(","))))
        result = send(targets, args.bytes, args.ping_count, args.start_at)
    elif args.what == "burst":
        result = burst([float(g) for g in args.gaps.split(",")], args.chunk_s, args.rounds)
    else:
        result = cpu(args.seconds)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

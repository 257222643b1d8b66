"""What runs in kv_bench.py's child processes (``kv_bench.py --child NAME``): the raw
ZeroMQ echo server and its clients, and the mixrt and MXNet 1.9.1 dist_sync workers, each
answering the parent's lines (READY, then ``run K`` -> TIMES, then ``quit`` -> RESULT with
the pulled values' check). The MXNet worker runs in MXNet's own interpreter (NumPy < 1.24),
so this module imports only the standard library at its top: zmq, NumPy, mixrt and mxnet
are imported by the function that needs them.
"""

from __future__ import annotations

import json
import signal
import sys
import time

from _kv_processes import BenchError

KEY = "w"
LR = 0.01


def parts_of(total: int, servers: int) -> list[tuple[int, int]]:
    """(offset, count) per server: contiguous equal parts, as the store lays out a big key
    (kvstore/dist/worker.py, DistStore._layout)."""
    step = -(-total // servers)
    return [(s * step, min(step, total - s * step)) for s in range(servers)
            if s * step < total]


def child_echo_server(args) -> int:
    import zmq  # noqa: PLC0415
    context = zmq.Context()
    sock = context.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    print(f"PORT {port}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:  # [identity, header, payload] straight back, the payload not copied
        sock.send_multipart(sock.recv_multipart(copy=False), copy=False)


def serve(step, finish) -> int:
    """A worker's loop: READY, then "run K" (K timed steps: TIMES [...]) until "quit" (or
    the parent's end), then RESULT {"check": ...}."""
    print("READY", flush=True)
    for line in sys.stdin:
        command = line.split()
        if command[:1] == ["run"]:
            times = [step() for _ in range(int(command[1]))]
            print("TIMES " + json.dumps(times), flush=True)
        elif command[:1] == ["quit"]:
            break
    print("RESULT " + json.dumps({"check": finish()}), flush=True)
    return 0


def child_echo_client(args) -> int:
    import numpy as np  # noqa: PLC0415
    import zmq  # noqa: PLC0415
    context = zmq.Context()
    socks = []
    for port in args.ports.split(","):
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(f"tcp://127.0.0.1:{int(port)}")
        socks.append(sock)
    data = np.ones(args.mib << 18, np.float32)
    parts = [(sock, memoryview(data[offset:offset + count].view(np.uint8)))
             for sock, (offset, count) in zip(socks, parts_of(data.size, len(socks)))]
    if args.chunk_mib:  # each server's part in messages of at most chunk_mib MiB
        size = args.chunk_mib << 20
        parts = [(sock, part[at:at + size]) for sock, part in parts
                 for at in range(0, len(part), size)]
    sizes = [len(part) for _, part in parts]
    header = b"\0" * 49  # the store's header with a one-letter key
    for sock in socks:  # the connections are up before the clock starts
        sock.send_multipart([header])
        sock.recv_multipart()

    def step() -> float:
        started = time.perf_counter()
        for sock, part in parts:
            sock.send_multipart([header, part], copy=False)
        received = [sock.recv_multipart(copy=False) for sock, _ in parts]
        elapsed = time.perf_counter() - started
        if [len(frames[1]) for frames in received] != sizes:
            raise BenchError("the echo came back with other sizes")
        return elapsed

    return serve(step, lambda: "ok")


def child_mixrt_worker(args) -> int:
    import mixrt  # noqa: I001  (before NumPy, as users are told)
    import numpy as np
    kv = mixrt.kv.create("dist_sync")
    n = args.mib << 18
    kv.init(KEY, np.zeros(n, np.float32))
    if args.sgd:
        kv.set_optimizer(mixrt.optimizer.create("sgd", learning_rate=LR))
    gradient = np.full(n, kv.rank + 1, np.float32)
    out = np.empty(n, np.float32)
    steps = [0]

    def step() -> float:
        started = time.perf_counter()
        kv.push(KEY, gradient)
        kv.pull(KEY, out=out)
        steps[0] += 1
        return time.perf_counter() - started

    def finish() -> str:
        check = _check(np, out, kv.num_workers, steps[0], args.sgd)
        kv.close()
        return check

    return serve(step, finish)


def child_mxnet_worker(args) -> int:
    import mxnet as mx  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    kv = mx.kv.create("dist_sync")
    n = args.mib << 18
    kv.init(KEY, mx.nd.zeros(n, dtype="float32"))
    if args.sgd:
        kv.set_optimizer(mx.optimizer.SGD(learning_rate=LR, rescale_grad=1.0))
    gradient = mx.nd.empty(n, dtype="float32")
    out = mx.nd.empty(n, dtype="float32")
    steps = [0]

    def step() -> float:
        # MXNet's push of a single CPU array keeps the array itself as the key's comm
        # buffer, and the pull lands there before it is copied into `out`: the gradient is
        # overwritten by every pull (training computes a new one). Refill it, off the clock.
        gradient[:] = kv.rank + 1
        gradient.wait_to_read()
        started = time.perf_counter()
        kv.push(KEY, gradient)
        kv.pull(KEY, out=out)
        out.wait_to_read()
        steps[0] += 1
        return time.perf_counter() - started

    def finish() -> str:
        check = _check(np, out.asnumpy(), kv.num_workers, steps[0], args.sgd)
        kv._barrier()  # MXNet has no close(): leave together (its own tests do so)
        return check

    return serve(step, finish)


def _check(np, out, workers: int, steps: int, sgd: bool) -> str:
    """Without an optimizer the servers store the sum of the pushes; with SGD from 0 the
    value after t steps is -lr * t * sum."""
    total = workers * (workers + 1) / 2
    expected = -LR * steps * total if sgd else total
    if np.allclose(out, expected, rtol=1e-3, atol=1e-6):
        return "ok"
    return f"expected {expected:g} after {steps} steps, got {out[:2]} ... {out[-2:]}"

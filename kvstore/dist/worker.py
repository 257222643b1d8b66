"""The worker's side of the parameter server: ``mixrt.kv.create("dist_sync")`` and friends.

Keys go to servers by a stable hash of the key; an array of more than
``MIXRT_KV_BIGARRAY_BOUND`` elements is split into one contiguous part per server, so every
server carries a share of the big layers. A part travels in messages of at most
``MIXRT_KV_MESSAGE_BYTES`` (``protocol.pieces``), and so do the servers' replies. Pushes
leave without a copy of the gradient (the call returns once ZeroMQ has released the
buffers); pulled pieces land directly in the output array.

Every wait (init, pull, barrier) polls in 100 ms slices and checks, each time, the
scheduler link (a lost peer raises ``PeerLostError`` naming it), the other workers' state
(a worker that waits at a barrier or has left with fewer steps than this one will never
push again: a ``KVStoreError`` instead of a hang) and the deadline (``KVTimeoutError``).
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import sys
import time
import uuid
import zlib

import numpy as np
import zmq

from mixrt.base.errors import KVStoreError, KVTimeoutError
from mixrt.kvstore.base import (KVStore, check_like, copy_into, key_value_pairs, require_out,
                                sum_on)
from mixrt.kvstore.compression import check_params, create_compressor
from mixrt.kvstore.dist import protocol as p
from mixrt.kvstore.dist.config import Config, from_env
from mixrt.kvstore.dist.liveness import SchedulerLink, interrupt_main_on_error
from mixrt.kvstore.dist.security import secure_client
from mixrt.ops.device import array_module, to_host
from mixrt.runtime.training import optimizer as optim
from mixrt.runtime.engine import drain_if_running

log = logging.getLogger("mixrt.kvstore.worker")
DIST_KINDS = ("dist_sync", "dist_async", "dist_device_sync")


class DistStore(KVStore):
    def __init__(self, kind: str = "dist_sync", config: Config | None = None):
        super().__init__()
        if kind not in DIST_KINDS:
            raise KVStoreError(f"DistStore serves {DIST_KINDS}, not {kind!r}")
        self.type = kind
        self.mode = "async" if kind == "dist_async" else "sync"
        self.config = config or from_env(role="worker")
        self.context = zmq.Context.instance()
        self.link = SchedulerLink(self.config, "worker", context=self.context)
        interrupt_main_on_error(self.link)
        book = self.link.wait_welcome()
        self._rank, self._num_workers = book["rank"], book["num_workers"]
        self.names = book.get("names", {})
        self.servers = book["servers"]
        self._ticket = book["ticket"]  # proves this worker's rank to the servers
        self._sockets = [self._connect(address) for address in self.servers]
        self._requests = 0
        self._meta: dict[str, tuple] = {}      # key -> (shape, dtype, parts)
        self._rounds: dict[str, int] = {}      # key -> pushes so far
        self._compressor = None
        self._closed = False
        self._hello()
        atexit.register(self.close)
        _report_crashes_to(self)

    # -- identity -----------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def num_workers(self) -> int:
        return self._num_workers

    @property
    def name(self) -> str:
        return self.names.get(f"worker {self._rank}", f"worker {self._rank}")

    # -- connections ----------------------------------------------------------------------

    def _connect(self, address: str) -> zmq.Socket:
        socket = self.context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 2000)
        socket.setsockopt(zmq.IDENTITY, f"worker-{uuid.uuid4().hex}".encode())
        socket.setsockopt(zmq.MAXMSGSIZE, self.config.max_message + p.HEADER.size + 65536)
        secure_client(socket, self.config)
        socket.connect(address)
        return socket

    def _hello(self) -> None:
        pending = {}
        for server in range(len(self._sockets)):
            request = self._send(server, p.json_message(p.HELLO, {
                "rank": self._rank, "mode": self.mode, "ticket": self._ticket}))
            pending[request] = (server, None)
        self._wait(pending, "connecting to the servers", timeout=min(self.config.timeout, 60))

    # -- data -----------------------------------------------------------------------------

    def init(self, key, value) -> None:
        """Every worker names each part (INIT, no payload); worker 0 then sends its value in
        pieces (VALUE), which is what every worker pulls."""
        self.wait_queued()
        pending = {}
        for name, arrays in key_value_pairs(key, value, "init"):
            if name in self._meta:
                raise KVStoreError(f"init: key {name!r} is already initialized")
            flat = np.ascontiguousarray(to_host(arrays[0])).reshape(-1)
            code = p.dtype_code(flat.dtype)
            parts = self._layout(name, flat.size)
            self._meta[name] = (tuple(arrays[0].shape), flat.dtype, parts)
            for server, offset, count in parts:
                message = p.Message(p.INIT, key=name, dtype=code, offset=offset, count=count,
                                    total=flat.size)
                pending[self._send(server, message)] = (server, None)
                if self._rank == 0:
                    self._send_value(server, name, flat, offset, count)
        self._wait(pending, f"init of {_keys(key)} (waits for worker 0's values)")

    def _send_value(self, server: int, name: str, flat: np.ndarray, offset: int,
                    count: int) -> None:
        for start, size in p.pieces(count, flat.itemsize, self.config.message_bytes):
            if size:
                piece = flat[offset + start:offset + start + size]
                self._send(server, p.array_message(p.VALUE, name, piece,
                                                   offset=offset + start, total=flat.size))

    def push(self, key, value, priority: int = 0) -> None:
        self.wait_queued()
        started = time.perf_counter()
        trackers = []
        for name, arrays in key_value_pairs(key, value, "push"):
            flat, borrowed = self._gradient(name, arrays)
            shape, dtype, parts = self._meta[name]
            for server, offset, count in parts:
                trackers += self._push_part(server, name, flat[offset:offset + count],
                                            offset, flat.size, borrowed)
            self._rounds[name] = self._rounds.get(name, 0) + 1
        self._wait_sent(trackers, f"push of {_keys(key)}")
        self._verbose("push", key, started)

    def pull(self, key, out=None, priority: int = 0, ignore_sparse: bool = True):
        # sparse outs are filled as dense ones here (only the local kinds skip them)
        return self._pull(key, out, settled=False)

    def pull_settled(self, key, out=None):
        """``pull``, answered once every worker has pushed each key as often as this one:
        after a barrier, the value every worker's last push went into. (dist_sync's pull
        already waits for its round; under dist_async a plain pull returns the value as it
        stands, which may miss another worker's push still on its way.)"""
        return self._pull(key, out, settled=True)

    def _pull(self, key, out, *, settled: bool):
        require_out(out)
        self.wait_queued()
        started = time.perf_counter()
        pending, targets = {}, []
        for name, arrays in key_value_pairs(key, out, "pull"):
            shape, dtype, parts = self._known(name, "pull")
            for array in arrays:
                check_like(name, _Like(shape, dtype), array, "pull")
            landing = _landing(arrays[0], dtype)
            targets.append((arrays, landing))
            for server, offset, count in parts:
                message = p.Message(p.PULL, key=name, dtype=p.dtype_code(dtype),
                                    offset=offset, count=count, total=landing.size,
                                    flags=p.SETTLED if settled else 0)
                pending[self._send(server, message)] = (server, _into(landing, offset, count))
        self._wait(pending, f"pull of {_keys(key)}",
                   sync_round=self.mode == "sync" or settled)
        for arrays, landing in targets:
            for array in arrays:
                if not _is_view_of(array, landing):
                    copy_into(array, landing.reshape(array.shape))
        self._verbose("pull", key, started)
        return out

    def _gradient(self, name: str, arrays: list):
        """One flat host array holding the (summed) gradient, and whether it is the
        caller's own buffer (then the send must finish before push returns)."""
        shape, dtype, parts = self._known(name, "push")
        for array in arrays:
            check_like(name, _Like(shape, dtype), array, "push")
        if len(arrays) > 1:
            total = sum_on(arrays, array_module(arrays[0]) if self.type == "dist_device_sync"
                           else np)
            return np.ascontiguousarray(to_host(total)).reshape(-1), False
        host = to_host(arrays[0])
        borrowed = host is arrays[0] and host.flags.c_contiguous
        return np.ascontiguousarray(host).reshape(-1), borrowed

    def _push_part(self, server, name, part, offset, total, borrowed) -> list:
        """Send one server's part as pieces; the trackers of those that borrow the
        caller's buffer."""
        pieces = p.pieces(part.size, part.itemsize, self.config.message_bytes)
        if self._compressor is not None:
            packed = self._compressor.compress(f"{name}@{offset}", part)
            for start, size in pieces:  # 4 values a byte: pieces split at whole bytes
                message = p.array_message(
                    p.PUSH, name, packed[start // 4:(start + size + 3) // 4],
                    dtype=part.dtype, count=size, offset=offset + start, total=total,
                    flags=p.COMPRESSED)
                self._send(server, message)
            return []
        trackers = []
        for start, size in pieces:
            message = p.array_message(p.PUSH, name, part[start:start + size],
                                      offset=offset + start, total=total)
            tracker = self._send(server, message, track=borrowed)
            if borrowed:
                trackers.append(tracker)
        return trackers

    # -- settings -------------------------------------------------------------------------

    def set_optimizer(self, optimizer: optim.Optimizer) -> None:
        """Worker 0 sends the optimizer's spec (name and hyper-parameters, JSON) to every
        server; all workers then meet at a barrier, so no push precedes it."""
        if not isinstance(optimizer, optim.Optimizer):
            raise KVStoreError(f"set_optimizer takes a mixrt optimizer, got "
                               f"{type(optimizer).__name__}")
        self._optimizer = optimizer
        self.wait_queued()
        if self._rank == 0:
            self._to_all_servers(p.json_message(p.SET_OPTIMIZER, optimizer.spec()),
                                 "set_optimizer")
        self.barrier()

    def set_updater(self, updater) -> None:
        raise KVStoreError(f"the {self.type!r} store updates on its servers: use "
                           f"set_optimizer (a Python updater cannot travel to them)")

    def set_gradient_compression(self, params: dict) -> None:
        self._compression = check_params(params)
        self._compressor = create_compressor(self._compression)
        self.wait_queued()
        if self._rank == 0:
            self._to_all_servers(p.json_message(p.SET_COMPRESSION, self._compression),
                                 "set_gradient_compression")
        self.barrier()

    def barrier(self) -> None:
        """Every worker waits here for the others; workers that arrive after different
        numbers of steps get a KVStoreError naming each one's count. The steps a Trainer
        has queued on the dependency engine are pushed first, so they count."""
        self.wait_queued()
        self.link.request(p.BARRIER, {"rounds": self._steps()}, f"barrier ({self.name})")

    # -- optimizer states ----------------------------------------------------------------

    def _optimizer_state_dict(self) -> dict:
        self.wait_queued()
        replies = self._to_all_servers(p.Message(p.GET_STATES), "save_optimizer_states")
        pieces, counts, spec = {}, {}, None
        for reply in replies:
            meta, data = reply.blob()
            spec, position = meta["spec"], 0
            counts.update(meta["counts"])
            for part, size, dtype in zip(meta["parts"], meta["sizes"], meta["dtypes"]):
                end = position + size * np.dtype(dtype).itemsize
                pieces.setdefault((part["key"], part["slot"]), []).append(
                    (part["offset"], np.frombuffer(data[position:end], dtype=dtype)))
                position = end
        optimizer = optim.from_spec(spec)
        for (key, slot), parts in pieces.items():
            whole = np.concatenate([array for _, array in sorted(parts, key=lambda x: x[0])])
            shape = self._meta[key][0] if key in self._meta else whole.shape
            optimizer.states.setdefault(key, {})[slot] = whole.reshape(shape)
        optimizer.counts = {k: int(v) for k, v in counts.items()}
        return optimizer.state_dict()

    def _value_shape(self, key: str, what: str) -> tuple:
        return tuple(self._known(key, what)[0])

    def _load_optimizer_state_dict(self, arrays: dict) -> None:
        """Worker 0 sends every server the states of its parts, in pieces, then the count
        of pieces; the servers swap them in when all have arrived. The other workers' calls
        check the file and send nothing (the states live on the servers)."""
        self._check_state_shapes(arrays)
        self.wait_queued()
        saved = optim.from_state_dict(arrays)
        for key in saved.states:
            self._known(key, "load_optimizer_states")
        if self._rank != 0:
            return
        pending = {}
        for server in range(len(self._sockets)):
            sent = 0
            for key, slots in saved.states.items():
                for part_server, offset, count in self._meta[key][2]:
                    if part_server == server:
                        sent += self._send_states(server, key, slots, offset, count,
                                                  saved.counts.get(key, 0))
            done = p.json_message(p.LOAD_STATES, {"pieces": sent})
            pending[self._send(server, done)] = (server, None)
        self._wait(pending, "load_optimizer_states")

    def _send_states(self, server: int, key: str, slots: dict, offset: int, count: int,
                     updates: int) -> int:
        """One BLOB per piece of each state array of a part; returns how many."""
        sent = 0
        for slot, array in slots.items():
            flat = np.ascontiguousarray(array).reshape(-1)[offset:offset + count]
            for start, size in p.pieces(count, flat.itemsize, self.config.message_bytes):
                meta = {"key": key, "slot": slot, "dtype": flat.dtype.name,
                        "offset": offset + start, "size": size, "count": updates}
                self._send(server, p.blob_message(p.LOAD_STATES, meta,
                                                  [flat[start:start + size]]))
                sent += 1
        return sent

    # -- leaving --------------------------------------------------------------------------

    def close(self) -> None:
        """Tell the scheduler this worker is done (after its last push and pull: pushes a
        Trainer queued on the dependency engine finish first)."""
        if self._closed:
            return
        drain_if_running()
        self._closed = True
        if self.link.error is None:
            self.link.notify(p.BYE, {"rounds": self._steps()})
        self.link.close()
        for socket in self._sockets:
            socket.close(linger=1000)

    # -- plumbing -------------------------------------------------------------------------

    def _layout(self, name: str, total: int) -> list[tuple[int, int, int]]:
        """[(server, offset, count)]: one part on the key's server, or one per server."""
        servers = len(self._sockets)
        if total <= self.config.bigarray_bound or servers == 1 or total < servers:
            return [(zlib.crc32(name.encode()) % servers, 0, total)]
        step = -(-total // servers)
        return [(s, s * step, min(step, total - s * step)) for s in range(servers)
                if s * step < total]

    def _known(self, name: str, what: str) -> tuple:
        if name not in self._meta:
            raise KVStoreError(f"{what}: key {name!r} was never initialized on this worker "
                               f"(call init first)")
        return self._meta[name]

    def _steps(self) -> int:
        return max(self._rounds.values(), default=0)

    def _send(self, server: int, message: p.Message, track: bool = False):
        self._requests += 1
        message.request, message.rank = self._requests, self._rank
        tracker = self._sockets[server].send_multipart(p.encode(message), copy=False,
                                                       track=track)
        return tracker if track else self._requests

    def _to_all_servers(self, message: p.Message, what: str) -> list[p.Message]:
        replies, pending = [], {}
        for server in range(len(self._sockets)):
            pending[self._send(server, dataclasses.replace(message))] = (server, replies.append)
        self._wait(pending, what)
        return replies

    def _wait(self, pending: dict, what: str, *, sync_round: bool = False,
              timeout: float | None = None) -> None:
        """Receive replies until every request in ``pending`` ({request: (server,
        handler)}) is answered; see the module docstring for what each slice checks."""
        deadline = time.monotonic() + (timeout or self.config.timeout)
        poller = zmq.Poller()
        for server in {server for server, _ in pending.values()}:
            poller.register(self._sockets[server], zmq.POLLIN)
        while pending:
            for socket, _ in poller.poll(100):
                while socket.poll(0):
                    self._on_reply(socket.recv_multipart(copy=False), pending, what)
            self.link.check()
            if sync_round and pending:
                self._check_peers(what)
            if pending and time.monotonic() > deadline:
                servers = sorted({self.servers[s] for s, _ in pending.values()})
                raise KVTimeoutError(f"{what}: no answer from server(s) {servers} within "
                                     f"{timeout or self.config.timeout:.0f} s")

    def _on_reply(self, frames: list, pending: dict, what: str) -> None:
        """Hand a reply to its request's handler; a handler that returns True waits for
        more pieces of its reply."""
        try:
            reply = p.decode(frames, self.config.max_message)
        except p.ProtocolError as exc:
            log.warning("%s: dropped a malformed reply: %s", self.name, exc)
            return
        if reply.type == p.ERROR:
            raise KVStoreError(f"{what}: {reply.json().get('message')}")
        entry = pending.get(reply.request)
        if entry is None or (entry[1] is not None and entry[1](reply)):
            return
        del pending[reply.request]

    def _wait_sent(self, trackers: list, what: str) -> None:
        deadline = time.monotonic() + self.config.timeout
        for tracker in trackers:
            while not tracker.done:
                try:
                    tracker.wait(0.1)
                except zmq.NotDone:
                    pass
                self.link.check()
                if time.monotonic() > deadline:
                    raise KVTimeoutError(f"{what}: the servers did not take the data within "
                                         f"{self.config.timeout:.0f} s")

    def _check_peers(self, what: str) -> None:
        """A worker at a barrier or gone, with fewer steps than this one, will never push
        the round this pull waits for."""
        mine = self._steps()
        status = self.link.status
        for state, peers in (("waits at a barrier", status.get("barrier", {})),
                             ("has left the job", status.get("departed", {}))):
            for peer, steps in peers.items():
                if peer != self.name and steps < mine:
                    raise KVStoreError(
                        f"{what}: {peer} {state} after {steps} steps while {self.name} is at "
                        f"step {mine}; workers ran different numbers of batches (give each "
                        f"the same: NDArrayIter(num_parts=kv.num_workers, part_index=kv.rank))")

    def _verbose(self, what: str, key, started: float) -> None:
        if self.config.verbose:
            log.warning("%s: %s %s %.2f ms", self.name, what, _keys(key),
                        (time.perf_counter() - started) * 1e3)


class _Like:
    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype


def _keys(key) -> str:
    if isinstance(key, (list, tuple)):
        return repr(list(key)) if len(key) <= 4 else f"{len(key)} keys"
    return repr(key)


def _landing(first, dtype) -> np.ndarray:
    """Where pulled bytes land: the caller's first array itself when it is a contiguous
    host array, else a fresh flat buffer."""
    if isinstance(first, np.ndarray) and first.flags.c_contiguous and first.flags.writeable:
        return first.reshape(-1)
    return np.empty(int(np.prod(first.shape)), dtype=dtype)


def _is_view_of(array, landing) -> bool:
    return isinstance(array, np.ndarray) and np.shares_memory(array, landing)


def _into(landing: np.ndarray, offset: int, count: int):
    """The handler of a pull's reply: its pieces, in order, into ``landing``; True while
    more are due."""
    filled = 0

    def receive(reply: p.Message) -> bool:
        nonlocal filled
        if reply.type != p.VALUE or reply.offset != offset + filled or \
                reply.count > count - filled or (reply.count == 0 and count > 0):
            raise KVStoreError(f"pull: server answered elements [{reply.offset}, "
                               f"+{reply.count}) where [{offset + filled}, "
                               f"+{count - filled}) was due")
        landing[reply.offset:reply.offset + reply.count] = reply.array()
        filled += reply.count
        return filled < count
    return receive


def _report_crashes_to(store: DistStore) -> None:
    """An uncaught exception in a worker tells the scheduler, which stops the job with the
    worker's error instead of leaving the others to find out by timeout."""
    previous = sys.excepthook

    def hook(kind, value, traceback):
        if not store._closed and store.link.error is None:
            store.link.notify(p.ABORT, {"message": f"{kind.__name__}: {value}"[:2000]})
            store._closed = True
            store.link.close()
        previous(kind, value, traceback)

    sys.excepthook = hook

"""A parameter server: holds its shard of the keys, sums the workers' pushes, runs the
optimizer, answers pulls.

``dist_sync``: a key's round completes when every worker has pushed all of it; then the
summed gradient updates the weight (with the optimizer set by ``set_optimizer``, or by
replacing the value when there is none) and the pulls waiting for that round are answered.
A push arrives as pieces in order (``protocol.pieces``); each piece is summed as soon as the
same piece has come from two workers, so most of the sum is done before the last piece
lands. A worker that pushes again before the round completes has its pieces held for the
next round. A pull is answered once the rounds this worker pushed have completed, so a
worker always pulls the weights its own gradients went into; the reply goes back in pieces
too. ``dist_async``: every push updates at once; pulls return the current value, except a
``SETTLED`` pull (a worker's after a barrier), answered once every worker has pushed the key
as often as that worker.

Who may send what: a connection speaks for a worker only after a HELLO carrying that
worker's ticket (the scheduler hands each worker its own and the servers all of them), and a
rank is held by one connection. Only worker 0 sets the optimizer, the compression, the
initial values and loaded optimizer states. Every message is checked by ``protocol.decode``,
then against the sender's rank and this server's state; one that fails is logged with the
sender's identity and dropped (or, from a worker, answered with an ERROR naming the key),
and the server goes on serving. What a worker can make this server hold is bounded: the
shards worker 0 initializes, one early round and one waiting pull per key and worker, and
at most ``MAX_PENDING_INITS`` inits waiting for worker 0's value per worker (no payload).
"""

from __future__ import annotations

import hmac
import logging
import statistics
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import zmq

from mixrt.base.errors import KVStoreError, MixrtError
from mixrt.kvstore.compression import create_compressor
from mixrt.kvstore.dist import protocol as p
from mixrt.kvstore.dist.config import Config
from mixrt.kvstore.dist.liveness import SchedulerLink
from mixrt.kvstore.dist.security import check_bind, secure_server
from mixrt.runtime.training import optimizer as optim

log = logging.getLogger("mixrt.kvstore.server")
MAX_PENDING_INITS = 65_536  # per worker: inits that wait for worker 0's value
MAX_STATE_SLOTS = 8         # optimizer state arrays per key (Adam has 2, LAMB 2)
ROOT_ONLY = ("SET_OPTIMIZER", "SET_COMPRESSION", "VALUE", "LOAD_STATES")


@dataclass
class Shard:
    """One key, or this server's part of a key split over the servers."""
    key: str
    offset: int
    total: int
    value: np.ndarray
    initialized: int = 0                            # elements of worker 0's value received
    merged: np.ndarray | None = None                # the round's sum, for the optimizer
    received: dict = field(default_factory=dict)    # rank -> elements pushed, all rounds
    filled: dict = field(default_factory=dict)      # rank -> elements summed, this round
    arrived: dict = field(default_factory=dict)     # rank -> time its push completed
    firsts: dict = field(default_factory=dict)      # piece start -> first push, uncopied
    added: dict = field(default_factory=dict)       # piece start -> (pushes summed, size)
    held: dict = field(default_factory=dict)        # rank -> deque of early pieces
    partial: dict = field(default_factory=dict)     # rank -> async push being assembled
    version: int = 0                                # completed rounds
    waiting_pulls: list = field(default_factory=list)  # (identity, request, rank, needed)

    @property
    def size(self) -> int:
        return self.value.size

    @property
    def ready(self) -> bool:
        return self.initialized == self.size

    def holds(self, offset: int, count: int) -> bool:
        return self.offset <= offset and offset + count <= self.offset + self.size

    def rounds_pushed(self, rank: int) -> int:
        """Rounds this rank has pushed, a round begun counting as pushed."""
        return -(-self.received.get(rank, 0) // max(self.size, 1))


@dataclass
class _Waiting:
    """An INIT waiting for worker 0's value (its header only: INIT carries no payload)."""
    identity: bytes
    rank: int
    message: p.Message


class Server:
    def __init__(self, config: Config, *, sync: bool | None = None,
                 context: zmq.Context | None = None):
        self.config = config
        self.context = context or zmq.Context.instance()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 2000)
        self.socket.setsockopt(zmq.MAXMSGSIZE, config.message_bytes + p.FRAME_SLACK)
        host = config.bind_host
        check_bind(host, config, "server")
        secure_server(self.socket, config)
        port = self.socket.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{port}"
        self.link = SchedulerLink(config, "server", address=self.address,
                                  context=self.context)
        self.sync = sync
        self.shards: dict[tuple[str, int], Shard] = {}
        self.by_key: dict[str, list[Shard]] = {}  # finds the shard of a push's later pieces
        self.ranks: dict[bytes, int] = {}       # identity -> the rank its HELLO proved
        self.holders: dict[int, bytes] = {}     # rank -> the one identity holding it
        self.optimizer: optim.Optimizer | None = None
        self.compressor = None
        self.pending_inits: dict[tuple[str, int], list] = {}
        self.pending_count: dict[int, int] = {}
        self.loading: dict | None = None        # optimizer states arriving from worker 0
        self.dropped = 0
        self.stragglers = StragglerWatch(config.verbose)

    # -- the loop --------------------------------------------------------------------------

    def run(self) -> int:
        welcome = self.link.wait_welcome()
        self.rank, self.num_workers = welcome["rank"], welcome["num_workers"]
        self.names = welcome.get("names", {})
        self.tickets = [ticket.encode() for ticket in welcome["tickets"]]
        log.info("server %d serving at %s", self.rank, self.address)
        try:
            while not self.link.shutdown.is_set():
                self.link.check()
                if self.socket.poll(100):
                    for _ in range(64):  # a burst, then look at the link again
                        self._receive()
                        if not self.socket.poll(0):
                            break
            return 0
        finally:
            self.link.close()
            self.socket.close(linger=2000)

    def _receive(self) -> None:
        identity, *frames = self.socket.recv_multipart(copy=False)
        identity = identity.bytes
        message = None
        try:
            message = p.decode(frames, self.config.max_message)
            self._dispatch(identity, message)
        except p.ProtocolError as exc:
            self._drop(identity, exc)
        except MixrtError as exc:
            if message is None:
                self._drop(identity, exc)
            else:
                self._reply_error(identity, message, str(exc))
        except Exception as exc:  # noqa: BLE001  (no frame may stop the server)
            self._drop(identity, f"{type(exc).__name__}: {exc}")

    def _drop(self, identity: bytes, reason) -> None:
        self.dropped += 1
        if self.dropped <= 20 or self.dropped % 1000 == 0:
            log.warning("server %d: dropped a bad message from %s (%d so far): %s", self.rank,
                        self._sender(identity), self.dropped, reason)

    def _sender(self, identity: bytes) -> str:
        rank = self.ranks.get(identity)
        who = f"worker {rank}" if rank is not None else "a peer that did not say HELLO"
        return f"{who} (connection {identity[:40]!r})"

    def _dispatch(self, identity: bytes, message: p.Message) -> None:
        if message.type == p.HELLO:
            return self._on_hello(identity, message)
        rank = self.ranks.get(identity)
        if rank is None or rank != message.rank:
            raise p.ProtocolError(f"{message.type_name} from a peer that did not say HELLO "
                                  f"as rank {message.rank}")
        if message.type_name in ROOT_ONLY and rank != 0:
            raise p.ProtocolError(f"{message.type_name} from worker {rank}; only worker 0 "
                                  f"sends it")
        handler = {p.INIT: self._on_init, p.VALUE: self._on_value, p.PUSH: self._on_push,
                   p.PULL: self._on_pull, p.SET_OPTIMIZER: self._on_set_optimizer,
                   p.SET_COMPRESSION: self._on_set_compression,
                   p.GET_STATES: self._on_get_states,
                   p.LOAD_STATES: self._on_load_states}.get(message.type)
        if handler is None:
            raise p.ProtocolError(f"a server does not take {message.type_name}")
        handler(identity, rank, message)

    def _on_hello(self, identity: bytes, message: p.Message) -> None:
        """A worker proves its rank with its ticket; a rank is held by one connection."""
        body = message.json()
        rank = p.integer(body, "rank", "HELLO", 0, self.num_workers - 1)
        mode = p.text(body, "mode", "HELLO", choices=("sync", "async"))
        ticket = p.text(body, "ticket", "HELLO", max_length=128).encode()
        # a well-formed HELLO that fails is answered (a worker then fails at once, naming
        # the reason) as well as logged
        if not hmac.compare_digest(ticket, self.tickets[rank]):
            raise KVStoreError(f"HELLO as worker {rank} without that worker's ticket "
                               f"(connection {identity[:40]!r})")
        holder = self.holders.get(rank)
        if holder is not None and holder != identity:
            raise KVStoreError(f"HELLO as worker {rank}, whose rank another connection "
                               f"holds (connection {identity[:40]!r})")
        if self.sync is None:
            self.sync = mode == "sync"
        elif self.sync != (mode == "sync"):
            raise KVStoreError(f"worker {rank} asks for {mode} mode; this job is "
                               f"{'sync' if self.sync else 'async'}")
        self.ranks[identity] = rank
        self.holders[rank] = identity
        self._send(identity, p.Message(p.ACK, request=message.request))

    # -- init, push, pull ------------------------------------------------------------------

    def _on_init(self, identity: bytes, rank: int, message: p.Message) -> None:
        """An INIT names a part (no payload). Worker 0's makes the shard, whose value then
        comes as VALUE pieces; every INIT is answered once that value is complete."""
        where = (message.key, message.offset)
        shard = self.shards.get(where)
        if rank == 0:
            if shard is not None:
                raise KVStoreError(f"init: key {message.key!r} is already initialized")
            dtype = p.array_dtype(message.dtype)
            shard = Shard(message.key, message.offset, message.total,
                          np.empty(message.count, dtype))
            self.shards[where] = shard
            self.by_key.setdefault(message.key, []).append(shard)
            self.pending_inits.setdefault(where, []).insert(0, _Waiting(identity, rank,
                                                                        message))
            if shard.ready:  # an empty part
                self._answer_inits(shard)
            return
        if shard is not None and shard.ready:
            self._check_part(shard, message, "init")
            self._send(identity, p.Message(p.ACK, request=message.request))
            return
        if self.pending_count.get(rank, 0) >= MAX_PENDING_INITS:
            raise KVStoreError(f"init: worker {rank} has {MAX_PENDING_INITS} inits waiting "
                               f"for worker 0's values; call init on worker 0 too")
        self.pending_count[rank] = self.pending_count.get(rank, 0) + 1
        self.pending_inits.setdefault(where, []).append(_Waiting(identity, rank, message))

    def _on_value(self, identity: bytes, rank: int, message: p.Message) -> None:
        """A piece of worker 0's initial value, in order."""
        shard = self._shard(message, "init", ready=False)
        start = message.offset - shard.offset
        if shard.ready or start != shard.initialized or \
                not shard.holds(message.offset, message.count):
            raise KVStoreError(f"init: key {shard.key!r}: worker 0 sent elements "
                               f"[{message.offset}, +{message.count}) where its value of "
                               f"[{shard.offset}, +{shard.size}) continues at element "
                               f"{shard.offset + shard.initialized}")
        shard.value[start:start + message.count] = message.array()
        shard.initialized += message.count
        if shard.ready:
            self._answer_inits(shard)

    def _answer_inits(self, shard: Shard) -> None:
        for waiting in self.pending_inits.pop((shard.key, shard.offset), []):
            if waiting.rank != 0:
                self.pending_count[waiting.rank] -= 1
            try:
                self._check_part(shard, waiting.message, "init")
            except KVStoreError as exc:
                self._reply_error(waiting.identity, waiting.message, str(exc))
                continue
            self._send(waiting.identity, p.Message(p.ACK, request=waiting.message.request))

    def _on_push(self, identity: bytes, rank: int, message: p.Message) -> None:
        shard = self._shard(message, "push")
        start = self._next_piece(shard, rank, message)
        round_ = shard.received.get(rank, 0) // max(shard.size, 1)
        if self.sync and round_ > shard.version + 1:
            raise KVStoreError(f"push: key {shard.key!r}: worker {rank} pushes round "
                               f"{round_ + 1} while round {shard.version + 1} is still open; "
                               f"pull before pushing a key again")
        gradient = self._gradient(shard, message)
        shard.received[rank] = shard.received.get(rank, 0) + gradient.size
        if not self.sync:
            self._update_async(shard, rank, start, gradient)
        elif round_ > shard.version:
            queue = shard.held.setdefault(rank, deque())
            queue.append((round_, start, np.array(gradient, copy=True)))
        else:
            self._accumulate(shard, rank, start, gradient)

    def _next_piece(self, shard: Shard, rank: int, message: p.Message) -> int:
        """A worker's pieces of a push come in order and cover its part once; where this
        one starts, counted from the part's first element."""
        start = message.offset - shard.offset
        expected = shard.received.get(rank, 0) % max(shard.size, 1)
        if start != expected or message.count > shard.size - start or \
                (message.count == 0 and shard.size > 0):
            raise KVStoreError(f"push: key {shard.key!r}: worker {rank} sent elements "
                               f"[{message.offset}, +{message.count}) where its push of "
                               f"[{shard.offset}, +{shard.size}) continues at element "
                               f"{shard.offset + expected}")
        return start

    def _accumulate(self, shard: Shard, rank: int, start: int, gradient: np.ndarray) -> None:
        self._add(shard, start, gradient)
        shard.filled[rank] = shard.filled.get(rank, 0) + gradient.size
        if shard.filled[rank] < shard.size:
            return
        shard.arrived[rank] = time.monotonic()
        if len(shard.arrived) == self.num_workers:
            self._complete_round(shard)

    def _add(self, shard: Shard, start: int, gradient: np.ndarray) -> None:
        """Sum one piece in one pass per push, with no copy of the first push: the last
        push's sum goes straight into the stored value when there is no optimizer (as safe
        as copying it there: see _send_value), else into ``merged`` for the optimizer."""
        end = start + gradient.size
        summed, size = shard.added.get(start, (0, gradient.size))
        if size != gradient.size:
            raise KVStoreError(f"push: key {shard.key!r}: the workers cut it into pieces of "
                               f"different sizes ({size} and {gradient.size} elements from "
                               f"element {shard.offset + start}); set the same "
                               f"MIXRT_KV_MESSAGE_BYTES for every worker")
        shard.added[start] = (summed + 1, size)
        last = summed + 1 == self.num_workers
        if shard.merged is None and (self.optimizer is not None or self.num_workers > 2):
            shard.merged = np.empty_like(shard.value)
        target = shard.value if last and self.optimizer is None else shard.merged
        if self.num_workers == 1:
            target[start:end] = gradient
        elif summed == 0:
            shard.firsts[start] = gradient  # the received frame itself
        elif summed == 1:
            np.add(shard.firsts.pop(start), gradient, out=target[start:end])
        else:
            np.add(shard.merged[start:end], gradient, out=target[start:end])

    def _complete_round(self, shard: Shard) -> None:
        if self.optimizer is not None:
            self.optimizer.step(shard.key, shard.value, shard.merged)
        self.stragglers.round_done(shard, self.names)
        shard.arrived.clear()
        shard.filled.clear()
        shard.added.clear()
        shard.version += 1
        self._answer_pulls(shard)
        for rank, queue in list(shard.held.items()):
            while queue and queue[0][0] == shard.version:
                _, start, early = queue.popleft()
                self._accumulate(shard, rank, start, early)
            if not queue:
                shard.held.pop(rank, None)

    def _update_async(self, shard: Shard, rank: int, start: int,
                      gradient: np.ndarray) -> None:
        """Every push updates on its own, once all of its pieces are in."""
        if gradient.size != shard.size:
            buffer = shard.partial.get(rank)
            if buffer is None:
                buffer = shard.partial[rank] = np.empty_like(shard.value)
            buffer[start:start + gradient.size] = gradient
            if shard.received[rank] % shard.size:
                return
            gradient = buffer
        if self.optimizer is not None:
            self.optimizer.step(shard.key, shard.value, gradient)
        else:
            shard.value[...] = gradient
        if shard.waiting_pulls:
            self._answer_pulls(shard)

    def _on_pull(self, identity: bytes, rank: int, message: p.Message) -> None:
        shard = self._shard(message, "pull")
        self._check_part(shard, message, "pull")
        needed = shard.rounds_pushed(rank)
        waits = self.sync or message.flags & p.SETTLED
        if waits and not self._pushed_through(shard, needed):
            if any(waiting[2] == rank for waiting in shard.waiting_pulls):
                raise KVStoreError(f"pull: key {shard.key!r}: worker {rank} already waits "
                                   f"for a pull of it; a worker pulls a key once at a time")
            shard.waiting_pulls.append((identity, message.request, rank, needed))
            return
        self._send_value(identity, message.request, shard)

    def _pushed_through(self, shard: Shard, needed: int) -> bool:
        """sync: round ``needed`` has completed; async: every worker has pushed the whole
        key ``needed`` times (each push already applied)."""
        if self.sync:
            return shard.version >= needed
        whole = max(shard.size, 1)
        return all(shard.received.get(rank, 0) // whole >= needed
                   for rank in range(self.num_workers))

    def _answer_pulls(self, shard: Shard) -> None:
        still = []
        for identity, request, rank, needed in shard.waiting_pulls:
            if self._pushed_through(shard, needed):
                self._send_value(identity, request, shard)
            else:
                still.append((identity, request, rank, needed))
        shard.waiting_pulls = still

    def _send_value(self, identity: bytes, request: int, shard: Shard) -> None:
        # sync: the value cannot change before this worker pushes again, which it does only
        # after receiving this reply, so it goes without a copy; async updates at any time
        for start, size in p.pieces(shard.size, shard.value.itemsize,
                                    self.config.message_bytes):
            piece = shard.value[start:start + size]
            self._send(identity, p.array_message(
                p.VALUE, shard.key, piece if self.sync else piece.copy(),
                offset=shard.offset + start, total=shard.total, request=request))

    def _shard(self, message: p.Message, what: str, ready: bool = True) -> Shard:
        """The shard holding the message's first element (whose value is complete, unless
        ``ready`` is False)."""
        shard = self.shards.get((message.key, message.offset)) or next(
            (s for s in self.by_key.get(message.key, ())
             if s.offset <= message.offset < s.offset + s.size), None)
        if shard is None or (ready and not shard.ready):
            raise KVStoreError(f"{what}: key {message.key!r} (elements from "
                               f"{message.offset}) was never initialized on server "
                               f"{self.rank}; call init first")
        if message.total != shard.total or p.array_dtype(message.dtype) != shard.value.dtype:
            raise KVStoreError(self._mismatch(shard, message, what))
        return shard

    def _check_part(self, shard: Shard, message: p.Message, what: str) -> None:
        """An init or a pull names the whole part."""
        if message.total != shard.total or message.offset != shard.offset or \
                message.count != shard.size or p.array_dtype(message.dtype) != shard.value.dtype:
            raise KVStoreError(self._mismatch(shard, message, what))

    @staticmethod
    def _mismatch(shard: Shard, message: p.Message, what: str) -> str:
        return (f"{what}: key {message.key!r} holds {shard.total} elements of "
                f"{shard.value.dtype} (here [{shard.offset}, +{shard.size})); the message has "
                f"{message.total} of {p.array_dtype(message.dtype)} (part "
                f"[{message.offset}, +{message.count}))")

    def _gradient(self, shard: Shard, message: p.Message) -> np.ndarray:
        if not message.flags & p.COMPRESSED:
            return message.array()
        if self.compressor is None:
            raise KVStoreError(f"push: key {shard.key!r} arrived compressed, but no "
                               f"compression was set on this server")
        packed = np.frombuffer(p._buffer(message.payload), dtype=np.uint8)
        return self.compressor.decompress(packed, message.count, shard.value.dtype)

    # -- settings and optimizer states -----------------------------------------------------

    def _on_set_optimizer(self, identity: bytes, rank: int, message: p.Message) -> None:
        spec = message.json(max_bytes=max(self.config.message_bytes, p.CONTROL_JSON_BYTES))
        if self.optimizer is None or self.optimizer.spec() != optim.from_spec(spec).spec():
            self.optimizer = optim.from_spec(spec)
            log.info("server %d: optimizer %s", self.rank, self.optimizer)
        self._send(identity, p.Message(p.ACK, request=message.request))

    def _on_set_compression(self, identity: bytes, rank: int, message: p.Message) -> None:
        self.compressor = create_compressor(message.json())
        self._send(identity, p.Message(p.ACK, request=message.request))

    def _on_get_states(self, identity: bytes, rank: int, message: p.Message) -> None:
        optimizer = self._require_optimizer()
        keys = sorted(optimizer.states)
        parts = [{"key": k, "slot": slot, "offset": self._offset_of(k)}
                 for k in keys for slot in optimizer.states[k]]
        arrays = [optimizer.states[k][slot] for k in keys for slot in optimizer.states[k]]
        meta = {"spec": optimizer.spec(), "counts": dict(optimizer.counts), "parts": parts,
                "sizes": [int(a.size) for a in arrays], "dtypes": [a.dtype.name for a in arrays]}
        self._send(identity, p.blob_message(p.STATES, meta, arrays, request=message.request))

    def _on_load_states(self, identity: bytes, rank: int, message: p.Message) -> None:
        """Worker 0 sends each state array of this server's parts in pieces (a BLOB: a small
        JSON naming key, slot, dtype, element offset, size and the key's update count, then
        the bytes), then a JSON message with the number of pieces; only that one swaps the
        optimizer's states, and only when every array arrived whole."""
        optimizer = self._require_optimizer()
        if message.dtype == p.BLOB:
            self._stage_state_piece(message)
            return
        pieces = p.integer(message.json(), "pieces", "LOAD_STATES", 0, 1 << 40)
        loading, self.loading = self.loading or {"arrays": {}, "counts": {}, "pieces": 0}, None
        arrays = loading["arrays"]
        short = [f"{key}/{slot}" for (key, slot), (array, filled) in arrays.items()
                 if filled != array.size]
        if pieces != loading["pieces"] or short:
            raise KVStoreError(f"load_optimizer_states: {loading['pieces']} of {pieces} pieces "
                               f"arrived; incomplete: {short[:5]}")
        states: dict[str, dict] = {}
        for (key, slot), (array, _) in arrays.items():
            states.setdefault(key, {})[slot] = array
        optimizer.states = states
        optimizer.counts = dict(loading["counts"])
        optimizer.num_update = max(optimizer.counts.values(), default=0)
        self._send(identity, p.Message(p.ACK, request=message.request))

    def _stage_state_piece(self, message: p.Message) -> None:
        meta, data = message.blob()
        what = "LOAD_STATES"
        key = p.text(meta, "key", what, max_length=0xFFFF)
        slot = p.text(meta, "slot", what, max_length=64)
        dtype = p.array_dtype(p.DTYPE_CODES.get(p.text(meta, "dtype", what, max_length=16), -1))
        offset = p.integer(meta, "offset", what, 0, 1 << 50)
        size = p.integer(meta, "size", what, 0, 1 << 50)
        count = p.integer(meta, "count", what, 0, 1 << 50)
        shard = next((s for s in self.by_key.get(key, ()) if s.holds(offset, size)), None)
        if shard is None or len(data) != size * dtype.itemsize:
            raise p.ProtocolError(f"{what}: elements [{offset}, +{size}) of key {key!r} are "
                                  f"not a part on this server, or {len(data)} bytes do not "
                                  f"hold them")
        loading = self.loading = self.loading or {"arrays": {}, "counts": {}, "pieces": 0}
        slots = sum(1 for k, _ in loading["arrays"] if k == key)
        entry = loading["arrays"].get((key, slot))
        if entry is None:
            if slots >= MAX_STATE_SLOTS:
                raise p.ProtocolError(f"{what}: more than {MAX_STATE_SLOTS} state slots for "
                                      f"key {key!r}")
            entry = loading["arrays"][(key, slot)] = (np.empty(shard.size, dtype), 0)
        array, filled = entry
        if array.dtype != dtype or offset - shard.offset != filled or \
                filled + size > array.size:
            raise p.ProtocolError(f"{what}: key {key!r} slot {slot!r}: elements [{offset}, "
                                  f"+{size}) of {dtype} where element "
                                  f"{shard.offset + filled} of {array.dtype} was due")
        array[filled:filled + size] = np.frombuffer(data, dtype=dtype)
        loading["arrays"][(key, slot)] = (array, filled + size)
        loading["counts"][key] = count
        loading["pieces"] += 1

    def _offset_of(self, key: str) -> int:
        return next((offset for (k, offset) in self.shards if k == key), 0)

    def _require_optimizer(self) -> optim.Optimizer:
        if self.optimizer is None:
            raise KVStoreError(f"server {self.rank} has no optimizer; call set_optimizer "
                               f"first")
        return self.optimizer

    # -- sending ---------------------------------------------------------------------------

    def _reply_error(self, identity: bytes, message: p.Message, text: str) -> None:
        log.warning("server %d: %s", self.rank, text)
        self._send(identity, p.json_message(p.ERROR, {"message": f"server {self.rank}: "
                                                                  f"{text}"},
                                            request=message.request, key=message.key))

    def _send(self, identity: bytes, message: p.Message) -> None:
        self.socket.send_multipart([identity] + p.encode(message), copy=False)


class StragglerWatch:
    """With MIXRT_KV_VERBOSE=1: how long each worker's push lands after the round's first
    (an average over recent rounds); a worker far behind the typical worker (the lower
    median, so that with two workers the prompt one is the yardstick) is reported by
    name."""

    WINDOW, MIN_LAG, FACTOR, EVERY = 20, 0.05, 3.0, 10.0

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.lags: dict[int, deque] = {}
        self.reported: dict[int, float] = {}

    def round_done(self, shard: Shard, names: dict) -> None:
        if not self.enabled or len(shard.arrived) < 2:
            return
        first = min(shard.arrived.values())
        for rank, arrived in shard.arrived.items():
            self.lags.setdefault(rank, deque(maxlen=self.WINDOW)).append(arrived - first)
        averages = {rank: sum(lags) / len(lags) for rank, lags in self.lags.items()}
        typical = statistics.median_low(averages.values())
        now = time.monotonic()
        for rank, lag in averages.items():
            if lag > max(self.MIN_LAG, self.FACTOR * typical) and \
                    now - self.reported.get(rank, -1e9) > self.EVERY:
                self.reported[rank] = now
                name = names.get(f"worker {rank}", f"worker {rank}")
                log.warning("straggler: %s pushes %.3f s after the first worker, the "
                            "typical worker %.3f s (averages over the last %d rounds)", name,
                            lag, typical, len(self.lags[rank]))


def run_server(config: Config) -> int:
    server = Server(config)
    return server.run()

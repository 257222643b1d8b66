"""The scheduler: the one address everybody knows. It admits the servers and workers, gives
each its rank and the servers' addresses, runs barriers, watches heartbeats, and when a peer
dies, fails or goes silent tells every other process, which then exits naming that peer.

It keeps no data: pushes and pulls go straight from workers to servers.

Registration is open until the job is complete (each role up to its count), then closed.
At admission every worker gets a ticket, a random string that the servers also get and ask
for in its HELLO, so no other connection can speak for that rank. Every frame is decoded
with its size bounded by ZeroMQ (``MAXMSGSIZE``) and its JSON by ``protocol.json``; only a
registered peer's messages count, barriers and departures only from workers. A frame that
fails a check is logged with the sender's identity and dropped; none stops the scheduler.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass, field

import zmq

from mixrt.base.errors import KVStoreError, KVTimeoutError, PeerLostError
from mixrt.kvstore.dist import protocol as p
from mixrt.kvstore.dist.config import Config
from mixrt.kvstore.dist.security import check_bind, secure_server

log = logging.getLogger("mixrt.kvstore.scheduler")
CONTROL_FRAME = 64 << 10   # the scheduler's messages are small


@dataclass
class Peer:
    identity: bytes
    role: str
    host: str
    pid: int
    hint: int | None
    address: str = ""
    rank: int = -1
    last_seen: float = field(default_factory=time.monotonic)
    done: bool = False
    rounds: int = 0

    @property
    def name(self) -> str:
        return f"{self.role} {self.rank} (pid {self.pid} on {self.host})"


class Scheduler:
    def __init__(self, config: Config, context: zmq.Context | None = None):
        self.config = config
        self.context = context or zmq.Context.instance()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 1000)
        self.socket.setsockopt(zmq.MAXMSGSIZE, CONTROL_FRAME)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 0)
        check_bind(config.root_uri, config, "scheduler")
        secure_server(self.socket, config)
        self.socket.bind(f"tcp://{_bind_host(config.root_uri)}:{config.root_port}")
        self.peers: dict[bytes, Peer] = {}
        self.admitted = False
        self.barrier: dict[bytes, tuple[int, int]] = {}  # identity -> (request, rounds)
        self.started = time.monotonic()
        self.dropped = 0

    # -- the loop --------------------------------------------------------------------------

    def run(self) -> int:
        """Serve until every worker has left (0); a lost peer raises PeerLostError."""
        try:
            while not self._finished():
                if self.socket.poll(int(self.config.heartbeat * 1000)):
                    self._receive()
                self._check_liveness()
            self._broadcast(p.Message(p.SHUTDOWN), roles=("server",))
            return 0
        finally:
            self.socket.close(linger=1000)

    def _finished(self) -> bool:
        workers = self._role("worker")
        return self.admitted and all(peer.done for peer in workers)

    def _receive(self) -> None:
        identity, *frames = self.socket.recv_multipart(copy=True)
        try:
            message = p.decode(frames, CONTROL_FRAME)
            self._dispatch(identity, message)
        except p.ProtocolError as exc:
            self._drop(identity, exc)
        except KVStoreError:
            raise  # the job's own failure (a lost peer): the scheduler stops with it
        except Exception as exc:  # noqa: BLE001  (no frame may stop the scheduler)
            self._drop(identity, f"{type(exc).__name__}: {exc}")

    def _dispatch(self, identity: bytes, message: p.Message) -> None:
        peer = self.peers.get(identity)
        handler, roles = self._handlers().get(message.type, (None, ()))
        if handler is None:
            raise p.ProtocolError(f"the scheduler does not take {message.type_name}")
        if message.type != p.REGISTER and (peer is None or peer.role not in roles):
            raise p.ProtocolError(f"{message.type_name} from "
                                  f"{'an unregistered peer' if peer is None else peer.name}")
        if peer is not None:
            peer.last_seen = time.monotonic()
        handler(identity, peer, message)

    def _handlers(self) -> dict:
        """type -> (handler, the roles that may send it)."""
        both = ("server", "worker")
        return {p.REGISTER: (self._on_register, both), p.HEARTBEAT: (self._on_heartbeat, both),
                p.BARRIER: (self._on_barrier, ("worker",)), p.BYE: (self._on_bye, ("worker",)),
                p.ABORT: (self._on_abort, both)}

    def _drop(self, identity: bytes, reason) -> None:
        self.dropped += 1
        if self.dropped <= 20 or self.dropped % 1000 == 0:
            peer = self.peers.get(identity)
            who = peer.name if peer is not None else "an unregistered peer"
            log.warning("scheduler: dropped a bad message from %s (connection %r; %d so far): "
                        "%s", who, identity[:40], self.dropped, reason)

    # -- admission -------------------------------------------------------------------------

    def _on_register(self, identity: bytes, peer, message: p.Message) -> None:
        body = message.json()
        role = p.text(body, "role", "REGISTER", choices=("server", "worker"))
        wanted = self.config.num_servers if role == "server" else self.config.num_workers
        if peer is not None:
            raise p.ProtocolError(f"a second REGISTER from {peer.name}")
        if self.admitted or len(self._role(role)) >= wanted:
            log.warning("scheduler: refused a %s's registration (connection %r): the job's "
                        "%d %s(s) are there", role, identity[:40], wanted, role)
            self._send(identity, p.json_message(p.ERROR, {
                "message": f"registration refused: the job's {wanted} {role}(s) have "
                           f"registered"}))
            return
        hint = body.get("hint")
        if hint is not None:
            hint = p.integer(body, "hint", "REGISTER", 0, wanted - 1)
        address = p.text(body, "address", "REGISTER", max_length=300)
        if role == "server" and not address.startswith("tcp://"):
            raise p.ProtocolError(f"a server registered the address {address[:60]!r}; "
                                  f"expected tcp://HOST:PORT")
        self.peers[identity] = Peer(identity, role, p.text(body, "host", "REGISTER"),
                                    p.integer(body, "pid", "REGISTER", 0, 1 << 31), hint,
                                    address)
        servers, workers = self._role("server"), self._role("worker")
        if len(servers) == self.config.num_servers and len(workers) == self.config.num_workers:
            self._admit(servers, workers)

    def _admit(self, servers: list[Peer], workers: list[Peer]) -> None:
        _assign_ranks(servers)
        _assign_ranks(workers)
        servers.sort(key=lambda peer: peer.rank)
        book = {"servers": [s.address for s in servers], "num_workers": len(workers),
                "num_servers": len(servers),
                "names": {f"{peer.role} {peer.rank}": peer.name for peer in servers + workers}}
        tickets = [secrets.token_hex(16) for _ in workers]  # worker rank -> its ticket
        for peer in servers:
            self._send(peer.identity, p.json_message(p.WELCOME, dict(book, rank=peer.rank,
                                                                     tickets=tickets)))
        for peer in workers:
            self._send(peer.identity, p.json_message(p.WELCOME, dict(
                book, rank=peer.rank, ticket=tickets[peer.rank])))
        self.admitted = True
        log.info("scheduler: %d servers and %d workers admitted", len(servers), len(workers))

    # -- liveness --------------------------------------------------------------------------

    def _on_heartbeat(self, identity: bytes, peer: Peer, message: p.Message) -> None:
        self._send(identity, p.Message(p.HEARTBEAT_ACK))

    def _check_liveness(self) -> None:
        now = time.monotonic()
        if not self.admitted and now - self.started > self.config.timeout:
            missing = (f"{self.config.num_servers - len(self._role('server'))} server(s) and "
                       f"{self.config.num_workers - len(self._role('worker'))} worker(s)")
            self._fail(KVTimeoutError(f"the job did not assemble within "
                                      f"{self.config.timeout:.0f} s: {missing} never "
                                      f"registered with the scheduler at "
                                      f"{self.config.root_address}"))
        for peer in list(self.peers.values()):
            if not peer.done and now - peer.last_seen > self.config.heartbeat_timeout:
                self._lose(peer, f"no heartbeat for {now - peer.last_seen:.1f} s")

    def _lose(self, peer: Peer, reason: str) -> None:
        text = f"lost {peer.name}: {reason}"
        self._fail(PeerLostError(text), lost=peer)

    def _fail(self, error: Exception, lost: Peer | None = None, kind=p.PEER_LOST) -> None:
        """Tell everybody else, then stop this process with the error."""
        body = {"message": str(error), "peer": lost.name if lost else "scheduler"}
        self._broadcast(p.json_message(kind, body), skip=lost)
        time.sleep(0.2)  # let the broadcast leave before the socket closes
        raise error

    def _on_abort(self, identity: bytes, peer: Peer, message: p.Message) -> None:
        reason = p.text(message.json(), "message", "ABORT", max_length=4000)[:2000]
        peer.done = True
        self._fail(PeerLostError(f"{peer.name} failed: {reason}"), lost=peer, kind=p.ABORT)

    # -- barriers and departures -----------------------------------------------------------

    def _on_barrier(self, identity: bytes, peer: Peer, message: p.Message) -> None:
        peer.rounds = p.integer(message.json(), "rounds", "BARRIER", 0, 1 << 62)
        self.barrier[identity] = (message.request, peer.rounds)
        self._publish_status()
        self._settle_barrier()

    def _on_bye(self, identity: bytes, peer: Peer, message: p.Message) -> None:
        peer.rounds = p.integer(message.json(), "rounds", "BYE", 0, 1 << 62,
                                default=peer.rounds)
        peer.done = True
        self._publish_status()
        self._settle_barrier()

    def _settle_barrier(self) -> None:
        if not self.barrier:
            return
        workers = self._role("worker")
        departed = [w for w in workers if w.done]
        if departed:
            names = ", ".join(f"{w.name} after {w.rounds} steps" for w in departed)
            self._reply_barrier(p.ERROR, f"a barrier cannot complete: {names} left the job "
                                         f"while others wait at it; every worker must run "
                                         f"the same number of batches and barriers")
            return
        if len(self.barrier) < len(workers):
            return
        rounds = {self.peers[i].name: r for i, (_, r) in self.barrier.items()}
        if len(set(rounds.values())) > 1:
            listed = ", ".join(f"{name}: {r}" for name, r in sorted(rounds.items()))
            self._reply_barrier(p.ERROR, f"workers reached the barrier after different "
                                         f"numbers of steps ({listed}); give every worker the "
                                         f"same number of batches (NDArrayIter(num_parts="
                                         f"num_workers, part_index=rank) does)")
            return
        self._reply_barrier(p.BARRIER_DONE, "")

    def _reply_barrier(self, kind: int, text: str) -> None:
        for identity, (request, _) in self.barrier.items():
            self._send(identity, p.json_message(kind, {"message": text}, request=request))
        self.barrier.clear()
        self._publish_status()

    def _publish_status(self) -> None:
        """Workers blocked in a pull use this to notice a peer that will never push."""
        waiting = {self.peers[i].name: r for i, (_, r) in self.barrier.items()}
        departed = {w.name: w.rounds for w in self._role("worker") if w.done}
        self._broadcast(p.json_message(p.STATUS, {"barrier": waiting, "departed": departed}),
                        roles=("worker",))

    # -- sending ---------------------------------------------------------------------------

    def _role(self, role: str) -> list[Peer]:
        return [peer for peer in self.peers.values() if peer.role == role]

    def _broadcast(self, message: p.Message, roles=("server", "worker"), skip=None) -> None:
        for peer in self.peers.values():
            if peer.role in roles and peer is not skip and not peer.done:
                self._send(peer.identity, message)

    def _send(self, identity: bytes, message: p.Message) -> None:
        try:
            self.socket.send_multipart([identity] + p.encode(message), flags=zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # a full or vanished peer must not stop the scheduler
            log.warning("scheduler: could not send %s: %s", message.type_name, exc)


def _assign_ranks(peers: list[Peer]) -> None:
    """Hints first (``mixrt launch`` numbers processes), then order of arrival."""
    taken = set()
    for peer in peers:
        if peer.hint is not None and 0 <= peer.hint < len(peers) and peer.hint not in taken:
            peer.rank = peer.hint
            taken.add(peer.hint)
    free = iter(r for r in range(len(peers)) if r not in taken)
    for peer in peers:
        if peer.rank < 0:
            peer.rank = next(free)


def _bind_host(host: str) -> str:
    return "127.0.0.1" if host == "localhost" else host


def run_scheduler(config: Config) -> int:
    try:
        return Scheduler(config).run()
    except KVStoreError:
        raise
    except zmq.ZMQError as exc:
        raise KVStoreError(f"scheduler cannot serve on {config.root_address}: {exc}") from None

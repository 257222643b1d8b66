"""A server's or worker's line to the scheduler, kept by a background thread.

The thread registers the process, heartbeats every ``MIXRT_KV_HEARTBEAT`` seconds whatever
the main thread is doing, and listens: a ``PEER_LOST`` or ``ABORT`` from the scheduler, or
a scheduler silent for ``MIXRT_KV_HEARTBEAT_TIMEOUT``, becomes ``link.error``. The main
thread's waits check it every 100 ms; a worker's main thread busy elsewhere is interrupted
(SIGUSR1 raises the error there), and a process that still runs ``EXIT_GRACE`` seconds
later is ended with exit status 1, so no process outlives a lost peer by more than the
heartbeat timeout plus a few seconds.

Requests of the main thread (barrier, bye, abort) reach the thread through an inproc pipe,
because a ZeroMQ socket must stay with one thread.
"""

from __future__ import annotations

import logging
import os
import signal
import socket as pysocket
import sys
import threading
import time
import uuid

import zmq

from mixrt.base.errors import KVStoreError, KVTimeoutError, PeerLostError
from mixrt.kvstore.dist import protocol as p
from mixrt.kvstore.dist.config import Config
from mixrt.kvstore.dist.security import secure_client

log = logging.getLogger("mixrt.kvstore")
EXIT_GRACE = 5.0


class SchedulerLink:
    def __init__(self, config: Config, role: str, *, address: str = "",
                 context: zmq.Context | None = None):
        self.config, self.role = config, role
        self.context = context or zmq.Context.instance()
        self.error: Exception | None = None
        self.shutdown = threading.Event()
        self.welcome: dict | None = None
        self.status: dict = {"barrier": {}, "departed": {}}
        self._welcomed = threading.Event()
        self._replies: dict[int, p.Message] = {}
        self._replied = threading.Condition()
        self._requests = 0
        self._pipe_address = f"inproc://mixrt-kv-link-{uuid.uuid4().hex}"
        self._pipe = self.context.socket(zmq.PAIR)
        self._pipe.bind(self._pipe_address)
        self._pipe_lock = threading.Lock()
        self._on_error = []
        self._register = {"role": role, "host": pysocket.gethostname(), "pid": os.getpid(),
                          "hint": config.role_index, "address": address}
        self._thread = threading.Thread(target=self._run, name=f"mixrt-kv-{role}-link",
                                        daemon=True)
        self._thread.start()

    # -- the main thread's side ------------------------------------------------------------

    def wait_welcome(self) -> dict:
        """Block until the scheduler has admitted the whole job; returns the address book."""
        deadline = time.monotonic() + self.config.timeout
        while not self._welcomed.wait(0.1):
            self.check()
            if time.monotonic() > deadline:
                raise KVTimeoutError(
                    f"{self.role}: the scheduler at {self.config.root_address} did not admit "
                    f"the job within {self.config.timeout:.0f} s (is it running, and do "
                    f"DMLC_NUM_SERVER/DMLC_NUM_WORKER match the processes started?)")
        self.check()
        return self.welcome

    def check(self) -> None:
        """Raise the error the link has seen (a lost peer), if any."""
        if self.error is not None:
            raise self.error

    def request(self, kind: int, body: dict, what: str, timeout: float | None = None,
                waiting=None) -> p.Message:
        """Send ``kind`` to the scheduler and wait for the reply with the same request id,
        checking the link (and ``waiting()``) every 100 ms."""
        request = self._send_from_main(kind, body)
        deadline = time.monotonic() + (timeout or self.config.timeout)
        with self._replied:
            while request not in self._replies:
                self._replied.wait(0.1)
                self.check()
                if waiting is not None:
                    waiting()
                if time.monotonic() > deadline:
                    raise KVTimeoutError(f"{what}: no answer from the scheduler within "
                                         f"{timeout or self.config.timeout:.0f} s")
            reply = self._replies.pop(request)
        if reply.type == p.ERROR:
            raise KVStoreError(f"{what}: {reply.json().get('message')}")
        return reply

    def notify(self, kind: int, body: dict) -> None:
        """Send without waiting (bye, abort)."""
        self._send_from_main(kind, body)

    def on_error(self, callback) -> None:
        self._on_error.append(callback)

    def close(self, wait: float = 2.0) -> None:
        self.shutdown.set()
        self._thread.join(wait)
        with self._pipe_lock:
            self._pipe.close(linger=0)

    def _send_from_main(self, kind: int, body: dict) -> int:
        with self._pipe_lock:
            self._requests += 1
            request = self._requests
            self._pipe.send_multipart(p.encode(p.json_message(kind, body, request=request)))
        return request

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        scheduler = self.context.socket(zmq.DEALER)
        scheduler.setsockopt(zmq.LINGER, 500)
        scheduler.setsockopt(zmq.IDENTITY, f"{self.role}-{uuid.uuid4().hex}".encode())
        secure_client(scheduler, self.config)
        scheduler.connect(self.config.root_address)
        pipe = self.context.socket(zmq.PAIR)
        pipe.connect(self._pipe_address)
        try:
            self._serve(scheduler, pipe)
        except Exception as exc:  # noqa: BLE001  (the thread must report, not die quietly)
            self._set_error(KVStoreError(f"{self.role}: the scheduler link failed: {exc}"))
        finally:
            scheduler.close(linger=500)
            pipe.close(linger=0)

    def _serve(self, scheduler: zmq.Socket, pipe: zmq.Socket) -> None:
        scheduler.send_multipart(p.encode(p.json_message(p.REGISTER, self._register)))
        poller = zmq.Poller()
        poller.register(scheduler, zmq.POLLIN)
        poller.register(pipe, zmq.POLLIN)
        interval = self.config.heartbeat
        last_beat = last_heard = time.monotonic()
        while not self.shutdown.is_set():
            events = dict(poller.poll(int(interval * 1000 / 2)))
            now = time.monotonic()
            if scheduler in events:
                last_heard = now
                self._from_scheduler(scheduler.recv_multipart(copy=True))
            if pipe in events:
                scheduler.send_multipart(pipe.recv_multipart(copy=True))
            if now - last_beat >= interval:
                scheduler.send_multipart(p.encode(p.Message(p.HEARTBEAT)), flags=zmq.NOBLOCK)
                last_beat = now
            if self.error is None and now - last_heard > self.config.heartbeat_timeout:
                self._set_error(PeerLostError(
                    f"{self.role}: lost the scheduler at {self.config.root_address}: no "
                    f"answer for {now - last_heard:.1f} s"))
        while pipe.poll(0):  # a bye or abort sent just before close still goes out
            scheduler.send_multipart(pipe.recv_multipart(copy=True))

    def _from_scheduler(self, frames: list) -> None:
        try:
            message = p.decode(frames, 1 << 20)
        except p.ProtocolError as exc:
            log.warning("%s: dropped a malformed message from the scheduler: %s", self.role, exc)
            return
        if message.type == p.WELCOME:
            self.welcome = message.json()
            self._welcomed.set()
        elif message.type == p.STATUS:
            self.status = message.json()
        elif message.type in (p.PEER_LOST, p.ABORT):
            self._set_error(PeerLostError(f"{self.role}: {message.json().get('message')}"))
        elif message.type == p.SHUTDOWN:
            self.shutdown.set()
        elif message.type == p.ERROR and message.request == 0:
            self._set_error(KVStoreError(f"{self.role}: {message.json().get('message')}"))
        elif message.type in (p.BARRIER_DONE, p.ERROR):
            if message.type == p.BARRIER_DONE:
                # nobody waits at a barrier any more; clearing it here, in message order,
                # keeps the main thread (already past the barrier) from reading the status
                # sent before it and taking the others for workers that stopped early
                self.status = dict(self.status, barrier={})
            with self._replied:
                self._replies[message.request] = message
                self._replied.notify_all()

    def _set_error(self, error: Exception) -> None:
        if self.error is not None:
            return
        self.error = error
        log.error("%s", error)
        for callback in self._on_error:
            callback(error)


def interrupt_main_on_error(link: SchedulerLink) -> None:
    """Make a lost peer end this process even while its main thread computes: SIGUSR1
    raises the error in the main thread, and after EXIT_GRACE seconds the process exits."""
    main = threading.main_thread()
    installed = False
    if threading.current_thread() is main and \
            signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None):
        def raise_error(signum, frame):
            if link.error is not None:
                raise link.error
        signal.signal(signal.SIGUSR1, raise_error)
        installed = True

    def on_error(error: Exception) -> None:
        if installed:
            signal.pthread_kill(main.ident, signal.SIGUSR1)
        threading.Thread(target=_exit_later, args=(error,), daemon=True).start()

    link.on_error(on_error)


def _exit_later(error: Exception) -> None:
    time.sleep(EXIT_GRACE)
    print(f"mixrt.kvstore: {type(error).__name__}: {error} (exiting)", file=sys.stderr,
          flush=True)
    os._exit(1)

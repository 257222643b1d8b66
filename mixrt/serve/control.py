"""One repository across the workers: a load or unload through the repository API reaches
every worker before it is answered.

Each worker keeps one end of a Unix socket pair to the supervisor. A worker that is asked
to load or unload a model does it, then sends ``{"op", "name", "id"}``; the supervisor hands
it to every other worker, waits for each to answer, and answers the first with the first
error or none. So when the API call returns, every worker serves the same models (a worker
that dies in between is left out, and replays on its restart). The supervisor keeps the
operations in order and replays them to a worker it restarts. Messages are JSON lines.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import selectors
import socket
import threading

logger = logging.getLogger("mixrt.serve")


class WorkerChannel:
    """The worker's end: ``await channel.share(op, name)`` after doing ``op`` locally;
    operations the supervisor hands over are applied with ``apply(op, name)``."""

    def __init__(self, sock: socket.socket, apply):
        self._sock = sock
        self._apply = apply
        self._ids = itertools.count()
        self._waiting: dict[int, asyncio.Future] = {}
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def start(self) -> None:
        self._reader, self._writer = await asyncio.open_unix_connection(sock=self._sock)
        asyncio.get_running_loop().create_task(self._listen())

    async def share(self, op: str, name: str) -> None:
        """Hand ``op`` on ``name`` to the other workers; raises if one of them failed it."""
        ident = next(self._ids)
        answer = asyncio.get_running_loop().create_future()
        self._waiting[ident] = answer
        self._send({"op": op, "name": name, "id": ident})
        error = await answer
        if error:
            raise RuntimeError(error)

    async def _listen(self) -> None:
        while line := await self._reader.readline():
            message = json.loads(line)
            if "done" in message:
                future = self._waiting.pop(message["done"], None)
                if future is not None and not future.done():
                    future.set_result(message.get("error"))
                continue
            error = None
            try:
                await self._apply(message["apply"], message["name"])
            except Exception as exc:  # noqa: BLE001 - told to the worker that asked
                error = f"{message['apply']} of {message['name']} failed in a worker: {exc}"
                logger.error("%s", error)
            self._send({"applied": message["id"], "error": error})

    def _send(self, message: dict) -> None:
        self._writer.write(json.dumps(message).encode() + b"\n")


class SupervisorChannels:
    """The supervisor's ends, served by one thread."""

    def __init__(self):
        self._selector = selectors.DefaultSelector()
        self._ends: dict[int, socket.socket] = {}  # worker index -> the supervisor's end
        self._buffers: dict[int, bytes] = {}
        self._history: list[dict] = []  # the operations so far, in order, for restarts
        self._ids = itertools.count()
        # an operation handed over: its id -> (the asking worker's index and id, the
        # workers yet to answer, the first error)
        self._pending: dict[int, list] = {}
        self._lock = threading.Lock()

    def pair(self, index: int) -> socket.socket:
        """A new socket pair for worker ``index`` (before its fork): the worker's end."""
        ours, theirs = socket.socketpair()
        with self._lock:
            old = self._ends.pop(index, None)
            if old is not None:
                self._selector.unregister(old)
                old.close()
            self._ends[index] = ours
            self._buffers[index] = b""
            self._selector.register(ours, selectors.EVENT_READ, index)
        return theirs

    def close_in_worker(self) -> None:
        """In a newly forked worker: the supervisor's ends it inherited are not its own."""
        for sock in self._ends.values():
            sock.close()

    def replay(self, index: int) -> None:
        """Hand a restarted worker the operations it missed."""
        with self._lock:
            for message in self._history:
                self._write(index, {"apply": message["op"], "name": message["name"],
                                    "id": -1})

    def worker_gone(self, index: int) -> None:
        """A dead worker answers nothing: stop waiting for it."""
        with self._lock:
            for ident in list(self._pending):
                self._answered(ident, index, None)

    def serve_forever(self) -> None:
        thread = threading.Thread(target=self._loop, name="mixrt-repository", daemon=True)
        thread.start()

    def _loop(self) -> None:
        while True:
            for key, _ in self._selector.select(timeout=1.0):
                with self._lock:
                    self._read(key.data, key.fileobj)

    def _read(self, index: int, sock: socket.socket) -> None:
        if self._ends.get(index) is not sock:
            return
        try:
            chunk = sock.recv(65536)
        except OSError:
            chunk = b""
        if not chunk:
            self._selector.unregister(sock)
            del self._ends[index]
            return
        self._buffers[index] += chunk
        *lines, self._buffers[index] = self._buffers[index].split(b"\n")
        for line in lines:
            self._handle(index, json.loads(line))

    def _handle(self, index: int, message: dict) -> None:
        if "applied" in message:
            self._answered(message["applied"], index, message.get("error"))
            return
        self._history.append(message)
        ident = next(self._ids)
        others = [i for i in self._ends if i != index]
        self._pending[ident] = [index, message["id"], set(others), None]
        for other in others:
            self._write(other, {"apply": message["op"], "name": message["name"],
                                "id": ident})
        self._answered(ident, None, None)

    def _answered(self, ident: int, index, error) -> None:
        entry = self._pending.get(ident)
        if entry is None:
            return
        entry[2].discard(index)
        entry[3] = entry[3] or error
        if not entry[2]:
            del self._pending[ident]
            self._write(entry[0], {"done": entry[1], "error": entry[3]})

    def _write(self, index: int, message: dict) -> None:
        sock = self._ends.get(index)
        if sock is not None:
            try:
                sock.sendall(json.dumps(message).encode() + b"\n")
            except OSError:
                pass  # its death is noticed by the supervisor's wait

"""``mixrt serve``: a supervisor and its worker processes, each a KServe model server.

The supervisor prepares every model (``runtime.prepare``: the session over the memory-mapped
``.mxr``, the warm-up that compiles its kernels, the batching check), binds the HTTP
socket, and only then forks ``--workers`` processes. Each worker serves KServe's REST app
(``rest.py``) with uvicorn on the inherited socket and KServe's gRPC servicer
(``grpc_service.py``) on the gRPC port (shared with SO_REUSEPORT, which gRPC sets), and
finds its models prepared: their weights, packed panels and compiled kernels are the
supervisor's pages, shared copy-on-write rather than loaded once per worker.

KServe's own ``ModelServer`` is not the entry point: it binds its ports itself and, with
several workers, has each process load the models on its own, so neither the shared
weights nor a port picked once for all workers would survive. The worker assembles the
server from KServe's public parts instead: its data plane, v2 REST endpoints, gRPC
servicer, model and model repository classes.

The supervisor serves ``/metrics``, the sum of its workers' (``metrics.py``), restarts a
worker that dies, and on SIGTERM or SIGINT passes the signal on and waits for the workers
to finish the requests they hold.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn
from prometheus_client import start_http_server

from mixrt.base.errors import InputError, MixrtError
from mixrt.ops.device import device_named
from mixrt.runtime import collector
from mixrt.serve import metrics, repository, runtime
from mixrt.serve.control import SupervisorChannels, WorkerChannel
from mixrt.serve.outcomes import NotFound, RunFailed

logger = logging.getLogger("mixrt.serve")

# how long the supervisor waits for its workers to finish their requests after SIGTERM, by
# default (Kubernetes' default grace period is 30 s)
SHUTDOWN_GRACE_S = 25.0
RESTART_PAUSE_S = 1.0  # between a worker's death and its replacement
# a worker that dies this soon after its start, this many times in a row, is not started
# again: the server stops (a model each worker loads itself, a GPU model, that cannot load)
EARLY_DEATH_S = 10.0
EARLY_DEATHS = 3


@dataclass
class ServeOptions:
    source: str  # a model file or a repository folder
    name: str | None = None  # a model file's name (default: the file's stem)
    host: str = "0.0.0.0"
    http_port: int = 8080
    grpc_port: int = 8081
    metrics_port: int = 8082
    workers: int = 1
    max_batch_size: int = 0
    max_delay_ms: float = runtime.DEFAULT_MAX_DELAY_MS
    # requests waiting per model beyond those running; past it a 503 with Retry-After
    # (None: runtime.default_max_queue of the batch size; 0: none waits)
    max_queue: int | None = None
    device: str = "cpu"
    max_body_mb: float = 64.0
    log_level: str = "info"
    grace_s: float = SHUTDOWN_GRACE_S  # after SIGTERM, then the workers left are killed
    # a request unanswered by then gets a 504 naming it, and its run ends (0: no limit)
    request_timeout_s: float = runtime.DEFAULT_REQUEST_TIMEOUT_S
    # prepare the models (compile their kernels into the cache, run the batching check) and
    # exit: a container image's build step
    prepare_only: bool = False
    extra: dict = field(init=False, default_factory=dict)

    def __post_init__(self):
        if self.workers < 1:
            raise InputError(f"--workers {self.workers}: at least one worker serves")
        if self.max_batch_size < 0 or self.max_delay_ms < 0:
            raise InputError(f"--max-batch-size {self.max_batch_size} and --max-delay-ms "
                             f"{self.max_delay_ms}: neither may be negative")
        if self.max_queue is not None and self.max_queue < 0:
            raise InputError(f"--max-queue {self.max_queue}: 0 (none waits) or more")
        if self.request_timeout_s < 0:
            raise InputError(f"--request-timeout-s {self.request_timeout_s}: 0 (no limit) "
                             f"or more")
        device_named(self.device)  # its spelling, without starting CUDA before the fork
        self.extra = {"max_batch_size": self.max_batch_size,
                      "max_delay_ms": self.max_delay_ms, "device": self.device,
                      "request_timeout_s": self.request_timeout_s}
        if self.max_queue is not None:
            self.extra["max_queue"] = self.max_queue

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * (1 << 20))


def serve(options: ServeOptions) -> int:
    """Run the server until SIGTERM or SIGINT; the exit status."""
    _configure_logging(options.log_level)
    metrics.use_folder(tempfile.mkdtemp(prefix="mixrt-metrics-"))
    repo_args = _repository_args(options)
    models = repository.entries(**repo_args)
    # process-wide switches, so set once for the largest batch of any model, before any
    # model is prepared
    runtime.serving_environment(max((int(m.extra.get("max_batch_size", 0))
                                     for m in models), default=0))
    for entry in models:  # before the fork: the workers share what this prepares
        device = str(entry.extra.get("device", "cpu"))
        if device.startswith("gpu") and not options.prepare_only:
            continue  # CUDA does not survive a fork: each worker prepares its own
        prepared = runtime.prepare(entry.path, device,
                                   int(entry.extra.get("max_batch_size", 0)))
        logger.info("prepared %s version %s: batching %s", entry.name, entry.version,
                    "on" if prepared.batching else f"off ({prepared.reason})")
    if options.prepare_only:
        return 0
    # KServe and what it brings (FastAPI, pydantic, grpc, the kubernetes client) imported
    # here, before the fork, are pages the workers share; imported by each worker they had
    # added ~80 MB to each. Frozen, their ~100,000 objects stay out of every worker's full
    # collections, as the sessions' do (and their pages are not written by a pass's walk)
    _front_ends()
    collector.freeze_what_lives()
    http = _listening_socket(options.host, options.http_port)
    # a port given as 0 is picked here, once, so that every worker takes the same one
    options.http_port = http.getsockname()[1]
    grpc_hold = _reserved_port(options.host, options.grpc_port)
    options.grpc_port = grpc_hold.getsockname()[1]
    return Supervisor(options, repo_args, http).run()


def _repository_args(options: ServeOptions) -> dict:
    """A model file; a folder that holds one (KServe's /mnt/models), served under --name or
    the folder's; or a repository."""
    source = options.source
    if os.path.isdir(source) and repository.model_file(Path(source)) is not None:
        name = options.name or Path(os.path.abspath(source)).name
        source = str(repository.model_file(Path(source)))
        return {"root": os.path.dirname(os.path.abspath(source)), "extra": options.extra,
                "single": {"name": name, "path": source}}
    if os.path.isfile(source):
        name = options.name or os.path.splitext(os.path.basename(source))[0]
        return {"root": os.path.dirname(os.path.abspath(source)),
                "extra": options.extra, "single": {"name": name, "path": source}}
    repository.check_repository(source)
    return {"root": source, "extra": options.extra}


def _listening_socket(host: str, port: int) -> socket.socket:
    sock = _bound_socket(host, port, socket.SO_REUSEADDR, "listen on")
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


def _reserved_port(host: str, port: int) -> socket.socket:
    """A socket bound to ``port`` with SO_REUSEPORT and never listening: it keeps the port
    (a free one for 0) for the workers' gRPC servers, which bind it beside it (gRPC sets
    SO_REUSEPORT on Linux), while connections go only to listening sockets."""
    return _bound_socket(host, port, socket.SO_REUSEPORT, "keep for gRPC")


def _bound_socket(host: str, port: int, option: int, purpose: str) -> socket.socket:
    # IPPROTO_TCP named, not left 0: the event loop turns Nagle's algorithm off only on
    # sockets that say they are TCP, and with it on, an answer sent as head and body waited
    # for the client's delayed ACK, 40 ms a request on a kept-alive connection
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                         socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, option, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise InputError(f"cannot {purpose} {host}:{port}: {exc.strerror}") from None
    return sock


class Supervisor:
    def __init__(self, options: ServeOptions, repo_args: dict, http: socket.socket):
        self.options = options
        self.repo_args = repo_args
        self.http = http
        self.workers: dict[int, int] = {}  # pid -> worker index
        self.started: dict[int, float] = {}  # worker index -> when it last started
        self.early_deaths: dict[int, int] = {}  # worker index -> early deaths in a row
        self.stopping = False
        self.channels = SupervisorChannels()

    def run(self) -> int:
        for index in range(self.options.workers):
            self._start(index)
        self.channels.serve_forever()
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        scrape, _ = start_http_server(self.options.metrics_port, self.options.host,
                                      registry=metrics.aggregate_registry())
        self.options.metrics_port = scrape.server_port
        logger.info("serving on http %s:%d, grpc %d, metrics %d with %d worker(s)",
                    self.options.host, self.options.http_port, self.options.grpc_port,
                    self.options.metrics_port, self.options.workers)
        return self._watch()

    def _start(self, index: int) -> None:
        channel = self.channels.pair(index)
        pid = os.fork()
        if pid == 0:  # the worker
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            _end_with_the_supervisor()
            self.channels.close_in_worker()
            code = 1
            try:
                code = asyncio.run(_worker(self.options, self.repo_args, self.http, channel))
            except MixrtError as exc:  # a model that cannot load here: said, not a trace
                logger.error("worker %d could not start: %s", index, exc)
            except BaseException:  # noqa: BLE001 - told before the worker exits
                logger.exception("worker %d failed", index)
            finally:
                os._exit(code)
        channel.close()
        self.workers[pid] = index
        self.started[index] = time.monotonic()

    def _watch(self) -> int:
        """Wait on the workers, replacing any that dies, until all have ended after a
        signal; 1 where some had to be killed at the grace period's end or kept failing at
        their start, else 0."""
        deadline, killed, failed = None, False, False
        while self.workers:
            if self.stopping and deadline is None:
                deadline = time.monotonic() + self.options.grace_s
            if deadline is not None and time.monotonic() > deadline and not killed:
                logger.error("workers still busy %.1f s after the signal: killed",
                             self.options.grace_s)
                killed = True
                for pid in self.workers:
                    os.kill(pid, signal.SIGKILL)
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.2)
                continue
            index = self.workers.pop(pid, None)
            metrics.process_ended(pid)
            if index is not None:
                self.channels.worker_gone(index)
            if index is not None and not self.stopping:
                code = os.waitstatus_to_exitcode(status)
                if self._failing_at_start(index):
                    logger.error("worker %d (pid %d) ended with status %d within %.0f s of "
                                 "its start, %d times in a row: stopping (its error is "
                                 "above)", index, pid, code, EARLY_DEATH_S, EARLY_DEATHS)
                    self._stop(signal.SIGTERM, None)
                    failed = True
                    continue
                logger.error("worker %d (pid %d) ended with status %d; starting another",
                             index, pid, code)
                time.sleep(RESTART_PAUSE_S)
                self._start(index)
                self.channels.replay(index)
        return 1 if killed or failed else 0

    def _failing_at_start(self, index: int) -> bool:
        """Count an early death of worker ``index``; True once they are too many in a row."""
        early = time.monotonic() - self.started.get(index, 0.0) < EARLY_DEATH_S
        self.early_deaths[index] = self.early_deaths.get(index, 0) + 1 if early else 0
        return self.early_deaths[index] >= EARLY_DEATHS

    def _stop(self, signum, frame) -> None:
        del frame
        if self.stopping:
            return
        self.stopping = True
        logger.info("signal %d: finishing the requests in flight", signum)
        self.http.close()  # new connections are refused, not left waiting, once the
        # workers have closed their copies
        for pid in self.workers:
            os.kill(pid, signal.SIGTERM)


# prctl's option that sends the calling process a signal when its parent exits (Linux)
PR_SET_PDEATHSIG = 1


def _end_with_the_supervisor() -> None:
    """Have the kernel send this worker SIGTERM when the supervisor exits, however it ends
    (a SIGKILL gives it no chance to pass a signal on): a worker left behind would keep
    serving on the port with no one to restart or stop it. Linux only; elsewhere a no-op."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the supervisor ended before the call took effect
        os.kill(os.getpid(), signal.SIGTERM)


async def _worker(options: ServeOptions, repo_args: dict, http: socket.socket,
                  channel: socket.socket) -> int:
    """One worker: the models loaded (prepared already, by the supervisor, which imported
    the front ends too), then REST and gRPC served until SIGTERM; the requests in flight
    are answered before it returns."""
    grpc_service, model, rest, data_plane = _front_ends()
    repo = model.MixrtRepository(**repo_args)
    operations = SharedOperations(repo, channel)
    await operations.start()
    await repo.load_all()
    told_to_stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    web = _HttpServer(uvicorn.Config(
        rest.application(repo, operations, options.max_body_bytes), log_config=None,
        log_level=options.log_level, access_log=False, lifespan="off",
        timeout_graceful_shutdown=options.grace_s, timeout_keep_alive=65),
        lambda: loop.call_soon_threadsafe(told_to_stop.set))
    grpc_server = grpc_service.server(
        repo, data_plane(model_registry=repo), operations,
        f"{_grpc_host(options.host)}:{options.grpc_port}", options.max_body_bytes)
    await grpc_server.start()
    # uvicorn takes SIGTERM while it serves and raises it again when it has finished: by
    # then this handler, which lets the worker wind down, is the one it finds
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    stopping = loop.create_task(_stop_grpc_when(told_to_stop, grpc_server, options.grace_s))
    await web.serve(sockets=[http])
    await stopping
    for served in repo.get_models().values():  # what the batchers still hold
        for version in served.versions.values():
            await version.unload()
    return 0


def _front_ends():
    """The modules built on KServe (imported once the metrics' folder is set, so that
    KServe's own metrics are summed over the workers too). KServe reads the command line
    when it is imported; it is given none, since this one is mixrt's."""
    command_line, sys.argv = sys.argv, sys.argv[:1]
    try:
        from kserve.protocol.dataplane import DataPlane  # noqa: PLC0415

        from mixrt.serve import grpc_service, model, rest  # noqa: PLC0415
    finally:
        sys.argv = command_line
    return grpc_service, model, rest, DataPlane


class _HttpServer(uvicorn.Server):
    """uvicorn's server, which also tells ``on_exit`` when a signal tells it to stop, so
    that gRPC stops with it."""

    def __init__(self, config: uvicorn.Config, on_exit):
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig, frame) -> None:
        super().handle_exit(sig, frame)
        self._on_exit()


async def _stop_grpc_when(told: asyncio.Event, grpc_server, grace_s: float) -> None:
    """Stop gRPC, letting its calls finish within ``grace_s``, once uvicorn is told to
    stop."""
    await told.wait()
    await grpc_server.stop(grace_s)


def _grpc_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class SharedOperations:
    """The repository API's load and unload, done in this worker and then in every other
    (``control.py``) before they are answered."""

    def __init__(self, repo, sock: socket.socket):
        self.repo = repo
        self.channel = WorkerChannel(sock, self._apply)

    async def start(self) -> None:
        await self.channel.start()

    async def load(self, name: str) -> None:
        await self._apply("load", name)
        await self._share("load", name)

    async def unload(self, name: str) -> None:
        await self._apply("unload", name)
        await self._share("unload", name)

    async def _apply(self, op: str, name: str) -> None:
        if op == "load":
            await self.repo.load(name)
        elif self.repo.get_model(name) is None:
            raise NotFound(f"model {name} is not loaded")
        else:
            self.repo.unload(name)

    async def _share(self, op: str, name: str) -> None:
        try:
            await self.channel.share(op, name)
        except RuntimeError as exc:
            raise RunFailed(str(exc)) from None


def _configure_logging(level: str) -> None:
    """mixrt's own lines (each request's id where it is refused or fails; at debug, every
    request's) to stderr, as uvicorn and KServe write theirs; not through the root
    logger, which would print theirs twice."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(
        "%(asctime)s [mixrt] pid %(process)d %(levelname)s - %(message)s"))
    mixrt_logger = logging.getLogger("mixrt")
    mixrt_logger.handlers[:] = [handler]
    mixrt_logger.propagate = False
    mixrt_logger.setLevel(getattr(logging, level.upper(), logging.INFO))

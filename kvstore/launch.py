"""Start a distributed KVStore job (one scheduler, S servers, W workers) and watch over it.

    mixrt launch -n 2 -s 1 -- python train.py                        # all on this machine
    mixrt launch -n 4 -s 2 --launcher ssh -H hosts -- python train.py
    mixrt launch -n 4 -s 2 --launcher mpi -H mpi_hosts -- python train.py
    salloc -n 7 mixrt launch -n 4 -s 2 --launcher slurm -- python train.py
    mixrt launch -n 4 -s 2 --sbatch job.sh -- python train.py        # writes and submits
    mixrt launch -n 4 -s 2 --launcher kubernetes --image IMG -- python train.py   # manifests

    from mixrt.kvstore.launch import launch
    status = launch(["python", "train.py"], num_workers=2, num_servers=1)

Every process gets the variables MXNet (ps-lite) users know: ``DMLC_ROLE`` (scheduler, server
or worker), ``DMLC_PS_ROOT_URI`` and ``DMLC_PS_ROOT_PORT`` (the scheduler's address; the port
is ``--port``, else an inherited ``DMLC_PS_ROOT_PORT``, else a free one), ``DMLC_NUM_SERVER``
and ``DMLC_NUM_WORKER``, plus ``MIXRT_KV_ROLE_INDEX`` (0..W-1 for workers, 0..S-1 for
servers, 0 for the scheduler), the rank hint of the distributed store, so that "worker 1" in
the logs is rank 1. ``PYTHONUNBUFFERED=1`` is added unless set, so Python processes' lines
arrive as they are printed. The rest of the environment is the launcher's. Workers run the
user's command; the scheduler and servers run ``python -m mixrt.kvstore.dist``, which reads
its role from the environment (``MIXRT_LAUNCH_ROLE_COMMAND``, a shell-style command line,
replaces it; so do the ``role_command``/``remote_role_command`` arguments of ``launch``).

Launchers:

* ``local``: every process is a child of the launcher, on this machine.
* ``ssh``: the scheduler runs here; servers, then workers, are dealt round-robin over the
  hosts of the host file, each started as ``ssh -o BatchMode=yes -o
  StrictHostKeyChecking=accept-new HOST 'cd CWD && env K=V ... COMMAND'`` (the remote role
  command is ``python3 -m mixrt.kvstore.dist``; ``MIXRT_LAUNCH_SSH`` names another ssh). The
  host file has one ``host``, ``user@host`` or ``host:slots`` per line (``#`` starts a
  comment): a host with N slots takes N processes in a row before the next host gets one.
  An IPv6 literal cannot carry slots.
* ``mpi``: the scheduler runs here; ``mpirun -np S+W [--hostfile H] -x VAR ...``
  (``MIXRT_LAUNCH_MPIRUN`` names another; Open MPI's options) starts ``python3 -m
  mixrt.kvstore.launch --mpi-child --role-command JSON -- COMMAND`` everywhere. Each copy reads
  its rank (``OMPI_COMM_WORLD_RANK``, ``PMI_RANK`` or ``PMIX_RANK``), becomes a server (ranks
  < S) or a worker (index rank - S) and execs its command. ``-H`` is mpirun's own host file.
* ``slurm``: inside an allocation, the whole job (the scheduler too) is the tasks of one
  ``srun`` step; ``--sbatch`` writes and submits a batch script that runs it
  (``kvstore/slurm.py``).
* ``kubernetes``: nothing runs here; the job's manifests are printed or applied with kubectl
  (``kvstore/kubernetes.py``).

Output: each line a process prints comes out of the launcher prefixed with its name
(``[scheduler] ``, ``[server 0] ``, ``[worker 1] ``, under mpi ``[mpirun] ``), stdout on
stdout and stderr on stderr, bytes passed through as they are.

Exit: the first process to exit non-zero stops the job (SIGTERM to every process group, SIGKILL
after KILL_GRACE_S), and its status is the launcher's (128+N for a signal N). Once every worker
has exited 0 the scheduler and servers get SERVER_GRACE_S to leave by themselves (the scheduler
shuts the servers down when the workers leave); after that they are stopped with a warning and
the status is still 0. SIGINT and SIGTERM to the launcher are forwarded; it exits 130 or 143.
On Linux children are SIGKILLed when the launcher dies, even by SIGKILL (PR_SET_PDEATHSIG; it
fires when the *thread* that started them ends, and ``launch`` returns only when they are gone).
Remote processes under ssh are as safe as their connection: when the launcher dies their ssh
ends, and they lose the scheduler (the store's heartbeats turn that into an error).

Authentication: every job admits only its own processes. Unless ``MIXRT_KV_SECRET`` or
``MIXRT_KV_TOKEN`` is set, the launcher makes a fresh random token for the job and gives it
to the job's processes as ``MIXRT_KV_TOKEN``; their sockets ask each other for it at the
handshake (``kvstore/dist/security.py``), so another process on this host cannot join the
job or speak for one of its ranks, even on loopback. A user-set token is used as it is.

Across machines (ssh, mpi) the scheduler's address is ``--host-uri``, else the address of this
machine's name (a loopback answer is refused: pass ``--host-uri``). A scheduler that is not on
a loopback address needs authentication with encryption: set ``MIXRT_KV_SECRET`` (the store
derives its CURVE keys from it; it wins over a token). Every ``MIXRT_KV_*`` variable
set here (the secret, the store's timeouts) and ``PYTHONPATH`` are passed to remote processes:
by name under mpi (``-x``), under ssh in the ``env`` list of the ssh command line, where
``ps`` on either host can see them. ``--host-uri 127.0.0.1`` keeps an
ssh or mpi job on this machine without a secret.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import secrets
import shlex
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from mixrt.base.errors import KVStoreError
from mixrt.kvstore import kubernetes, slurm
from mixrt.kvstore.dist.config import is_loopback
from mixrt.kvstore.supervisor import (KILL_GRACE_S, SERVER_GRACE_S, Planned, Supervisor,
                                      _set_parent_death_signal)

LAUNCHERS = ("local", "ssh", "mpi", "slurm", "kubernetes")
DIST_MODULE = "mixrt.kvstore.dist"
REMOTE_PYTHON = "python3"   # the remote machine's Python; sys.executable is a local path
SECRET_VARIABLES = ("MIXRT_KV_SECRET",)  # the CURVE keys are derived from it (security.py)
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new")


# -- the plan: which processes, with which commands and variables ----------------------------

@dataclass(frozen=True)
class Host:
    address: str        # as ssh takes it: host or user@host
    slots: int = 1


@dataclass(frozen=True)
class Rendezvous:
    """Where the scheduler listens and how many peers it waits for."""

    uri: str
    port: int
    num_servers: int
    num_workers: int

    def shared_environment(self) -> dict[str, str]:
        return {"DMLC_PS_ROOT_URI": self.uri, "DMLC_PS_ROOT_PORT": str(self.port),
                "DMLC_NUM_SERVER": str(self.num_servers),
                "DMLC_NUM_WORKER": str(self.num_workers)}

    def environment(self, role: str, index: int) -> dict[str, str]:
        return {"DMLC_ROLE": role, **self.shared_environment(),
                "MIXRT_KV_ROLE_INDEX": str(index)}


def plan_job(command, num_workers: int, num_servers: int, *, launcher: str = "local",
             hostfile=None, port: int | None = None, host_uri: str | None = None,
             role_command=None, remote_role_command=None, environ=None) -> list[Planned]:
    """The processes ``launch`` starts; raises KVStoreError for anything the user got wrong."""
    environ = os.environ if environ is None else environ
    command = _check_job(command, num_workers, num_servers, launcher, hostfile)
    local_role, remote_role = _role_commands(role_command, remote_role_command, environ)
    if launcher == "slurm":
        return [_slurm_step(command, num_workers, num_servers, port, host_uri, local_role,
                            environ)]
    uri = host_uri or ("127.0.0.1" if launcher == "local" else reachable_address())
    require_authentication(uri, environ)
    environ = with_job_token(environ)
    rendezvous = Rendezvous(uri, _root_port(port, uri, environ), num_servers, num_workers)
    local = functools.partial(_local_process, rendezvous, environ)
    scheduler = local("scheduler", 0, local_role)
    if launcher == "local":
        servers = [local("server", i, local_role) for i in range(num_servers)]
        workers = [local("worker", i, command) for i in range(num_workers)]
        return [scheduler, *servers, *workers]
    if launcher == "ssh":
        return [scheduler, *_ssh_processes(rendezvous, command, parse_hostfile(hostfile),
                                           remote_role, environ)]
    return [scheduler, _mpirun_process(rendezvous, command, hostfile, remote_role, environ)]


def _check_job(command, num_workers, num_servers, launcher, hostfile) -> list[str]:
    if isinstance(command, str) or not all(isinstance(arg, str) for arg in command or ()):
        raise KVStoreError(f"the workers' command is a list of strings, got {command!r}")
    if not command:
        raise KVStoreError("no command to run: give the workers' command after --, e.g. "
                           "mixrt launch -n 2 -s 1 -- python train.py")
    for what, count in (("workers", num_workers), ("servers", num_servers)):
        if not isinstance(count, int) or count < 1:
            raise KVStoreError(f"the number of {what} must be at least 1, got {count!r}")
    if launcher not in LAUNCHERS:
        raise KVStoreError(f"unknown launcher {launcher!r}; choose one of "
                           f"{', '.join(LAUNCHERS)}")
    if launcher == "ssh" and not hostfile:
        raise KVStoreError("the ssh launcher needs a host file (-H HOSTFILE)")
    if launcher in ("local", "slurm", "kubernetes") and hostfile:
        raise KVStoreError(f"a host file (-H) is for the ssh and mpi launchers, not "
                           f"{launcher}: the machine, the allocation or the cluster says "
                           f"where the processes run")
    return list(command)


def _role_commands(role_command, remote_role_command, environ) -> tuple[list, list]:
    override = shlex.split(environ.get("MIXRT_LAUNCH_ROLE_COMMAND", ""))
    local = role_command or override or [sys.executable, "-m", DIST_MODULE]
    remote = remote_role_command or override or [REMOTE_PYTHON, "-m", DIST_MODULE]
    return list(local), list(remote)


def _process_name(role: str, index: int) -> str:
    return "scheduler" if role == "scheduler" else f"{role} {index}"


def _local_process(rendezvous, environ, role, index, argv) -> Planned:
    token = {"MIXRT_KV_TOKEN": environ["MIXRT_KV_TOKEN"]} if "MIXRT_KV_TOKEN" in environ \
        else {}
    return Planned(_process_name(role, index), role, list(argv),
                   {**rendezvous.environment(role, index), **token, **_unbuffered(environ)})


def _unbuffered(environ) -> dict[str, str]:
    return {} if "PYTHONUNBUFFERED" in environ else {"PYTHONUNBUFFERED": "1"}


def _passed_to_remote(environ) -> dict[str, str]:
    # the store's settings (secret, timeouts, heartbeats) must agree on every host
    names = sorted(name for name in environ
                   if name.startswith("MIXRT_KV_") and name != "MIXRT_KV_ROLE_INDEX")
    return {**{name: environ[name] for name in (*names, "PYTHONPATH") if environ.get(name)},
            **_unbuffered(environ)}


# -- addresses and authentication ------------------------------------------------------------

def reachable_address() -> str:
    """This machine's address as other hosts would reach it: its name's address."""
    name = socket.gethostname()
    try:
        address = socket.gethostbyname(name)
    except OSError as exc:
        raise KVStoreError(f"cannot find this machine's address: its name {name!r} does not "
                           f"resolve ({exc}); pass --host-uri ADDRESS, an address of this "
                           "machine that the other hosts can reach") from exc
    if is_loopback(address):
        raise KVStoreError(f"this machine's name {name!r} resolves to {address}, a loopback "
                           "address the other hosts cannot reach; pass --host-uri ADDRESS, "
                           "an address of this machine that they can reach")
    return address


def require_authentication(uri: str, environ) -> None:
    """Anyone who can reach a non-loopback scheduler could join the job: insist on a secret."""
    if is_loopback(uri) or any(environ.get(name) for name in SECRET_VARIABLES):
        return
    raise KVStoreError(f"the scheduler's address {uri} can be reached from other machines, so "
                       "the job must authenticate: set MIXRT_KV_SECRET to a shared secret and "
                       "launch again")


def with_job_token(environ) -> dict:
    """``environ`` with a fresh ``MIXRT_KV_TOKEN`` for this job, unless it already holds a
    token or a secret (security.py: the job's processes ask each other for it)."""
    if any(environ.get(name) for name in (*SECRET_VARIABLES, "MIXRT_KV_TOKEN")):
        return dict(environ)
    return {**environ, "MIXRT_KV_TOKEN": secrets.token_urlsafe(32)}


def _root_port(port, uri, environ, default=None) -> int:
    if port is None and environ.get("DMLC_PS_ROOT_PORT"):
        text = environ["DMLC_PS_ROOT_PORT"]
        if not text.strip().isdigit():
            raise KVStoreError(f"DMLC_PS_ROOT_PORT must be a port number, got {text!r}")
        port = int(text)
    if port is None:
        return pick_free_port(uri) if default is None else default
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise KVStoreError(f"the scheduler's port must be 1..65535, got {port!r}")
    return port


def pick_free_port(address: str) -> int:
    """A port nothing listens on now: bind port 0 and let the kernel choose."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    # the address may be a name or a NAT's address this machine cannot bind; then any port
    # that is free here will do
    for host in (address, ""):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.bind((host, 0))
                return probe.getsockname()[1]
        except OSError:
            continue
    raise KVStoreError(f"cannot find a free port to listen on at {address}; pass --port")


# -- ssh ------------------------------------------------------------------------------------

def parse_hostfile(path) -> list[Host]:
    """``host``, ``user@host`` or ``host:slots`` per line; blank lines and ``#`` comments."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KVStoreError(f"cannot read the host file {path}: {exc}") from exc
    hosts = [_parse_host(line.split("#", 1)[0].strip(), f"{path}:{number}")
             for number, line in enumerate(text.splitlines(), 1)
             if line.split("#", 1)[0].strip()]
    if not hosts:
        raise KVStoreError(f"the host file {path} lists no hosts")
    return hosts


def _parse_host(entry: str, where: str) -> Host:
    if len(entry.split()) != 1:
        raise KVStoreError(f"{where}: expected 'host', 'user@host' or 'host:slots', got "
                           f"{entry!r}")
    address, colon, slots = entry.rpartition(":")
    if not colon or ":" in address:       # no slots, or an IPv6 literal
        return Host(entry)
    if not slots.isdigit() or int(slots) < 1 or not address:
        raise KVStoreError(f"{where}: expected 'host:slots' with slots >= 1, got {entry!r}")
    return Host(address, int(slots))


def assign_hosts(hosts: list[Host], count: int) -> list[str]:
    """Round-robin over the hosts, a host taking as many turns in a row as it has slots."""
    turns = [host.address for host in hosts for _ in range(host.slots)]
    return [turns[i % len(turns)] for i in range(count)]


def remote_shell_command(cwd: str, env: dict[str, str], argv: list[str]) -> str:
    """The one string ssh hands to the remote shell; every piece is quoted for it."""
    assignments = " ".join(shlex.quote(f"{name}={value}") for name, value in env.items())
    return f"cd {shlex.quote(cwd)} && env {assignments} {shlex.join(argv)}"


def _ssh_processes(rendezvous, command, hosts, remote_role, environ) -> list[Planned]:
    ssh = find_program("MIXRT_LAUNCH_SSH", "ssh", environ)
    roles = [("server", i, remote_role) for i in range(rendezvous.num_servers)]
    roles += [("worker", i, command) for i in range(rendezvous.num_workers)]
    cwd, passed = os.getcwd(), _passed_to_remote(environ)
    processes = []
    for (role, index, argv), host in zip(roles, assign_hosts(hosts, len(roles))):
        env = {**rendezvous.environment(role, index), **passed}
        remote = remote_shell_command(cwd, env, argv)
        processes.append(Planned(_process_name(role, index), role,
                                 [*ssh, *SSH_OPTIONS, host, remote], host=host))
    return processes


def find_program(variable: str, default: str, environ) -> list[str]:
    """``default`` or the command line in ``variable``, checked to be on PATH."""
    argv = shlex.split(environ.get(variable) or default)
    if not argv or shutil.which(argv[0], path=environ.get("PATH")) is None:
        shown = argv[0] if argv else "''"
        raise KVStoreError(f"cannot find {shown!r} on PATH (set {variable} to the program to "
                           "use)")
    return argv


# -- mpi -------------------------------------------------------------------------------------

def _mpirun_process(rendezvous, command, hostfile, remote_role, environ) -> Planned:
    mpirun = find_program("MIXRT_LAUNCH_MPIRUN", "mpirun", environ)
    exported = {**rendezvous.shared_environment(), **_passed_to_remote(environ)}
    hosts = ["--hostfile", str(hostfile)] if hostfile else []
    # -x NAME exports the variable from mpirun's environment: secrets stay off the command line
    exports = [arg for name in exported for arg in ("-x", name)]
    child = [REMOTE_PYTHON, "-m", "mixrt.kvstore.launch", "--mpi-child",
             "--role-command", json.dumps(remote_role), "--", *command]
    np = rendezvous.num_servers + rendezvous.num_workers
    return Planned("mpirun", "mpirun", [*mpirun, "-np", str(np), *hosts, *exports, *child],
                   exported)


def mpi_child(argv: list[str]) -> None:
    """Run in every MPI process: become server or worker by rank and exec its command."""
    role_command, command = _child_arguments(argv, "--mpi-child", "the servers' argv")
    rank, num_servers = _mpi_rank(os.environ), _environment_int("DMLC_NUM_SERVER")
    role, index = ("server", rank) if rank < num_servers else ("worker", rank - num_servers)
    _set_parent_death_signal()      # die with mpirun (or its daemon) like a local child would
    _become(role, index, command if role == "worker" else role_command)


def _child_arguments(argv: list[str], flag: str, role_help: str) -> tuple[list, list]:
    """(the scheduler's and servers' argv, the workers' command) a child was given."""
    parser = argparse.ArgumentParser(prog=f"python -m mixrt.kvstore.launch {flag}")
    parser.add_argument("--role-command", required=True, help=f"{role_help}, as JSON")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    return _json_argv(args.role_command), _strip_dashes(args.command)


def _become(role: str, index: int, target: list[str]) -> None:
    """Exec ``target`` as ``role`` ``index`` of the job."""
    if not target:
        raise KVStoreError(f"no command for {role} {index}: give it after --")
    env = {**os.environ, "DMLC_ROLE": role, "MIXRT_KV_ROLE_INDEX": str(index)}
    try:
        os.execvpe(target[0], target, env)
    except OSError as exc:
        raise KVStoreError(f"cannot start {role} {index} ({target[0]}): {exc}") from exc


def _mpi_rank(environ) -> int:
    for name in RANK_VARIABLES:
        if environ.get(name, "").isdigit():
            return int(environ[name])
    raise KVStoreError(f"no MPI rank in the environment (looked for {', '.join(RANK_VARIABLES)}"
                       "); --mpi-child runs under mpirun, started by mixrt launch")


def _environment_int(name: str) -> int:
    text = os.environ.get(name, "")
    if not text.isdigit():
        raise KVStoreError(f"{name} must be set to a number, got {text!r}")
    return int(text)


def _json_argv(text: str) -> list[str]:
    try:
        argv = json.loads(text)
    except ValueError as exc:
        raise KVStoreError(f"--role-command must be a JSON list of strings: {exc}") from exc
    if not isinstance(argv, list) or not all(isinstance(arg, str) for arg in argv):
        raise KVStoreError(f"--role-command must be a JSON list of strings, got {text!r}")
    return argv


def _strip_dashes(argv: list[str]) -> list[str]:
    return argv[1:] if argv[:1] == ["--"] else argv


# -- slurm ----------------------------------------------------------------------------------

def _slurm_step(command, num_workers, num_servers, port, host_uri, role_command,
                environ) -> Planned:
    """The job as one srun step in the current allocation (kvstore/slurm.py)."""
    slurm.require_allocation(environ)
    srun = find_program("MIXRT_LAUNCH_SRUN", "srun", environ)
    uri = host_uri or slurm.node_address(slurm.first_node(environ))
    require_authentication(uri, environ)
    environ = with_job_token(environ)
    rendezvous = Rendezvous(uri, _root_port(port, uri, environ, slurm.job_port(environ)),
                            num_servers, num_workers)
    token = {name: environ[name] for name in ("MIXRT_KV_TOKEN",) if environ.get(name)}
    shared = {**rendezvous.shared_environment(), **token, **_unbuffered(environ)}
    return slurm.srun_process(srun, shared, command, role_command, num_servers, num_workers)


def task_child(argv: list[str]) -> None:
    """Run in every task of a Slurm step: become the scheduler, a server or a worker by
    ``SLURM_PROCID`` and exec its command."""
    role_command, command = _child_arguments(argv, "--task-child",
                                             "the scheduler's and servers' argv")
    rank = _environment_int(slurm.RANK_VARIABLE)
    role, index = slurm.role_of_rank(rank, _environment_int("DMLC_NUM_SERVER"))
    _become(role, index, command if role == "worker" else role_command)


def submit_batch(command, num_workers: int, num_servers: int, script, *, sbatch_args=(),
                 wait: bool = False, port: int | None = None,
                 host_uri: str | None = None, environ=None) -> int:
    """Write a batch script that runs this job under the slurm launcher, and submit it."""
    environ = os.environ if environ is None else environ
    command = _check_job(command, num_workers, num_servers, "slurm", None)
    sbatch = find_program("MIXRT_LAUNCH_SBATCH", "sbatch", environ)
    own = [sys.executable, "-m", "mixrt", "launch", "--launcher", "slurm",
           "-n", str(num_workers), "-s", str(num_servers),
           *(["--port", str(port)] if port is not None else []),
           *(["--host-uri", host_uri] if host_uri else []), "--", *command]
    text = slurm.batch_script(own, num_workers, num_servers, list(sbatch_args))
    return slurm.submit(Path(script), text, sbatch, wait)


# -- kubernetes -----------------------------------------------------------------------------

def kubernetes_job(command, num_workers: int, num_servers: int, *, image: str,
                   name: str | None = None, namespace: str = "default",
                   port: int | None = None, gpus_per_worker: int = 0, node_selector=(),
                   apply: bool = False, stdout=None, environ=None) -> int:
    """The job's manifests (kvstore/kubernetes.py): printed, or applied with kubectl."""
    environ = os.environ if environ is None else environ
    command = _check_job(command, num_workers, num_servers, "kubernetes", None)
    if port is not None and not 1 <= port <= 65535:
        raise KVStoreError(f"the scheduler's port must be 1..65535, got {port!r}")
    documents = kubernetes.manifests(
        command, num_workers, num_servers, image=image, name=name, namespace=namespace,
        port=port, gpus_per_worker=gpus_per_worker,
        node_selector=kubernetes.parse_node_selector(list(node_selector)),
        secret=environ.get("MIXRT_KV_SECRET") or None)
    if apply:
        return kubernetes.apply(documents, find_program("MIXRT_LAUNCH_KUBECTL", "kubectl",
                                                        environ))
    (stdout or sys.stdout).write(kubernetes.as_yaml(documents))
    return 0


# -- running the plan ------------------------------------------------------------------------

def launch(command, num_workers: int, num_servers: int, *, launcher: str = "local",
           hostfile=None, port: int | None = None, host_uri: str | None = None,
           role_command=None, remote_role_command=None, server_grace: float = SERVER_GRACE_S,
           kill_grace: float = KILL_GRACE_S, stdout=None, stderr=None) -> int:
    """Start the job, relay its output and return its exit status (see the module's doc).

    ``role_command`` is the argv of the scheduler and servers started here (default
    ``[sys.executable, "-m", "mixrt.kvstore.dist"]``), ``remote_role_command`` that of servers
    started by ssh or mpirun (default ``["python3", "-m", "mixrt.kvstore.dist"]``).
    ``stdout``/``stderr`` are where the prefixed lines go (default sys.stdout/sys.stderr).
    """
    planned = plan_job(command, num_workers, num_servers, launcher=launcher,
                       hostfile=hostfile, port=port, host_uri=host_uri,
                       role_command=role_command, remote_role_command=remote_role_command)
    supervisor = Supervisor(planned, server_grace=server_grace, kill_grace=kill_grace,
                            stdout=stdout or sys.stdout, stderr=stderr or sys.stderr)
    return supervisor.run()


def main(argv=None) -> int:
    """``python -m mixrt.kvstore.launch --mpi-child ...``: the MPI side of ``mixrt launch``."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--task-child"]:
        try:
            task_child(argv[1:])
        except KVStoreError as exc:
            print(f"mixrt launch --task-child: error: {exc}", file=sys.stderr)
        return 2
    if argv[:1] != ["--mpi-child"]:
        print("this module runs under mpirun as --mpi-child or under srun as --task-child; "
              "start jobs with: mixrt launch -n W -s S [--launcher local|ssh|mpi|slurm] -- "
              "CMD...", file=sys.stderr)
        return 2
    try:
        mpi_child(argv[1:])
    except KVStoreError as exc:
        print(f"mixrt launch --mpi-child: error: {exc}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

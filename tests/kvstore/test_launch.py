"""mixrt launch with real processes: a tiny stand-in for the scheduler and servers, workers
that print their environment, and fake ssh and mpirun programs that run everything here."""

import io
import json
import os
import re
import select
import signal
import subprocess
import sys
import time

import pytest

from mixrt.errors import KVStoreError
from mixrt.kvstore import launch as launcher

# Prints its pid, argv and the job's variables as one JSON line, then does what its argument
# says; "a b" means: index 0 does a, index 1 does b (the index is MIXRT_KV_ROLE_INDEX).
# With PIDS_FILE set it also appends its pid there, and "last:N" waits for every process of
# the job to have done so before it exits N (so none is stopped before it has printed).
PROCESS = r"""
import json, os, signal, sys, time
index = int(os.environ.get("MIXRT_KV_ROLE_INDEX", "0"))
actions = sys.argv[1].split()
action = actions[min(index, len(actions) - 1)]
variables = {k: v for k, v in os.environ.items()
             if k.startswith(("DMLC_", "MIXRT_KV_")) or k == "PYTHONUNBUFFERED"}
record = {"pid": os.getpid(), "argv": sys.argv[2:], "cwd": os.getcwd(), **variables}
os.write(1, (json.dumps(record) + "\n").encode())     # one write: lines sharing a pipe stay whole
os.write(2, b"to stderr\n")
if os.environ.get("PIDS_FILE"):
    with open(os.environ["PIDS_FILE"], "a") as pids:
        pids.write(f"{os.getpid()}\n")
if action == "noise":
    os.write(1, b"bad \xff\xfe bytes\nno newline at the end")
elif action.startswith(("exit:", "last:")):
    job = 1 + int(os.environ["DMLC_NUM_SERVER"]) + int(os.environ["DMLC_NUM_WORKER"])
    deadline = time.monotonic() + 20
    while action.startswith("last:") and time.monotonic() < deadline:
        with open(os.environ["PIDS_FILE"]) as pids:
            if len(pids.read().split()) >= job:
                break
        time.sleep(0.02)
    sys.exit(int(action[5:]))
elif action == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
elif action in ("sleep", "stubborn"):
    if action == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(600)
"""

FAKE_SSH = """#!/bin/bash
# ssh's stand-in: skip the options, log the host, run the remote command here as sshd would
while [[ $1 == -* ]]; do if [[ $1 == -o ]]; then shift 2; else shift; fi; done
echo "$1" >> "$FAKE_SSH_LOG"
shift
exec bash -c "$*"
"""

FAKE_MPIRUN = """#!{python}
# mpirun's stand-in: log the arguments, start -np copies of the command with their ranks
import json, os, subprocess, sys
args = sys.argv[1:]
with open(os.environ["FAKE_MPIRUN_LOG"], "w") as log:
    json.dump(args, log)
count, i = None, 0
while args[i].startswith("-"):
    if args[i] == "-np":
        count = int(args[i + 1])
    elif args[i] not in ("-x", "--hostfile"):
        sys.exit("fake mpirun: unknown option " + args[i])
    i += 2
copies = [subprocess.Popen(args[i:], env=dict(os.environ, OMPI_COMM_WORLD_RANK=str(rank)))
          for rank in range(count)]
sys.exit(max(abs(copy.wait()) for copy in copies))
"""

RECORD = re.compile(r"^\[(?P<name>[^\]]+)\] (?P<json>\{.*\})$")


@pytest.fixture
def process(tmp_path):
    """argv of the stand-in process doing ``actions``."""
    script = tmp_path / "process.py"
    script.write_text(PROCESS)
    return lambda actions, *extra: [sys.executable, str(script), actions, *extra]


@pytest.fixture
def job_pids(tmp_path, monkeypatch):
    """Every pid the job's processes wrote to PIDS_FILE (children inherit the variable)."""
    path = tmp_path / "pids"
    path.touch()
    monkeypatch.setenv("PIDS_FILE", str(path))
    return lambda: [int(pid) for pid in path.read_text().split()]


def run_launch(command, *, role, workers=2, servers=1, **options):
    out, err = io.StringIO(), io.StringIO()
    options.setdefault("role_command", role)
    started = time.monotonic()
    status = launcher.launch(command, workers, servers, stdout=out, stderr=err, **options)
    return status, out.getvalue(), err.getvalue(), time.monotonic() - started


def records(text):
    """{prefix: [the JSON records printed under it]}."""
    found = {}
    for line in text.splitlines():
        match = RECORD.match(line)
        if match:
            found.setdefault(match["name"], []).append(json.loads(match["json"]))
    return found


def alive(pid):
    """Running: exists and is not a zombie waiting for a parent that may never reap it."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def all_pids(found):
    return [record["pid"] for entries in found.values() for record in entries]


# -- local ----------------------------------------------------------------------------------

def test_every_process_gets_its_role_index_and_the_rendezvous(process):
    status, out, err, _ = run_launch(process("exit:0"), workers=2, servers=2,
                                     role=process("exit:0"))
    assert status == 0, err
    found = records(out)
    assert sorted(found) == ["scheduler", "server 0", "server 1", "worker 0", "worker 1"]
    ports = set()
    for name, (record,) in found.items():
        role, _, index = name.partition(" ")
        assert record["DMLC_ROLE"] == role
        assert record["MIXRT_KV_ROLE_INDEX"] == (index or "0")
        assert record["DMLC_PS_ROOT_URI"] == "127.0.0.1"
        assert (record["DMLC_NUM_SERVER"], record["DMLC_NUM_WORKER"]) == ("2", "2")
        assert record["PYTHONUNBUFFERED"] == "1"
        ports.add(record["DMLC_PS_ROOT_PORT"])
    assert len(ports) == 1 and 0 < int(ports.pop()) < 65536
    assert not any(alive(pid) for pid in all_pids(found))


def test_port_comes_from_the_option_or_the_environment(process, monkeypatch):
    monkeypatch.setenv("DMLC_PS_ROOT_PORT", "23456")
    plan = launcher.plan_job(process("exit:0"), 1, 1, role_command=["role"])
    assert {p.env["DMLC_PS_ROOT_PORT"] for p in plan} == {"23456"}
    plan = launcher.plan_job(process("exit:0"), 1, 1, port=34567, role_command=["role"])
    assert {p.env["DMLC_PS_ROOT_PORT"] for p in plan} == {"34567"}
    monkeypatch.setenv("DMLC_PS_ROOT_PORT", "http")
    with pytest.raises(KVStoreError, match="DMLC_PS_ROOT_PORT"):
        launcher.plan_job(process("exit:0"), 1, 1)


def test_output_is_prefixed_line_by_line_on_stdout_and_stderr(process):
    status, out, err, _ = run_launch(process("noise"), workers=1, role=process("exit:0"))
    assert status == 0, err
    lines = out.splitlines()
    assert "[worker 0] bad \ufffd\ufffd bytes" in lines
    assert "[worker 0] no newline at the end" in lines
    assert {"[scheduler] to stderr", "[server 0] to stderr", "[worker 0] to stderr"} <= \
        set(err.splitlines())
    assert "to stderr" not in out


def test_a_failing_worker_stops_the_job_with_its_status(process, job_pids):
    status, _, err, elapsed = run_launch(process("sleep last:3"), role=process("sleep"))
    assert status == 3
    assert "mixrt launch: worker 1 exited with status 3; stopping the job" in err
    assert elapsed < 4      # the sleepers die on SIGTERM, no waiting out the grace
    assert len(job_pids()) == 4
    assert not any(alive(pid) for pid in job_pids())


def test_a_worker_killed_by_a_signal_exits_128_plus_n(process):
    status, out, err, _ = run_launch(process("kill"), workers=1, role=process("sleep"))
    assert status == 128 + signal.SIGKILL
    assert "worker 0 was killed by SIGKILL (status 137); stopping the job" in err
    assert not any(alive(pid) for pid in all_pids(records(out)))


def test_a_failing_server_stops_the_job_too(process):
    status, out, err, _ = run_launch(process("sleep"), role=process("exit:5"), servers=1)
    assert status == 5   # the scheduler is index 0 too, so it exits 5 as well: either is fine
    assert re.search(r"(scheduler|server 0) exited with status 5", err)
    assert not any(alive(pid) for pid in all_pids(records(out)))


def test_servers_that_stay_are_stopped_after_the_grace(process):
    status, out, err, elapsed = run_launch(process("exit:0"), servers=2,
                                           role=process("sleep stubborn"),
                                           server_grace=0.3, kill_grace=0.3)
    assert status == 0
    assert ("mixrt launch: warning: scheduler, server 0, server 1 still running 0.3 s after "
            "the workers finished; stopping them") in err
    assert elapsed < 3
    found = records(out)
    assert not any(alive(pid) for pid in all_pids(found))   # the stubborn one got SIGKILL


def test_an_unstartable_command_is_an_error(process):
    with pytest.raises(KVStoreError, match="cannot start worker 0"):
        run_launch(["/nonexistent/program"], workers=1, role=process("sleep"))


@pytest.mark.parametrize("arguments, message", [
    (([], 1, 1), "no command to run"),
    ((["true"], 0, 1), "number of workers must be at least 1"),
    ((["true"], 1, 0), "number of servers must be at least 1"),
    (("true", 1, 1), "list of strings"),
])
def test_bad_jobs_are_refused(arguments, message):
    with pytest.raises(KVStoreError, match=message):
        launcher.plan_job(*arguments)
    with pytest.raises(KVStoreError, match="unknown launcher 'yarn'; choose one of local, "):
        launcher.plan_job(["true"], 1, 1, launcher="yarn")


# -- the command line, as a process ----------------------------------------------------------

def mixrt_launch(*args, env=None, **popen):
    return subprocess.Popen([sys.executable, "-c", "from mixrt.cli import main; "
                             "raise SystemExit(main())", "launch", *args],
                            env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **popen)


def role_env(process, actions):
    return {"MIXRT_LAUNCH_ROLE_COMMAND": " ".join(process(actions))}


def test_cli_runs_a_job(process, job_pids):
    job = mixrt_launch("-n", "2", "-s", "1", "--", *process("exit:0 last:4"),
                       env=role_env(process, "exit:0"))
    out, err = job.communicate(timeout=20)
    assert job.returncode == 4, err
    assert sorted(records(out.decode())) == ["scheduler", "server 0", "worker 0", "worker 1"]
    assert b"worker 1 exited with status 4" in err


@pytest.mark.parametrize("args, message", [
    (["-n", "2", "-s", "1"], "no command to run"),
    (["-n", "2", "-s", "1", "--"], "no command to run"),
    (["-n", "0", "--", "true"], "number of workers must be at least 1"),
    (["-n", "1", "-s", "0", "--", "true"], "number of servers must be at least 1"),
    (["-n", "1", "--launcher", "yarn", "--", "true"], "invalid choice: 'yarn'"),
    (["-s", "1", "--", "true"], "required: -n"),
    (["-n", "1", "--launcher", "ssh", "--", "true"], "needs a host file"),
])
def test_cli_argument_errors_exit_2(args, message, capsys):
    from mixrt.cli import main  # noqa: PLC0415
    try:
        status = main(["launch", *args])
    except SystemExit as exit_:     # argparse's own errors
        status = exit_.code
    assert status == 2
    assert message in capsys.readouterr().err


def read_records_until(pipe, names, timeout=20):
    """Read the launcher's stdout until every name has printed its record."""
    text, deadline = b"", time.monotonic() + timeout
    while not set(names) <= set(records(text.decode(errors="replace"))):
        assert time.monotonic() < deadline, text
        if select.select([pipe], [], [], 0.1)[0]:
            chunk = os.read(pipe.fileno(), 65536)
            assert chunk, f"the launcher ended early: {text!r}"
            text += chunk
    return records(text.decode(errors="replace"))


def wait_gone(pids, timeout=5):
    deadline = time.monotonic() + timeout
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid in pids if alive(pid)]


NAMES = ("scheduler", "server 0", "worker 0", "worker 1")


def test_sigkilled_launcher_leaves_no_children(process):
    job = mixrt_launch("-n", "2", "-s", "1", "--", *process("sleep"),
                       env=role_env(process, "sleep"))
    pids = all_pids(read_records_until(job.stdout, NAMES))
    job.kill()
    job.wait()
    assert wait_gone(pids) == []


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signals_to_the_launcher_are_forwarded(process, signum, status):
    job = mixrt_launch("-n", "2", "-s", "1", "--", *process("sleep"),
                       env=role_env(process, "sleep"))
    pids = all_pids(read_records_until(job.stdout, NAMES))
    job.send_signal(signum)
    _, err = job.communicate(timeout=10)
    assert job.returncode == status
    assert f"received {signum.name}; stopping the job".encode() in err
    assert [pid for pid in pids if alive(pid)] == []


# -- ssh --------------------------------------------------------------------------------------

@pytest.fixture
def fake_ssh(tmp_path, monkeypatch):
    program = tmp_path / "fake-ssh"
    program.write_text(FAKE_SSH)
    program.chmod(0o755)
    monkeypatch.setenv("MIXRT_LAUNCH_SSH", str(program))
    monkeypatch.setenv("FAKE_SSH_LOG", str(tmp_path / "ssh.log"))
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# two hosts\nalpha\n\nuser@beta:2   # two processes in a row\n")
    return hostfile


def test_parse_hostfile_and_round_robin(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a\n  # comment\nu@b:3\n::1\n")
    hosts = launcher.parse_hostfile(hostfile)
    assert hosts == [launcher.Host("a"), launcher.Host("u@b", 3), launcher.Host("::1")]
    assert launcher.assign_hosts(hosts, 6) == ["a", "u@b", "u@b", "u@b", "::1", "a"]
    for bad in ("a:0\n", "a:x\n", "a b\n", "# nothing\n"):
        hostfile.write_text(bad)
        with pytest.raises(KVStoreError, match=str(hostfile)):
            launcher.parse_hostfile(hostfile)


def test_ssh_job_runs_everywhere_with_quoting_intact(process, fake_ssh, tmp_path, monkeypatch):
    workdir = tmp_path / "a work dir"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("MIXRT_KV_SECRET", "s3cret 'quoted'")
    tricky = ["two words", "it's", '"double"', "$HOME", "; exit 9", "*"]
    status, out, err, _ = run_launch(process("exit:0", *tricky), launcher="ssh",
                                     hostfile=fake_ssh, host_uri="192.0.2.7",
                                     role=process("exit:0"),
                                     remote_role_command=process("exit:0"))
    assert status == 0, err
    found = records(out)
    assert sorted(found) == ["scheduler", "server 0", "worker 0", "worker 1"]
    for name in ("worker 0", "worker 1"):
        (record,) = found[name]
        assert record["argv"] == tricky
        assert record["cwd"] == str(workdir)
        assert record["MIXRT_KV_SECRET"] == "s3cret 'quoted'"
        assert record["DMLC_PS_ROOT_URI"] == "192.0.2.7"
        assert record["MIXRT_KV_ROLE_INDEX"] == name[-1]
    # servers first, then workers; beta has two slots
    log = (tmp_path / "ssh.log").read_text().split()
    assert sorted(log) == ["alpha", "user@beta", "user@beta"]
    plan = launcher.plan_job(["w"], 2, 1, launcher="ssh", hostfile=fake_ssh,
                             host_uri="192.0.2.7")
    assert [(p.name, p.host) for p in plan] == [("scheduler", ""), ("server 0", "alpha"),
                                                ("worker 0", "user@beta"),
                                                ("worker 1", "user@beta")]
    assert plan[1].argv[-1].endswith("python3 -m mixrt.kvstore.dist")


def test_ssh_failure_names_the_host(process, fake_ssh, monkeypatch):
    monkeypatch.setenv("MIXRT_KV_SECRET", "s")
    status, _, err, _ = run_launch(process("exit:0 exit:6"), launcher="ssh",
                                   hostfile=fake_ssh, host_uri="192.0.2.7",
                                   role=process("sleep"), remote_role_command=process("sleep"))
    assert status == 6
    assert "worker 1 on user@beta exited with status 6; stopping the job" in err


def test_ssh_refuses_an_unauthenticated_scheduler(fake_ssh, monkeypatch):
    for name in launcher.SECRET_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(KVStoreError, match="set MIXRT_KV_SECRET"):
        launcher.plan_job(["true"], 1, 1, launcher="ssh", hostfile=fake_ssh,
                          host_uri="192.0.2.7")
    job = mixrt_launch("-n", "1", "--launcher", "ssh", "-H", str(fake_ssh), "--host-uri",
                       "192.0.2.7", "--", "true",
                       env={name: "" for name in launcher.SECRET_VARIABLES})
    _, err = job.communicate(timeout=20)
    assert job.returncode == 2 and b"set MIXRT_KV_SECRET" in err
    # a loopback scheduler is reachable from this machine only: no secret needed
    launcher.plan_job(["true"], 1, 1, launcher="ssh", hostfile=fake_ssh,
                      host_uri="127.0.0.1")


def test_a_loopback_host_name_asks_for_host_uri(monkeypatch):
    monkeypatch.setattr(launcher.socket, "gethostbyname", lambda name: "127.0.1.1")
    with pytest.raises(KVStoreError, match="--host-uri"):
        launcher.reachable_address()


def test_a_missing_ssh_or_mpirun_is_named(fake_ssh, monkeypatch):
    monkeypatch.setenv("MIXRT_LAUNCH_SSH", "no-such-ssh")
    with pytest.raises(KVStoreError, match="'no-such-ssh'.*MIXRT_LAUNCH_SSH"):
        launcher.plan_job(["true"], 1, 1, launcher="ssh", hostfile=fake_ssh,
                          host_uri="127.0.0.1")
    monkeypatch.delenv("MIXRT_LAUNCH_MPIRUN", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(KVStoreError, match="'mpirun'.*MIXRT_LAUNCH_MPIRUN"):
        launcher.plan_job(["true"], 1, 1, launcher="mpi", host_uri="127.0.0.1")


# -- mpi --------------------------------------------------------------------------------------

def test_mpi_job_gives_ranks_their_roles(process, tmp_path, monkeypatch):
    program = tmp_path / "fake-mpirun"
    program.write_text(FAKE_MPIRUN.format(python=sys.executable))
    program.chmod(0o755)
    monkeypatch.setenv("MIXRT_LAUNCH_MPIRUN", str(program))
    monkeypatch.setenv("FAKE_MPIRUN_LOG", str(tmp_path / "mpirun.json"))
    # the MPI children run "python3": this venv's
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
    monkeypatch.setenv("MIXRT_KV_SECRET", "mpi-secret")
    status, out, err, _ = run_launch(process("exit:0"), workers=2, servers=1, launcher="mpi",
                                     host_uri="192.0.2.7", role=process("exit:0"),
                                     remote_role_command=process("exit:0", "server"))
    assert status == 0, err
    found = records(out)
    assert sorted(found) == ["mpirun", "scheduler"]
    roles = sorted((r["DMLC_ROLE"], r["MIXRT_KV_ROLE_INDEX"], r["argv"]) for r in found["mpirun"])
    assert roles == [("server", "0", ["server"]), ("worker", "0", []), ("worker", "1", [])]
    assert all(r["DMLC_PS_ROOT_URI"] == "192.0.2.7" and r["MIXRT_KV_SECRET"] == "mpi-secret"
               for r in found["mpirun"])
    args = json.loads((tmp_path / "mpirun.json").read_text())
    assert args[:2] == ["-np", "3"]
    exported = {args[i + 1] for i, arg in enumerate(args) if arg == "-x"}
    assert {"DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER", "DMLC_NUM_WORKER",
            "MIXRT_KV_SECRET"} <= exported
    # the secret travels by name, not on the command line
    assert "mpi-secret" not in (tmp_path / "mpirun.json").read_text()


def test_mpi_child_without_a_rank_is_an_error():
    env = {k: v for k, v in os.environ.items() if k not in launcher.RANK_VARIABLES}
    result = subprocess.run([sys.executable, "-m", "mixrt.kvstore.launch", "--mpi-child",
                             "--role-command", "[]", "--", "true"], env=env,
                            capture_output=True, text=True, timeout=20)
    assert result.returncode == 2
    assert "no MPI rank" in result.stderr and "OMPI_COMM_WORLD_RANK" in result.stderr

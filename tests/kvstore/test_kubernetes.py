"""The Kubernetes launcher (kvstore/kubernetes.py): its manifests against the Kubernetes API's
schema (kubernetes-validate), the secret only in a Secret, GPUs and node selectors where
asked, kubectl fed the manifests on its standard input; and the environment each pod would
get, checked by starting the same processes here with it (the Service's name and the pods'
IPs as the cluster's DNS and network would give them: this machine), running a dist_sync
fit of 2 workers and 1 server whose weights equal one process's."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

import fit_job
from mixrt.base.errors import KVStoreError
from mixrt.kvstore import kubernetes
from mixrt.kvstore.launch import kubernetes_job, pick_free_port
from mixrt.kvstore.supervisor import Planned, Supervisor

kubernetes_validate = pytest.importorskip("kubernetes_validate")
KUBERNETES_VERSION = "1.30"
JOB = Path(fit_job.__file__)


def _documents(**options) -> list[dict]:
    settings = {"image": "registry.example/train:1", "name": "fit", **options}
    return kubernetes.manifests(["python", "train.py"], 2, 1, **settings)


def _by_kind(documents, kind: str, role: str | None = None) -> dict:
    [found] = [d for d in documents if d["kind"] == kind and (
        role is None or d["metadata"]["labels"].get("mixrt.role") == role)]
    return found


def test_every_manifest_is_valid_against_the_kubernetes_schema():
    documents = _documents(gpus_per_worker=2, node_selector={"gpu": "h100"})
    assert [d["kind"] for d in documents] == ["Secret", "Service", "Job", "Job", "Job"]
    for document in documents:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_a_broken_manifest_is_caught_by_the_same_check():
    document = _by_kind(_documents(), "Service")
    document["spec"]["clusterIp"] = "None"  # a misspelt field
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_the_jobs_are_indexed_one_pod_per_process():
    documents = _documents()
    counts = {role: _by_kind(documents, "Job", role)["spec"]["completions"]
              for role in ("scheduler", "server", "worker")}
    assert counts == {"scheduler": 1, "server": 1, "worker": 2}
    for role in counts:
        spec = _by_kind(documents, "Job", role)["spec"]
        assert spec["completionMode"] == "Indexed" and spec["backoffLimit"] == 0
    service = _by_kind(documents, "Service")["spec"]
    assert service["clusterIP"] == "None" and service["selector"]["mixrt.role"] == "scheduler"


def test_the_secret_lives_in_a_secret_and_reaches_pods_by_reference():
    documents = _documents(secret="s3cr3t-value-of-the-job")
    assert _by_kind(documents, "Secret")["stringData"] == {
        "MIXRT_KV_SECRET": "s3cr3t-value-of-the-job"}
    for role in ("scheduler", "server", "worker"):
        [container] = _by_kind(documents, "Job", role)["spec"]["template"]["spec"]["containers"]
        assert "s3cr3t" not in json.dumps(container)
        [entry] = [e for e in container["env"] if e["name"] == "MIXRT_KV_SECRET"]
        assert entry["valueFrom"]["secretKeyRef"] == {"name": "fit-auth",
                                                      "key": "MIXRT_KV_SECRET"}


def test_gpus_go_to_the_workers_and_the_node_selector_to_every_pod():
    documents = _documents(gpus_per_worker=1, node_selector={"accelerator": "h100"})
    for role in ("scheduler", "server", "worker"):
        pod = _by_kind(documents, "Job", role)["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"accelerator": "h100"}
        limits = pod["containers"][0].get("resources", {}).get("limits", {})
        assert limits == ({"nvidia.com/gpu": 1} if role == "worker" else {})


@pytest.mark.parametrize("options,message", [
    ({"image": ""}, "--image"),
    ({"name": "Bad_Name"}, "--job-name"),
    ({"gpus_per_worker": -1}, "--gpus-per-worker"),
])
def test_bad_options_are_refused(options, message):
    with pytest.raises(KVStoreError, match=message):
        _documents(**options)
    with pytest.raises(KVStoreError, match="key=value"):
        kubernetes.parse_node_selector(["gpu"])


def test_the_command_prints_yaml_and_apply_feeds_kubectl_on_stdin(tmp_path):
    out = io.StringIO()
    environ = {"PATH": os.environ["PATH"], "MIXRT_KV_SECRET": "kept-secret-of-the-user"}
    assert kubernetes_job(["python", "t.py"], 1, 1, image="i:1", name="j", stdout=out,
                          environ=environ) == 0
    printed = list(yaml.safe_load_all(out.getvalue()))
    assert printed[0]["stringData"]["MIXRT_KV_SECRET"] == "kept-secret-of-the-user"
    recorder = tmp_path / "kubectl"
    recorder.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/argv\ncat > {tmp_path}/stdin\n")
    recorder.chmod(0o755)
    environ["MIXRT_LAUNCH_KUBECTL"] = str(recorder)
    assert kubernetes_job(["python", "t.py"], 1, 1, image="i:1", name="j", apply=True,
                          environ=environ) == 0
    assert (tmp_path / "argv").read_text().split() == ["apply", "-f", "-"]
    applied = list(yaml.safe_load_all((tmp_path / "stdin").read_text()))
    assert [d["kind"] for d in applied] == ["Secret", "Service", "Job", "Job", "Job"]


# -- the pods' environment, started here ----------------------------------------------------

def _pod_environment(documents, role: str, index: int) -> dict[str, str]:
    """What the pod with completion index ``index`` of ``role`` would see, with the
    cluster's answers made this machine's: the Service's name and the pods' IPs."""
    secret = _by_kind(documents, "Secret")["stringData"]
    service = _by_kind(documents, "Service")["metadata"]["name"]
    [container] = _by_kind(documents, "Job", role)["spec"]["template"]["spec"]["containers"]
    env = {}
    for entry in container["env"]:
        source = entry.get("valueFrom", {})
        if "value" in entry:
            env[entry["name"]] = "127.0.0.1" if entry["value"] == service else entry["value"]
        elif "secretKeyRef" in source:
            env[entry["name"]] = secret[source["secretKeyRef"]["key"]]
        elif source["fieldRef"]["fieldPath"] == "status.podIP":
            env[entry["name"]] = "127.0.0.1"
        else:
            assert source["fieldRef"]["fieldPath"] == kubernetes.INDEX_ANNOTATION
            env[entry["name"]] = str(index)
    return env


def _here(argv: list[str]) -> list[str]:
    """The pod's command with this Python for the image's ``python3``/``python``."""
    return [sys.executable if argv[0] in ("python3", "python") else argv[0], *argv[1:]]


def test_the_pods_environment_runs_a_dist_sync_fit(tmp_path):
    out = tmp_path / "weights"
    out.mkdir()
    config = json.dumps({"kind": "dist_sync", "out": str(out), "compression": False})
    documents = kubernetes.manifests(["python", str(JOB), config], 2, 1, image="i:1",
                                     name="fit", port=pick_free_port("127.0.0.1"))
    planned = []
    for role, count in (("scheduler", 1), ("server", 1), ("worker", 2)):
        [container] = _by_kind(documents, "Job", role)["spec"]["template"]["spec"][
            "containers"]
        for index in range(count):
            # and the NumPy kernels, as this process's (tests/kvstore/conftest.py)
            env = {"PATH": os.environ["PATH"], "MIXRT_JIT": "0",
                   **_pod_environment(documents, role, index)}
            name = "scheduler" if role == "scheduler" else f"{role} {index}"
            planned.append(Planned(name, role, _here(container["command"]), env))
    stdout, stderr = io.StringIO(), io.StringIO()
    status = Supervisor(planned, stdout=stdout, stderr=stderr).run()
    output = stdout.getvalue() + stderr.getvalue()
    assert status == 0, output
    for case in fit_job.scenarios("dist_sync"):
        expected = fit_job.reference(case, 2)
        with np.load(out / f"{case['name']}.npz", allow_pickle=False) as trained:
            for key, value in expected.items():
                assert np.abs(trained[key] - value).max() / np.abs(value).max() <= 1e-6


def test_the_cli_refuses_a_job_without_an_image(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mixrt", "launch", "--launcher", "kubernetes",
                           "-n", "1", "-s", "1", "--", "python", "t.py"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode != 0 and "--image" in done.stderr


@pytest.mark.parametrize("options,message", [
    (["--image", "i:1"], "--image is for --launcher kubernetes"),
    (["--launcher", "ssh", "--sbatch", "job.sh"], "not ssh"),
    (["--launcher", "kubernetes", "--image", "i:1", "--wait"], "--wait is for --sbatch"),
])
def test_an_option_of_another_launcher_is_refused(tmp_path, options, message):
    done = subprocess.run([sys.executable, "-m", "mixrt", "launch", "-n", "1", "-s", "1",
                           *options, "--", "python", "t.py"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr, done.stderr

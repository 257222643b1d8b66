"""Kubernetes: a KVStore job as manifests, printed or applied with kubectl.

    mixrt launch --launcher kubernetes -n 4 -s 2 --image registry/train:1 \\
        --gpus-per-worker 1 --node-selector gpu=h100 -- python train.py > job.yaml
    mixrt launch --launcher kubernetes ... --apply -- python train.py   # kubectl apply -f -

The job is four kinds of object, all labelled ``mixrt.job: NAME``:

* a Secret ``NAME-auth`` holding ``MIXRT_KV_SECRET``, the job's shared secret (fresh unless
  the launcher's environment sets one): pods reach each other over the cluster's network, so
  the store authenticates and encrypts (kvstore/dist/security.py). It reaches the pods as an
  environment variable from the Secret, never on a command line;
* a headless Service ``NAME-scheduler`` whose name resolves to the scheduler's pod (published
  before the pod is ready, so that servers and workers can dial it while it starts);
* three Indexed Jobs, ``NAME-scheduler`` (1 pod), ``NAME-server`` (S) and ``NAME-worker``
  (W). Each pod's ``DMLC_*`` variables are MXNet's; ``MIXRT_KV_ROLE_INDEX`` is the pod's
  completion index, so "worker 1" is index 1. The scheduler binds its pod's IP; the others
  dial the Service. Workers get ``--gpus-per-worker`` GPUs (``nvidia.com/gpu``); every pod
  the ``--node-selector`` labels. A pod that fails is not retried (``backoffLimit: 0``): the
  store's heartbeats turn a lost peer into an error in the others, so the job ends failed.

The scheduler and servers run ``python3 -m mixrt.kvstore.dist`` in the same image as the
workers' command.
"""

from __future__ import annotations

import secrets
import subprocess

from mixrt.base.errors import KVStoreError, missing_dependency

DIST_COMMAND = ["python3", "-m", "mixrt.kvstore.dist"]
DEFAULT_PORT = 9091
INDEX_ANNOTATION = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
SECRET_KEY = "MIXRT_KV_SECRET"
GPU_RESOURCE = "nvidia.com/gpu"
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789-")


def manifests(command: list[str], num_workers: int, num_servers: int, *, image: str,
              name: str | None = None, namespace: str = "default", port: int | None = None,
              gpus_per_worker: int = 0, node_selector: dict | None = None,
              secret: str | None = None) -> list[dict]:
    """The job's objects, in the order kubectl should create them."""
    name = job_name(name)
    if not image:
        raise KVStoreError("the kubernetes launcher needs the image its pods run (--image)")
    if not isinstance(gpus_per_worker, int) or gpus_per_worker < 0:
        raise KVStoreError(f"--gpus-per-worker must be 0 or more, got {gpus_per_worker!r}")
    port = DEFAULT_PORT if port is None else port
    job = _Job(name, namespace, image, port, num_servers, num_workers,
               dict(node_selector or {}))
    return [job.secret(secret or secrets.token_urlsafe(32)), job.service(),
            job.indexed_job("scheduler", 1, DIST_COMMAND),
            job.indexed_job("server", num_servers, DIST_COMMAND),
            job.indexed_job("worker", num_workers, list(command), gpus_per_worker)]


def job_name(name: str | None) -> str:
    """``name``, checked to make valid object names (``NAME-scheduler``: a DNS label), or a
    fresh ``mixrt-XXXXXX``."""
    if name is None:
        return f"mixrt-{secrets.token_hex(3)}"
    if not name or len(name) > 40 or not set(name) <= _NAME_CHARS or \
            not name[0].isalpha() or name.endswith("-"):
        raise KVStoreError(f"--job-name must be lower-case letters, digits and '-', start "
                           f"with a letter, at most 40 characters, got {name!r}")
    return name


def parse_node_selector(pairs: list[str]) -> dict[str, str]:
    """``key=value`` strings as a node selector."""
    selector = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key:
            raise KVStoreError(f"--node-selector takes key=value, got {pair!r}")
        selector[key] = value
    return selector


class _Job:
    """The objects of one job, which share its name, namespace, image and labels."""

    def __init__(self, name, namespace, image, port, num_servers, num_workers, selector):
        self.name, self.namespace, self.image, self.port = name, namespace, image, port
        self.num_servers, self.num_workers, self.selector = num_servers, num_workers, selector

    def _metadata(self, name: str, role: str | None = None) -> dict:
        labels = {"app.kubernetes.io/name": "mixrt", "mixrt.job": self.name}
        if role is not None:
            labels["mixrt.role"] = role
        return {"name": name, "namespace": self.namespace, "labels": labels}

    def secret(self, value: str) -> dict:
        return {"apiVersion": "v1", "kind": "Secret",
                "metadata": self._metadata(f"{self.name}-auth"), "type": "Opaque",
                "stringData": {SECRET_KEY: value}}

    def service(self) -> dict:
        return {"apiVersion": "v1", "kind": "Service",
                "metadata": self._metadata(f"{self.name}-scheduler", "scheduler"),
                "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                         "selector": {"mixrt.job": self.name, "mixrt.role": "scheduler"},
                         "ports": [{"name": "kvstore", "port": self.port,
                                    "targetPort": self.port}]}}

    def indexed_job(self, role: str, count: int, argv: list[str], gpus: int = 0) -> dict:
        container = {"name": role, "image": self.image, "command": argv,
                     "env": self.environment(role)}
        if role == "scheduler":
            container["ports"] = [{"name": "kvstore", "containerPort": self.port}]
        if gpus:
            container["resources"] = {"limits": {GPU_RESOURCE: gpus}}
        pod = {"restartPolicy": "Never", "containers": [container]}
        if self.selector:
            pod["nodeSelector"] = dict(self.selector)
        metadata = self._metadata(f"{self.name}-{role}", role)
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata,
                "spec": {"completionMode": "Indexed", "completions": count,
                         "parallelism": count, "backoffLimit": 0,
                         "template": {"metadata": {"labels": dict(metadata["labels"])},
                                      "spec": pod}}}

    def environment(self, role: str) -> list[dict]:
        """MXNet's variables as the pod of ``role`` sees them."""
        scheduler = f"{self.name}-scheduler"
        root = _field("status.podIP") if role == "scheduler" else {"value": scheduler}
        return [{"name": "DMLC_ROLE", "value": role},
                {"name": "DMLC_PS_ROOT_URI", **root},
                {"name": "DMLC_PS_ROOT_PORT", "value": str(self.port)},
                {"name": "DMLC_NUM_SERVER", "value": str(self.num_servers)},
                {"name": "DMLC_NUM_WORKER", "value": str(self.num_workers)},
                {"name": "DMLC_NODE_HOST", **_field("status.podIP")},
                {"name": "MIXRT_KV_ROLE_INDEX", **_field(INDEX_ANNOTATION)},
                {"name": SECRET_KEY, "valueFrom": {"secretKeyRef": {
                    "name": f"{self.name}-auth", "key": SECRET_KEY}}},
                {"name": "PYTHONUNBUFFERED", "value": "1"}]


def _field(path: str) -> dict:
    return {"valueFrom": {"fieldRef": {"fieldPath": path}}}


def as_yaml(documents: list[dict]) -> str:
    try:
        import yaml  # noqa: PLC0415  (PyYAML, an extra: only when manifests are written)
    except ImportError as exc:
        raise missing_dependency("mixrt launch --launcher kubernetes", "PyYAML",
                                 "kubernetes") from exc
    return yaml.safe_dump_all(documents, sort_keys=False)


def apply(documents: list[dict], kubectl: list[str]) -> int:
    """``kubectl apply -f -`` with the manifests on its standard input (the Secret's value
    on no command line); kubectl's status."""
    try:
        done = subprocess.run([*kubectl, "apply", "-f", "-"], input=as_yaml(documents),
                              text=True)
    except OSError as exc:
        raise KVStoreError(f"cannot run {kubectl[0]}: {exc}") from exc
    return done.returncode

"""The KServe examples in ``examples/kubernetes/`` say what ``mixrt serve`` accepts: the
ServingRuntime's container command is a ``mixrt serve`` the command line parses, on the
ports the runtime declares, and the InferenceService names that runtime."""

from __future__ import annotations

from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

from mixrt.cli import _parser  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kubernetes"


def load(name: str) -> dict:
    return yaml.safe_load((EXAMPLES / name).read_text())


def test_the_serving_runtime_runs_a_mixrt_serve_the_command_line_accepts():
    runtime = load("kserve-servingruntime.yaml")
    assert runtime["kind"] == "ServingRuntime" and "v2" in runtime["spec"]["protocolVersions"]
    container = runtime["spec"]["containers"][0]
    command = container["command"]
    assert command[:2] == ["mixrt", "serve"]
    args = _parser().parse_args(command[1:])
    assert args.source == "/mnt/models" and args.name == "{{.Name}}"
    ports = {port["containerPort"] for port in container["ports"]}
    assert {args.http_port, args.grpc_port} <= ports
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready",
                                                      "port": args.http_port}
    assert runtime["spec"]["annotations"]["prometheus.kserve.io/port"] \
        == str(args.metrics_port)


def test_the_inference_service_asks_for_that_runtime():
    service = load("kserve-inferenceservice.yaml")
    model = service["spec"]["predictor"]["model"]
    runtime = load("kserve-servingruntime.yaml")
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in {f["name"] for f in
                                            runtime["spec"]["supportedModelFormats"]}
    assert model["protocolVersion"] == "v2"

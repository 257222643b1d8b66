"""The REST front end of a ``mixrt serve`` worker: KServe's v2 endpoints (health, server and
model metadata, readiness, JSON inference) on a FastAPI app, with what mixrt adds
registered before them, so that these routes are matched first:

* the versions of a model: ``/v2/models/NAME/versions/V`` (metadata) and ``.../ready``;
* Triton's repository API as its clients call it: ``POST /v2/repository/index`` (each
  version and its state) and load/unload that reach every worker before they answer;
* what Triton's perf tools read: the statistics, ``GET /v2/models/stats``,
  ``/v2/models/NAME/stats``, ``/v2/models/NAME/versions/V/stats`` (``statistics.py``), and
  the model configuration, ``GET /v2/models/NAME[/versions/V]/config``;
* the outcomes of ``outcomes.py`` as their statuses, with ``Retry-After`` on a 503.

In front of it all, ``binary_rest.BinaryTensors`` caps bodies and answers binary and
versioned inference itself.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from kserve.errors import (InferenceError, InvalidInput, ModelNotFound, ModelNotReady,
                           ServerNotLive, ServerNotReady)
from kserve.protocol.dataplane import DataPlane
from kserve.protocol.model_repository_extension import ModelRepositoryExtension
from kserve.protocol.rest.v2_endpoints import register_v2_endpoints

from mixrt.serve import statistics
from mixrt.serve.binary_rest import BinaryTensors
from mixrt.serve.outcomes import ServeError

logger = logging.getLogger("mixrt.serve")

# KServe's errors, where they reach the app, as the statuses its own server gives them
KSERVE_STATUSES = {InvalidInput: 400, ModelNotFound: 404, ModelNotReady: 503,
                   ServerNotReady: 503, ServerNotLive: 503, InferenceError: 500,
                   NotImplementedError: 501}


def application(repository, operations, max_body_bytes: int):
    """The ASGI app: ``repository`` a ``model.MixrtRepository``, ``operations`` what loads
    and unloads a model in every worker (``server.SharedOperations``)."""
    app = FastAPI(title="mixrt serve", docs_url=None, redoc_url=None, openapi_url=None)
    _add_mixrt_routes(app, repository, operations)
    register_v2_endpoints(app, DataPlane(model_registry=repository),
                          ModelRepositoryExtension(model_registry=repository))
    app.add_exception_handler(ServeError, _outcome)
    for kind, status in KSERVE_STATUSES.items():
        app.add_exception_handler(kind, _kserve_error(status))
    return BinaryTensors(app, repository, max_body_bytes)


def _add_mixrt_routes(app: FastAPI, repository, operations) -> None:
    async def version_metadata(name: str, version: str) -> dict:
        return repository.served(name, version).metadata()

    async def version_ready(name: str, version: str) -> JSONResponse:
        repository.served(name, version)  # a NotFound (404) where it is not ready
        return JSONResponse({"name": name, "version": version, "ready": True})

    async def index(request: Request) -> list:
        body = await request.json() if await request.body() else {}
        listed = repository.index()
        if isinstance(body, dict) and body.get("ready"):
            listed = [m for m in listed if m["state"] == "READY"]
        return listed

    async def load(name: str) -> JSONResponse:
        await operations.load(name)
        return JSONResponse({"name": name, "load": True})

    async def unload(name: str) -> JSONResponse:
        await operations.unload(name)
        return JSONResponse({"name": name, "unload": True})

    async def config(name: str, version: str | None = None) -> dict:
        return repository.served(name, version).config()

    async def stats(name: str | None = None, version: str | None = None) -> dict:
        return {"model_stats": statistics.model_stats(repository.pairs(name, version))}

    routes = [("/v2/models/stats", stats, "GET"),
              ("/v2/models/{name}/stats", stats, "GET"),
              ("/v2/models/{name}/versions/{version}/stats", stats, "GET"),
              ("/v2/models/{name}/config", config, "GET"),
              ("/v2/models/{name}/versions/{version}/config", config, "GET"),
              ("/v2/models/{name}/versions/{version}", version_metadata, "GET"),
              ("/v2/models/{name}/versions/{version}/ready", version_ready, "GET"),
              ("/v2/repository/index", index, "POST"),
              ("/v2/repository/models/{name}/load", load, "POST"),
              ("/v2/repository/models/{name}/unload", unload, "POST")]
    for path, handler, method in routes:
        app.add_api_route(path, handler, methods=[method])


async def _outcome(request: Request, exc: ServeError) -> JSONResponse:
    del request
    return JSONResponse({"error": str(exc)}, status_code=exc.status, headers=exc.headers())


def _kserve_error(status: int):
    async def handler(request: Request, exc: Exception) -> JSONResponse:
        del request
        if status >= 500:
            logger.error("%s: %s", type(exc).__name__, exc)
        return JSONResponse({"error": str(exc)}, status_code=status)
    return handler

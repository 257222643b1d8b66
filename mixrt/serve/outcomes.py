"""What a request to ``mixrt serve`` can end in besides an answer, one class per outcome,
each with the HTTP status and the gRPC status code the two front ends give it.

The model's code raises these; ``rest.py`` turns one into a JSON ``{"error": ...}`` with its
status (and ``Retry-After`` for an overload), ``grpc_service.py`` into its status code, so
that a client reads the same outcome on either transport: 4xx/``INVALID_ARGUMENT`` for a
request it must change, 503/``UNAVAILABLE`` for "busy, retry", 504/``DEADLINE_EXCEEDED``
for a request that ran out of time, 500/``INTERNAL`` for a model that failed.
"""

from __future__ import annotations

import math

import grpc

from mixrt.base.errors import MixrtError


class ServeError(MixrtError):
    status = 500
    code = grpc.StatusCode.INTERNAL
    outcome = "error"  # the mixrt_requests metric's label

    def headers(self) -> dict:
        return {}


class BadRequest(ServeError):
    """The request does not fit the model: a wrong name, datatype, shape or value."""

    status = 400
    code = grpc.StatusCode.INVALID_ARGUMENT
    outcome = "bad_request"


class NotFound(ServeError):
    """No such model, or no such version of it."""

    status = 404
    code = grpc.StatusCode.NOT_FOUND
    outcome = "not_found"


class Overloaded(ServeError):
    """The model's queue is full: refused at once, to be retried after ``retry_after`` s."""

    status = 503
    code = grpc.StatusCode.UNAVAILABLE
    outcome = "overloaded"

    def __init__(self, message: str, retry_after: float):
        super().__init__(message)
        self.retry_after = retry_after

    def headers(self) -> dict:
        # HTTP's Retry-After is whole seconds
        return {"Retry-After": str(max(1, math.ceil(self.retry_after)))}


class TimedOut(ServeError):
    """No answer within the request's deadline (the server's or the client's own)."""

    status = 504
    code = grpc.StatusCode.DEADLINE_EXCEEDED
    outcome = "timeout"


class RunFailed(ServeError):
    """The model's run raised: the server's fault or the model's, not the request's."""

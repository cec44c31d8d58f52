"""One error tree for the project; the front ends map it to gRPC and HTTP status at the edge.

::

    AccscaleError
    ├── RequestError              a request is answered with this error; ``code`` says how
    │   ├── InvalidRequest        INVALID_ARGUMENT / 400: bad tensors, bad slo_us
    │   │   └── SloInfeasible     the SLO is below the fastest option's latency
    │   ├── UnknownModel          NOT_FOUND / 404
    │   ├── Unavailable           UNAVAILABLE / 503: queue full, no healthy worker, shutting down
    │   ├── DeadlineExceeded      DEADLINE_EXCEEDED / 504: no option can meet the deadline any more
    │   ├── PermissionDenied      PERMISSION_DENIED / 403: the admin endpoints
    │   └── InternalError         INTERNAL / 500: a bug; the request still gets this answer
    ├── WorkerError               a worker could not run a batch (``worker``: its URL; ``queries``: the batch's ids)
    │   ├── WorkerLost            the worker is gone mid-call; its queries are retried elsewhere
    │   │   └── WorkerUnreachable its connection was down when the call failed (refused, reset, no route)
    │   └── WorkerFailed          the worker answered with an error; it is relayed with the worker's code
    │       ├── WorkerTimeout     no answer within the call's deadline (DEADLINE_EXCEEDED)
    │       └── WorkerRefused     it answered that it will not run the batch now (RESOURCE_EXHAUSTED)
    ├── ConfigError               a configuration, flag or option the user must fix (also a ValueError)
    ├── ProfileError              a profile file that breaks the schema (also a ValueError)
    ├── TraceError                a trace file that breaks the format (``loadtest.traces``; also a ValueError)
    ├── TritonLaunchError         tritonserver is not installed or did not start (``processes.triton_launcher``)
    ├── SidecarStartError         the sidecar subprocess did not start (``processes.sidecar``)
    └── PolicyError               a decision the engine cannot carry out: a bug in the policy

``accscale`` prints an ``AccscaleError`` (and a file it cannot read, or an error Triton answered) as one line
and exits 2; any other exception is a bug, and its traceback is printed.
"""

from __future__ import annotations

import enum
from typing import ClassVar


class Code(enum.Enum):
    """How a request error is spelled on the wire: (gRPC status name, HTTP status)."""

    INVALID_ARGUMENT = ("INVALID_ARGUMENT", 400)
    NOT_FOUND = ("NOT_FOUND", 404)
    UNAVAILABLE = ("UNAVAILABLE", 503)
    # HTTP has no deadline of its own; 504 says "the answer did not come in time", unlike 503 (try later)
    DEADLINE_EXCEEDED = ("DEADLINE_EXCEEDED", 504)
    PERMISSION_DENIED = ("PERMISSION_DENIED", 403)
    # refused at admission because the queue ahead makes the request's SLO infeasible: retry elsewhere or later
    RESOURCE_EXHAUSTED = ("RESOURCE_EXHAUSTED", 429)
    INTERNAL = ("INTERNAL", 500)

    @property
    def http(self) -> int:
        return self.value[1]


class AccscaleError(Exception):
    """Base of every error the project raises on purpose."""


class RequestError(AccscaleError):
    """A request answered with an error; ``code`` is how the front ends spell it."""

    code: ClassVar[Code] = Code.INTERNAL

    @property
    def message(self) -> str:
        return str(self)


class InvalidRequest(RequestError):
    code = Code.INVALID_ARGUMENT


class SloInfeasible(InvalidRequest):
    pass


class Overloaded(RequestError):
    """Refused on arrival: the requests queued ahead already take more than its SLO (load shedding)."""

    code = Code.RESOURCE_EXHAUSTED


class UnknownModel(RequestError):
    code = Code.NOT_FOUND


class Unavailable(RequestError):
    code = Code.UNAVAILABLE


class DeadlineExceeded(RequestError):
    code = Code.DEADLINE_EXCEEDED


class PermissionDenied(RequestError):
    code = Code.PERMISSION_DENIED


class InternalError(RequestError):
    code = Code.INTERNAL


class WorkerError(AccscaleError):
    """A worker could not run a batch: ``worker`` says which (its URL live; the engine's worker id where that is all
    it knows), ``queries`` the ids of the batch's queries (as httpx's errors carry their request), where known."""

    def __init__(self, message: str, *, worker: str = "", queries: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.worker, self.queries = worker, queries

    def about(self, queries: tuple[int, ...]) -> WorkerError:
        """This error, saying which queries' batch it ended."""
        self.queries = queries
        return self


class WorkerLost(WorkerError):
    """The worker is gone (connection lost, cancelled); the batch may be retried on another one."""


class WorkerUnreachable(WorkerLost):
    """The worker's connection was down when the call failed (refused, reset, no route): the worker may or may not
    have seen the batch, which is retried elsewhere as for any lost worker."""


class WorkerFailed(WorkerError, RequestError):
    """The worker answered with an error; each query of the batch is answered with it."""

    def __init__(self, message: str, code: Code = Code.INTERNAL, *, worker: str = "",
                 queries: tuple[int, ...] = ()) -> None:
        super().__init__(message, worker=worker, queries=queries)
        self.code = code  # type: ignore[misc]  # the worker's own status, relayed


class WorkerTimeout(WorkerFailed):
    """The worker gave no answer within the call's deadline."""

    def __init__(self, message: str, *, worker: str = "", queries: tuple[int, ...] = ()) -> None:
        super().__init__(message, Code.DEADLINE_EXCEEDED, worker=worker, queries=queries)


class WorkerRefused(WorkerFailed):
    """The worker answered that it will not run the batch now (its own queue is full)."""

    def __init__(self, message: str, *, worker: str = "", queries: tuple[int, ...] = ()) -> None:
        super().__init__(message, Code.RESOURCE_EXHAUSTED, worker=worker, queries=queries)


class ConfigError(AccscaleError, ValueError):
    """A configuration file, flag or policy option that the user must fix; the message says how."""


class ProfileError(AccscaleError, ValueError):
    """A profile file that does not follow the schema; the message says where."""


class PolicyError(AccscaleError, RuntimeError):
    """A decision that cannot be carried out: a bug in the policy, not bad input."""

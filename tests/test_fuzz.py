"""Hostile clients against a real sidecar in front of a real Triton.

Hypothesis generates a few thousand requests over HTTP and gRPC: well-formed ones with one part
replaced by arbitrary JSON or protobuf values, random and cut-off bodies, lying lengths, hostile
but legal values (NaN pixels, the largest SLO allowed). Meanwhile a bystander sends well-formed
requests without pause. Checked: every request gets an answer; an error is always an explicit
client error (HTTP 4xx with a JSON ``error``, or INVALID_ARGUMENT / NOT_FOUND /
RESOURCE_EXHAUSTED / DEADLINE_EXCEEDED), never a 500 or UNKNOWN (over HTTP, DEADLINE_EXCEEDED is a 504,
accepted only for a well-formed request whose SLO is fuzzed or the model's default); a request that is certainly
malformed is refused; every bystander request is answered; and afterwards the sidecar is ready,
has marked no worker down and still answers. Oversized and stalled requests are tried too.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import threading
import urllib.request

import grpc
import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from scheduler_sidecar.processes.sidecar import SidecarServer
from scheduler_sidecar.server.grpc_frontend import ERROR_METADATA
from tests.test_sidecar import EDGES, metric, metrics

pytestmark = [pytest.mark.triton, pytest.mark.slow]

EXAMPLES = 1200  # generated requests per protocol
LIMIT = 1 << 20  # the fuzzed sidecar's max_request_bytes
READ_TIMEOUT_S, IDLE_TIMEOUT_S = 0.5, 1.0
SHAPE = [1, 1, 16, 16]
PIXELS = 256
GOOD_SLO_US = 10_000_000  # the bystander's: answered, never dropped, however busy the fuzzing keeps the box
CLIENT_ERRORS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.RESOURCE_EXHAUSTED,
                 grpc.StatusCode.DEADLINE_EXCEEDED}


@pytest.fixture(scope="module")
def sidecar(fast_build, triton, tmp_path_factory, request):
    """The fuzzed sidecar, on the edge a test names (``indirect`` parametrization), else Python's."""
    edge = getattr(request, "param", "python")
    if edge == "native":
        request.getfixturevalue("native_edge")
    config = tmp_path_factory.mktemp("fuzz") / "sidecar.toml"
    config.write_text(f"max_request_bytes = {LIMIT}\nread_timeout_s = {READ_TIMEOUT_S}\n"
                      f"idle_timeout_s = {IDLE_TIMEOUT_S}\n\n[[models]]\nname = \"digits\"\n"
                      f"profile = \"{fast_build.profile_path}\"\n")
    with SidecarServer(workers=[triton.grpc_url], config=config, extra_args=["--edge", edge]) as server:
        yield server


class Bystander:
    """A well-formed client sending without pause on its own thread; every answer is checked."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.answered, self.failures = 0, []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        tensor = grpcclient.InferInput("INPUT", SHAPE, "FP32")
        tensor.set_data_from_numpy(np.random.default_rng(0).normal(size=SHAPE).astype(np.float32))
        with grpcclient.InferenceServerClient(self.url) as client:
            while not self.stop.is_set():
                try:
                    logits = client.infer("digits", [tensor], parameters={"slo_us": GOOD_SLO_US}).as_numpy("LOGITS")
                    assert logits.shape == (1, 10) and np.isfinite(logits).all()
                    self.answered += 1
                except Exception as exc:  # noqa: BLE001 - every failure is reported by the test
                    self.failures.append(repr(exc))

    def __enter__(self) -> Bystander:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive()
        assert self.failures == [] and self.answered > 0


# ----------------------------------------------------------------------------- what the fuzzers send
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30) | st.floats()
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12)
pixels = st.lists(st.floats(width=32), min_size=PIXELS, max_size=PIXELS)  # NaN and infinities included


def good_body(data: list[float] | None = None, slo_us: object = GOOD_SLO_US) -> dict:
    return {"id": "fuzz", "parameters": {"slo_us": slo_us},
            "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": list(SHAPE), "data": data or [0.0] * PIXELS}],
            "outputs": [{"name": "LOGITS", "parameters": {"binary_data": False}}]}


# paths into good_body(); a replacement at the ones marked True is malformed whatever it is (unless equal)
PATHS = {("parameters",): False, ("parameters", "slo_us"): False, ("parameters", "binary_data_output"): False,
         ("id",): False, ("inputs",): True, ("inputs", 0): True, ("inputs", 0, "name"): True,
         ("inputs", 0, "datatype"): True, ("inputs", 0, "shape"): True, ("inputs", 0, "data"): True,
         ("inputs", 0, "parameters"): False, ("outputs",): False, ("outputs", 0): False,
         ("outputs", 0, "name"): True, ("outputs", 0, "parameters"): False}


# paths into binary_body()'s header, as PATHS: the native edge reads this shape itself, and passes any other whole
BINARY_PATHS = {("parameters",): False, ("parameters", "slo_us"): False, ("id",): False, ("inputs",): True,
                ("inputs", 0): True, ("inputs", 0, "name"): True, ("inputs", 0, "datatype"): True,
                ("inputs", 0, "shape"): True, ("inputs", 0, "shape", 0): True, ("inputs", 0, "parameters"): True,
                ("inputs", 0, "parameters", "binary_data_size"): True, ("outputs",): False, ("outputs", 0): False,
                ("outputs", 0, "name"): True, ("outputs", 0, "parameters"): False,
                ("outputs", 0, "parameters", "binary_data"): False}


def binary_body() -> dict:
    body = good_body()
    del body["inputs"][0]["data"]
    body["inputs"][0]["parameters"] = {"binary_data_size": PIXELS * 4}
    return body


def _replace(draw, body: dict, paths: dict) -> bool:
    """Replaces the value at one of ``paths`` in ``body`` with a drawn JSON value; whether that is certainly
    malformed."""
    path, certain = draw(st.sampled_from(sorted(paths.items(), key=str)))
    parent = body
    for key in path[:-1]:
        parent = parent[key]
    value = draw(json_values)
    old = parent[path[-1]] if isinstance(parent, list) else parent.get(path[-1])
    changed = json.dumps(value) != json.dumps(old)
    parent[path[-1]] = value
    return certain and changed


@st.composite
def http_requests(draw) -> tuple[bytes, dict[str, str], bool]:
    """(body, headers, certainly malformed)."""
    kind = draw(st.sampled_from(["replace", "replace", "replace", "legal", "bytes", "cut", "binary", "binary_replace",
                                 "binary_replace"]))
    if kind == "binary_replace":  # the binary-tensor extension, one value of its header changed
        body = binary_body()
        malformed = _replace(draw, body, BINARY_PATHS)
        header = json.dumps(body).encode()
        return header + np.zeros(PIXELS, np.float32).tobytes(), {"Inference-Header-Content-Length": str(len(header))}, \
            malformed
    if kind == "legal":  # hostile values a well-formed request may carry: they reach Triton and its batch-mates
        slo = draw(st.sampled_from([GOOD_SLO_US, 60_000_000, 60_000_000.0]))
        return json.dumps(good_body(draw(pixels), slo)).encode(), {}, False
    if kind == "bytes":
        return draw(st.binary(max_size=300)), {}, True
    if kind == "cut":
        text = json.dumps(good_body()).encode()
        return text[:draw(st.integers(0, len(text) - 1))], {}, True
    if kind == "binary":  # the binary-tensor extension with lying sizes
        body = binary_body()
        size = draw(st.integers(-5, 2 * PIXELS * 4))
        body["inputs"][0]["parameters"] = {"binary_data_size": size}
        header = json.dumps(body).encode()
        tail = draw(st.binary(min_size=0, max_size=2 * PIXELS * 4))
        length = draw(st.sampled_from([str(len(header)), str(len(header) + draw(st.integers(-20, 20))), "x", "-1"]))
        malformed = not (size == len(tail) == PIXELS * 4 and length == str(len(header)))
        return header + tail, {"Inference-Header-Content-Length": length}, malformed
    body = good_body()
    malformed = _replace(draw, body, PATHS)
    return json.dumps(body).encode(), {}, malformed


@st.composite
def grpc_requests(draw) -> tuple[pb.ModelInferRequest, bool, int]:
    """(request, certainly malformed, its rows where it is not). Two rows of [1, 16, 16] with two rows' data are a
    legal request of two queries, answered when the sidecar admits them."""
    if draw(st.sampled_from(["legal", "random", "random"])) == "legal":  # well-formed, hostile values
        request = pb.ModelInferRequest(model_name="digits")
        request.inputs.add(name="INPUT", datatype="FP32", shape=SHAPE)
        request.raw_input_contents.append(np.asarray(draw(pixels), np.float32).tobytes())
        slo = draw(st.sampled_from([GOOD_SLO_US, 60_000_000]))
        if draw(st.booleans()):
            request.parameters["slo_us"].int64_param = slo
        else:
            request.parameters["slo_us"].double_param = float(slo)
        return request, False, 1
    malformed, rows = False, 1
    name = draw(st.sampled_from(["digits", "digits", "digits", "", "nope", "d" * 100_000]))
    malformed |= name != "digits"
    request = pb.ModelInferRequest(model_name=name, model_version=draw(st.sampled_from(["", "", "1", "2"])))
    malformed |= request.model_version == "2"
    for key in draw(st.lists(st.sampled_from(["slo_us", "binary_data_output", "other"]), max_size=3, unique=True)):
        field, value = draw(st.one_of(
            st.tuples(st.just("int64_param"), st.integers(-(2**63), 2**63 - 1)),
            st.tuples(st.just("double_param"), st.floats()),
            st.tuples(st.just("string_param"), st.text(max_size=20)),
            st.tuples(st.just("bool_param"), st.booleans())))
        setattr(request.parameters[key], field, value)
    n_inputs = draw(st.sampled_from([1, 1, 1, 0, 2]))
    malformed |= n_inputs != 1
    raw = draw(st.booleans())
    for _ in range(n_inputs):
        tensor = request.inputs.add(name=draw(st.sampled_from(["INPUT", "INPUT", "EXTRA", ""])),
                                    datatype=draw(st.sampled_from(["FP32", "FP32", "FP64", "INT8", "BYTES", "??"])))
        shape = draw(st.sampled_from([SHAPE, SHAPE, [2, 1, 16, 16], [1, 256], []]) | st.lists(
            st.integers(-(2**63), 2**63 - 1), max_size=5))
        tensor.shape.extend(shape)
        rows = shape[0] if list(shape) in (SHAPE, [2, *SHAPE[1:]]) else 1
        malformed |= tensor.name != "INPUT" or tensor.datatype != "FP32" or list(shape) != [rows, *SHAPE[1:]]
        if raw:
            size = draw(st.sampled_from([PIXELS * 4, PIXELS * 4, 0, 7, PIXELS * 8]))
            request.raw_input_contents.append(np.full(size // 4, draw(st.floats(width=32)), np.float32).tobytes()
                                              + b"\0" * (size % 4))
            malformed |= size != PIXELS * 4 * rows
        else:
            count = draw(st.sampled_from([PIXELS, PIXELS, 0, 1, PIXELS + 1, 2 * PIXELS]))
            tensor.contents.fp32_contents.extend([draw(st.floats(width=32))] * count)
            malformed |= count != PIXELS * rows
    if draw(st.booleans()):
        request.outputs.add(name=draw(st.sampled_from(["LOGITS", "LOGITS", "PROBS", ""])))
        malformed |= request.outputs[0].name != "LOGITS"
    return request, malformed, rows


def _http(sidecar, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    """The status and the JSON header of the answer (a binary tail is checked and cut off)."""
    connection = http.client.HTTPConnection(sidecar.host, sidecar.http_port, timeout=30)
    try:
        connection.request("POST", "/v2/models/digits/infer", body=body, headers=headers)
        response = connection.getresponse()
        reply, length = response.read(), response.getheader("Inference-Header-Content-Length")
        if length is not None:  # an answer whose output was asked for as binary: its one output's bytes follow
            assert response.status == 200 and len(reply) - int(length) == 40, (length, len(reply))
            reply = reply[:int(length)]
        return response.status, reply
    finally:
        connection.close()


def _deadline_may_bind(body: bytes, headers: dict[str, str]) -> bool:
    """Whether a request's SLO may be missed on a busy machine: it is not at least the bystander's (a fuzzed value, or
    none given: the model's default)."""
    try:
        header = body[:int(headers["Inference-Header-Content-Length"])] if headers else body
        slo = json.loads(header)["parameters"]["slo_us"]
    except (ValueError, KeyError, TypeError, IndexError):
        return True
    return isinstance(slo, bool) or not isinstance(slo, (int, float)) or not slo >= GOOD_SLO_US


def _healthy_after(sidecar) -> None:
    assert psutil.pid_exists(sidecar.pid)
    with urllib.request.urlopen(f"http://{sidecar.http_url}/v2/health/ready") as response:
        assert response.status == 200
    text = metrics(sidecar)
    assert metric(text, "accscale_worker_failures_total") == 0 and metric(text, "accscale_worker_healthy") == 1
    with grpcclient.InferenceServerClient(sidecar.grpc_url) as client:
        tensor = grpcclient.InferInput("INPUT", SHAPE, "FP32")
        tensor.set_data_from_numpy(np.zeros(SHAPE, np.float32))
        assert client.infer("digits", [tensor]).as_numpy("LOGITS").shape == (1, 10)


FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("sidecar", EDGES, indirect=True)
def test_http_fuzz(sidecar):
    seen = {"answered": 0, "refused": 0}

    @FUZZ
    @given(http_requests())
    def one(case):
        body, headers, malformed = case
        status, reply = _http(sidecar, body, headers)
        if status == 504 and not malformed and _deadline_may_bind(body, headers):
            # HTTP's DEADLINE_EXCEEDED, which gRPC's fuzzing accepts too: a request whose SLO is fuzzed or the model's
            # default may be dropped for it on a machine the other tests keep busy (never one with the bystander's SLO)
            assert "deadline" in json.loads(reply)["error"], reply[:300]
            seen["refused"] += 1
            return
        assert status == 200 or 400 <= status < 500, (status, reply[:300])
        if status == 200:
            assert not malformed, body[:300]
            (output,) = json.loads(reply)["outputs"]
            assert output["name"] == "LOGITS" and output["shape"] == [1, 10]
            assert len(output["data"]) == 10 if "data" in output else output["parameters"]["binary_data_size"] == 40
            seen["answered"] += 1
        else:
            assert isinstance(json.loads(reply)["error"], str)
            seen["refused"] += 1

    with Bystander(sidecar.grpc_url):
        one()
    assert seen["answered"] >= 10 and seen["refused"] >= 500  # both kinds were really exercised
    _healthy_after(sidecar)


FRAMING_HEADERS = ["Content-Length: -1", "Content-Length: abc", "Content-Length: 99999999999999999999",
                   "Content-Length: 0", "Content-Length: 5", "Transfer-Encoding: chunked", "Transfer-Encoding: gzip",
                   "Expect: 100-continue", "Connection: close", "Inference-Header-Content-Length: 7",
                   "Inference-Header-Content-Length: -3", ": no name", "no colon", " folded: value", "X: " + "y" * 70_000]
REQUEST_LINES = ["POST /v2/models/digits/infer HTTP/1.1", "POST /v2/models/digits/versions/1/infer HTTP/1.1",
                 "POST /v2/models/%zz/infer HTTP/1.1", "POST /v2/models/a%2Fb/infer HTTP/1.1",
                 "POST /v2/models/digits/infer HTTP/2.0", "POST /v2/models/digits/infer", "GET /v2/health/ready HTTP/1.1",
                 "GET /v2/models/digits/infer HTTP/1.1", "POST  HTTP/1.1", "\x00\xff junk", "POST * HTTP/1.1",
                 "GET /metrics?x=%00 HTTP/1.0"]


@st.composite
def http_wire(draw) -> bytes:
    """Bytes for a connection: a request whose framing is changed (request line, headers, body coding, cut, bytes
    flipped), perhaps followed by a good one on the same connection."""
    body = binary_body()
    header = json.dumps(body).encode()
    payload = header + np.zeros(PIXELS, np.float32).tobytes()
    line = draw(st.sampled_from(REQUEST_LINES))
    fields = ["Host: x", f"Inference-Header-Content-Length: {len(header)}"]
    chunked = draw(st.booleans())
    if chunked:
        sizes = draw(st.lists(st.sampled_from(["10", "zz", "fffffffffffffffff", "-1", "0", "1;ext=1", ""]),
                              max_size=3))
        wire_body = b"".join(f"{size}\r\n".encode() + payload[:16] + b"\r\n" for size in sizes) + b"0\r\n\r\n"
        fields.append("Transfer-Encoding: chunked")
    else:
        wire_body = payload
        fields.append(f"Content-Length: {len(payload)}")
    fields += draw(st.lists(st.sampled_from(FRAMING_HEADERS), max_size=3))
    wire = bytearray(line.encode("latin-1") + b"\r\n" + "".join(f + "\r\n" for f in fields).encode("latin-1")
                     + b"\r\n" + wire_body)
    for _ in range(draw(st.integers(0, 4))):  # flipped bytes
        wire[draw(st.integers(0, len(wire) - 1))] = draw(st.integers(0, 255))
    wire = bytes(wire[:draw(st.integers(0, len(wire)))]) if draw(st.booleans()) else bytes(wire)
    if draw(st.booleans()):  # a good request after it on the same connection
        wire += (f"POST /v2/models/digits/infer HTTP/1.1\r\nInference-Header-Content-Length: {len(header)}\r\n"
                 f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload
    return wire


@pytest.mark.parametrize("sidecar", EDGES, indirect=True)
def test_http_framing_fuzz(sidecar):
    """HTTP's framing, not the request inside it, malformed: whatever arrives, each answer is a well-formed HTTP
    response of a client error or a success, never a server error, and the server stays up. The client sends its bytes
    and ends its side; the server answers what it read and closes."""
    seen = {"answered": 0}

    @settings(max_examples=EXAMPLES // 3, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(http_wire())
    def one(wire):
        with socket.create_connection((sidecar.host, sidecar.http_port), timeout=30) as sock:
            sock.sendall(wire)
            sock.shutdown(socket.SHUT_WR)
            reply = _read_all(sock)
        for status in re.findall(rb"HTTP/1\.[01] (\d{3}) ", reply):
            assert status == b"100" or 200 <= int(status) < 500, reply[:300]
            seen["answered"] += 1

    with Bystander(sidecar.grpc_url):
        one()
    # aiohttp answers few of them (22 of 400 here: it drops a connection whose client has ended its side), the native
    # edge most (291)
    assert seen["answered"] >= 10
    _healthy_after(sidecar)


@pytest.mark.parametrize("sidecar", EDGES, indirect=True)
def test_bytes_that_are_no_text_fail_alone(sidecar):
    """A model name percent-decoded to bytes that are not UTF-8, and a header length that is not ASCII: each gets a
    client error, and the requests around them (the bystander's, taken with them in one burst) are served."""
    header = json.dumps(binary_body()).encode()
    body = header + np.zeros(PIXELS, np.float32).tobytes()
    cases = [("/v2/models/%FF%FE/infer", str(len(header)).encode()), ("/v2/models/digits/infer", b"\xff\xfe")]
    with Bystander(sidecar.grpc_url) as bystander:
        for path, length in cases * 5:
            with socket.create_connection((sidecar.host, sidecar.http_port), timeout=30) as sock:
                sock.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nConnection: close\r\n"
                             b"Inference-Header-Content-Length: " + length + b"\r\n"
                             + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
                status = int(_read_all(sock).split(b" ", 2)[1])
            assert 400 <= status < 500, (path, length, status)
    assert bystander.answered > 0
    _healthy_after(sidecar)


@pytest.mark.parametrize("sidecar", EDGES, indirect=True)
def test_grpc_fuzz(sidecar):
    seen = {"answered": 0, "refused": 0}
    channel = grpc.insecure_channel(sidecar.grpc_url, options=[("grpc.max_send_message_length", -1)])
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

    @FUZZ
    @given(grpc_requests())
    def one(case):
        request, malformed, rows = case
        try:
            response = stub.ModelInfer(request, timeout=30)
        except grpc.RpcError as exc:
            assert exc.code() in CLIENT_ERRORS, (exc.code(), exc.details()[:300])
            assert len(exc.details()) < 1000  # a 100 KB name is not echoed back
            # the sidecar's own answers say so (a client tells them from a broken connection by it); a message over
            # the size limit is refused by gRPC itself, before the sidecar reads it
            marked = any(key == ERROR_METADATA for key, _ in exc.trailing_metadata() or ())
            assert marked or exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, (exc.code(), exc.details()[:300])
            seen["refused"] += 1
            return
        assert not malformed, str(request)[:300]
        assert len(response.raw_output_contents) == 1 and len(response.raw_output_contents[0]) == 40 * rows
        seen["answered"] += 1

    with Bystander(sidecar.grpc_url), contextlib.closing(channel):
        one()
    assert seen["answered"] >= 10 and seen["refused"] >= 500
    _healthy_after(sidecar)


@pytest.mark.parametrize("sidecar", EDGES, indirect=True)
def test_oversized_requests_are_refused_unread(sidecar):
    status, reply = _http(sidecar, b"{" + b" " * LIMIT + b"}", {})
    assert status == 413 and "error" in json.loads(reply)
    with grpc.insecure_channel(sidecar.grpc_url, options=[("grpc.max_send_message_length", -1)]) as channel:
        request = pb.ModelInferRequest(model_name="digits", raw_input_contents=[b"\0" * LIMIT])
        with pytest.raises(grpc.RpcError) as caught:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    _healthy_after(sidecar)


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("sidecar", EDGES, indirect=True)
def test_a_stalled_body_gets_408_and_unfinished_headers_are_cut_off(sidecar):
    with socket.create_connection((sidecar.host, sidecar.http_port), timeout=30) as sock:
        sock.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"inputs\"")
        reply = _read_all(sock)  # the server answers, then closes: recv returns b"" well before the 30 s timeout
    assert reply.startswith(b"HTTP/1.1 408") and b"did not arrive within" in reply
    with socket.create_connection((sidecar.host, sidecar.http_port), timeout=30) as sock:
        sock.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\n")
        assert _read_all(sock) == b""  # closed without an answer: there was no request to answer
    _healthy_after(sidecar)

"""The scheduler sidecar in front of real tritonservers, called with real tritonclient and perf_analyzer."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

from export import data
from scheduler_sidecar.processes.sidecar import SidecarServer
from scheduler_sidecar.processes.triton_launcher import TritonServer

pytestmark = [pytest.mark.triton, pytest.mark.slow]

TOKEN = "test-token"
SLO = {"slo_us": 200_000}


# every test of a sidecar runs against both gRPC edges: grpc.aio, and the native edge (native/edge.cc)
EDGES = ("python", "native")


@pytest.fixture(scope="module", params=EDGES)
def sidecar(fast_build, triton, request):
    if request.param == "native":
        request.getfixturevalue("native_edge")
    with SidecarServer(workers=[triton.grpc_url], profile=fast_build.profile_path,
                       extra_args=["--admin-token", TOKEN, "--edge", request.param]) as server:
        yield server


@pytest.fixture(scope="module")
def images(fast_build) -> np.ndarray:
    return data.load(fast_build.act.spec.image_size)["heldout"].images[:24]


def grpc_input(x: np.ndarray, name: str = "INPUT", dtype: str = "FP32") -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(x.shape), dtype)
    tensor.set_data_from_numpy(x)
    return tensor


def direct(fast_build, triton, variant_id: str, x: np.ndarray) -> np.ndarray:
    """What Triton itself answers for ``x`` under the variant's control row."""
    control = np.asarray([fast_build.profile.variant(variant_id).actuation.control] * len(x), dtype=np.int32)
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        return client.infer("digits_supernet", [grpc_input(x), grpc_input(control, "CONTROL", "INT32")]).as_numpy("LOGITS")


def assert_served(fast_build, triton, x: np.ndarray, logits: np.ndarray, params: dict) -> None:
    assert set(params) >= {"variant", "accuracy", "queue_us", "service_us", "batch_size", "worker"}
    variant = fast_build.profile.variant(params["variant"])
    assert params["accuracy"] == pytest.approx(variant.accuracy)
    assert params["queue_us"] >= 0 and params["service_us"] > 0 and params["batch_size"] >= 1
    np.testing.assert_allclose(logits, direct(fast_build, triton, variant.id, x), rtol=1e-4, atol=1e-4)


def grpc_params(result) -> dict:
    return {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in result.get_response().parameters.items()}


def metrics(sidecar) -> str:
    with urllib.request.urlopen(f"http://{sidecar.http_url}/metrics") as response:
        return response.read().decode()


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{name}{{(.*)}} (\S+)$", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            total += float(m.group(2))
    return total


def admin(sidecar, path: str, body: dict | None, token: str | None = TOKEN) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://{sidecar.http_url}{path}", method="POST" if body is not None else "GET",
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_grpc_answers_equal_triton_with_the_chosen_control_row(fast_build, triton, sidecar, images):
    with grpcclient.InferenceServerClient(sidecar.grpc_url) as client:
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("digits")
        meta = client.get_model_metadata("digits", as_json=True)
        assert [t["name"] for t in meta["inputs"]] == ["INPUT"]  # CONTROL is the sidecar's business
        assert client.get_model_config("digits", as_json=True)["config"]["max_batch_size"] == 64
        for x in images[:4]:
            result = client.infer("digits", [grpc_input(x[None])], parameters=SLO, request_id="r1")
            assert result.get_response().id == "r1"
            assert_served(fast_build, triton, x[None], result.as_numpy("LOGITS"), grpc_params(result))


def test_http_binary_and_json_answers(fast_build, triton, sidecar, images):
    with httpclient.InferenceServerClient(sidecar.http_url) as client:
        assert client.is_server_ready() and client.is_model_ready("digits")
        assert client.get_model_config("digits")["max_batch_size"] == 64
        for binary in (True, False):
            x = images[:1]
            tensor = httpclient.InferInput("INPUT", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x, binary_data=binary)
            result = client.infer("digits", [tensor], parameters=SLO,
                                  outputs=[httpclient.InferRequestedOutput("LOGITS", binary_data=binary)])
            assert_served(fast_build, triton, x, result.as_numpy("LOGITS"), result.get_response()["parameters"])


def test_a_request_of_several_rows_is_answered_row_by_row(fast_build, triton, sidecar, images):
    """A batch of 5 rows, over gRPC and HTTP: each row's answer is Triton's for the variant that served it."""
    x = images[:5]
    with grpcclient.InferenceServerClient(sidecar.grpc_url) as client:
        result = client.infer("digits", [grpc_input(x)], parameters=SLO)
        grpc_logits, params = result.as_numpy("LOGITS"), grpc_params(result)
    with httpclient.InferenceServerClient(sidecar.http_url) as client:
        tensor = httpclient.InferInput("INPUT", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        http_result = client.infer("digits", [tensor], parameters=SLO)
    for logits, p in ((grpc_logits, params), (http_result.as_numpy("LOGITS"), http_result.get_response()["parameters"])):
        assert logits.shape == (5, 10)
        if "," not in p["variant"]:  # every row on one variant: the whole answer is Triton's for it
            assert_served(fast_build, triton, x, logits, p)
        else:  # rows served by several variants: each row is one of theirs
            for i in range(5):
                assert any(np.allclose(logits[i], direct(fast_build, triton, v, x[i:i + 1])[0], atol=1e-4)
                           for v in p["variant"].split(","))


def test_streaming_answers_each_request_by_id_and_keeps_the_stream_open_after_an_error(fast_build, triton, sidecar,
                                                                                        images):
    """tritonclient's stream: 6 good requests and one bad one in the middle; every request gets its answer or its
    error on the stream, the good ones after the bad one too."""
    answers: dict[str, tuple] = {}
    errors = []

    def callback(result, error):
        if error is not None:
            errors.append(str(error))
        else:
            answers[result.get_response().id] = (result.as_numpy("LOGITS"), grpc_params(result))

    with grpcclient.InferenceServerClient(sidecar.grpc_url) as client:
        client.start_stream(callback=callback)
        for i, x in enumerate(images[:6]):
            if i == 3:
                client.async_stream_infer("digits", [grpc_input(x[None].astype(np.float64), dtype="FP64")],
                                          request_id="bad", parameters=SLO)
            client.async_stream_infer("digits", [grpc_input(x[None])], request_id=f"r{i}", parameters=SLO)
        client.stop_stream()  # waits for every answer
    assert sorted(answers) == [f"r{i}" for i in range(6)]
    assert len(errors) == 1 and "datatype 'FP64', expected FP32" in errors[0]
    for i, x in enumerate(images[:6]):
        assert_served(fast_build, triton, x[None], *answers[f"r{i}"])


def _binary_request(x: np.ndarray, request_id: str) -> tuple[bytes, int]:
    """An inference request in the binary-tensor extension, as tritonclient sends it: (body, its header's length)."""
    header = json.dumps({"id": request_id, "parameters": SLO,
                         "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": list(x.shape),
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "outputs": [{"name": "LOGITS", "parameters": {"binary_data": True}}]}).encode()
    return header + x.astype(np.float32).tobytes(), len(header)


def _read_responses(sock: socket.socket, count: int) -> list[tuple[bytes, dict[str, str], bytes]]:
    """``count`` HTTP responses read off a socket: (status line, headers, body); a 100 Continue counts as one."""
    data, out = b"", []
    while len(out) < count:
        end = data.find(b"\r\n\r\n")
        if end < 0:
            chunk = sock.recv(65536)
            assert chunk, f"closed after {len(out)} responses: {data[:200]!r}"
            data += chunk
            continue
        status, *fields = data[:end].decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, v in (f.split(":", 1) for f in fields)}
        size = int(headers.get("content-length", 0))
        while len(data) < end + 4 + size:
            chunk = sock.recv(65536)
            assert chunk
            data += chunk
        out.append((status.encode(), headers, data[end + 4:end + 4 + size]))
        data = data[end + 4 + size:]
    return out


def _logits(response: tuple[bytes, dict[str, str], bytes]) -> tuple[str, np.ndarray, dict]:
    """A binary answer's id, logits and parameters."""
    status, headers, body = response
    assert status.split()[1] == b"200", (status, body[:300])
    n = int(headers["inference-header-content-length"])
    header = json.loads(body[:n])
    return header["id"], np.frombuffer(body[n:], np.float32).reshape(1, 10), header["parameters"]


def test_http_keeps_connections_and_reads_pipelined_chunked_and_expect_continue_requests(fast_build, triton, sidecar,
                                                                                        images):
    """What HTTP/1.1 clients do besides one request per connection: two requests sent back to back on one connection
    (answered in order), a chunked body, a client that waits for 100 Continue, and HTTP/1.0 (closed after)."""
    head = "POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nInference-Header-Content-Length: {}\r\n"
    with socket.create_connection((sidecar.host, sidecar.http_port), timeout=30) as sock:
        wire = b""
        for i in range(2):  # pipelined
            body, n = _binary_request(images[i][None], f"p{i}")
            wire += (head.format(n) + f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        sock.sendall(wire)
        answers = [_logits(r) for r in _read_responses(sock, 2)]
        assert [rid for rid, _, _ in answers] == ["p0", "p1"]
        for i, (_, logits, params) in enumerate(answers):
            assert_served(fast_build, triton, images[i][None], logits, params)
        body, n = _binary_request(images[2][None], "chunked")  # chunked, on the same connection
        chunks = b"".join(f"{len(part):x}\r\n".encode() + part + b"\r\n" for part in (body[:100], body[100:]))
        sock.sendall((head.format(n) + "Transfer-Encoding: chunked\r\n\r\n").encode() + chunks + b"0\r\n\r\n")
        rid, logits, params = _logits(_read_responses(sock, 1)[0])
        assert rid == "chunked"
        assert_served(fast_build, triton, images[2][None], logits, params)
        body, n = _binary_request(images[3][None], "continue")  # the body only after 100 Continue
        sock.sendall((head.format(n) + f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n").encode())
        (status, _, _), = _read_responses(sock, 1)
        assert status.startswith(b"HTTP/1.1 100")
        sock.sendall(body)
        assert _logits(_read_responses(sock, 1)[0])[0] == "continue"
    with socket.create_connection((sidecar.host, sidecar.http_port), timeout=30) as sock:
        body, n = _binary_request(images[4][None], "old")
        sock.sendall(f"POST /v2/models/digits/infer HTTP/1.0\r\nInference-Header-Content-Length: {n}\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        assert _logits(_read_responses(sock, 1)[0])[0] == "old"
        assert sock.recv(1) == b""  # HTTP/1.0 without keep-alive: closed after its answer


def test_health_endpoints_answer_with_a_json_body(sidecar):
    for path, body in (("/v2/health/live", {"live": True}), ("/v2/health/ready", {"ready": True}),
                       ("/v2/models/digits/ready", {"ready": True})):
        with urllib.request.urlopen(f"http://{sidecar.http_url}{path}") as response:
            assert response.status == 200 and json.loads(response.read()) == body
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(f"http://{sidecar.http_url}/v2/models/nope/ready")
    assert caught.value.code == 400 and json.loads(caught.value.read()) == {"ready": False}


def test_asyncio_clients_concurrently(fast_build, triton, sidecar, images):
    """24 concurrent requests from each asyncio client: the sidecar batches them, each answer is right."""

    async def grpc_all():
        async with grpcaio.InferenceServerClient(sidecar.grpc_url) as client:
            return await asyncio.gather(*(client.infer("digits", [grpc_input(x[None])], parameters=SLO) for x in images))

    async def http_all():
        async with httpaio.InferenceServerClient(sidecar.http_url) as client:
            def tensor(x):
                t = httpclient.InferInput("INPUT", [1, *x.shape], "FP32")
                t.set_data_from_numpy(x[None])
                return t
            return await asyncio.gather(*(client.infer("digits", [tensor(x)], parameters=SLO) for x in images))

    for results, params in ((asyncio.run(grpc_all()), grpc_params), (asyncio.run(http_all()), None)):
        for x, result in zip(images, results):
            p = params(result) if params else result.get_response()["parameters"]
            assert_served(fast_build, triton, x[None], result.as_numpy("LOGITS"), p)


BAD_GRPC = [
    ("unknown model", lambda x: ("nope", [grpc_input(x)], SLO), "StatusCode.NOT_FOUND", "unknown model"),
    ("wrong dtype", lambda x: ("digits", [grpc_input(x.astype(np.float64), dtype="FP64")], SLO),
     "StatusCode.INVALID_ARGUMENT", "datatype 'FP64', expected FP32"),
    ("wrong shape", lambda x: ("digits", [grpc_input(x[0])], SLO),
     "StatusCode.INVALID_ARGUMENT", "shape [1, 16, 16], expected [rows, 1, 16, 16]"),
    ("too many rows", lambda x: ("digits", [grpc_input(np.repeat(x, 65, axis=0))], SLO),
     "StatusCode.INVALID_ARGUMENT", "with 1 to 64 rows"),
    ("unknown input", lambda x: ("digits", [grpc_input(x), grpc_input(x, "EXTRA")], SLO),
     "StatusCode.INVALID_ARGUMENT", "unexpected input 'EXTRA'"),
    ("missing input", lambda x: ("digits", [], SLO), "StatusCode.INVALID_ARGUMENT", "expects inputs ['INPUT']"),
    ("negative slo", lambda x: ("digits", [grpc_input(x)], {"slo_us": -5}), "StatusCode.INVALID_ARGUMENT",
     "'slo_us' must be a whole number"),
    ("string slo", lambda x: ("digits", [grpc_input(x)], {"slo_us": "fast"}), "StatusCode.INVALID_ARGUMENT",
     "'slo_us' must be a whole number"),
    ("huge slo", lambda x: ("digits", [grpc_input(x)], {"slo_us": 2**63 - 1}), "StatusCode.INVALID_ARGUMENT",
     "'slo_us' must be a whole number"),
    ("infinite slo", lambda x: ("digits", [grpc_input(x)], {"slo_us": float("inf")}), "StatusCode.INVALID_ARGUMENT",
     "'slo_us' must be a whole number"),
    ("100 KB model name", lambda x: ("m" * 100_000, [grpc_input(x)], SLO), "StatusCode.NOT_FOUND", "unknown model"),
    ("infeasible slo", lambda x: ("digits", [grpc_input(x)], {"slo_us": 1}), "StatusCode.INVALID_ARGUMENT",
     "below the fastest variant"),
]


@pytest.mark.parametrize("case", BAD_GRPC, ids=[c[0] for c in BAD_GRPC])
def test_grpc_errors_name_the_problem_and_the_sidecar_keeps_serving(sidecar, images, case):
    _, make, status, message = case
    with grpcclient.InferenceServerClient(sidecar.grpc_url) as client:
        model, inputs, params = make(images[:1])
        with pytest.raises(InferenceServerException) as err:
            client.infer(model, inputs, parameters=params)
        assert err.value.status() == status and message in err.value.message()
        assert client.infer("digits", [grpc_input(images[:1])], parameters=SLO).as_numpy("LOGITS").shape == (1, 10)


def test_the_chosen_edge_serves_grpc_and_bytes_that_are_no_request_get_a_clear_error(sidecar, images, request):
    """The log names the edge that serves gRPC; a ModelInfer body that is not a ModelInferRequest (random bytes, a
    cut-off message) is refused with INVALID_ARGUMENT, and the next request is served."""
    import grpc

    edge = request.node.callspec.params["sidecar"]
    assert f"gRPC and HTTP served by the {edge} edge" in sidecar.log_tail(400)
    good = pb_request(images[:1])
    with grpc.insecure_channel(sidecar.grpc_url) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")  # bytes in, bytes out
        for body in (b"\xff" * 64, good[:len(good) // 2]):
            with pytest.raises(grpc.RpcError) as caught:
                infer(body, timeout=30)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
        assert pb.ModelInferResponse.FromString(infer(good, timeout=30)).raw_output_contents[0]


def pb_request(x: np.ndarray) -> bytes:
    """A well-formed ModelInferRequest for ``x``, serialized."""
    request = pb.ModelInferRequest(model_name="digits", raw_input_contents=[x.astype(np.float32).tobytes()])
    request.inputs.add(name="INPUT", datatype="FP32", shape=list(x.shape))
    request.parameters["slo_us"].int64_param = SLO["slo_us"]
    return request.SerializeToString()


BAD_HTTP = [
    ("not json", b"{oops", {}, 400, "not JSON"),
    ("header length past the body", b'{"inputs": []}', {"Inference-Header-Content-Length": "999"}, 400, "outside"),
    ("binary size mismatch", json.dumps({"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 1, 16, 16],
                                                     "parameters": {"binary_data_size": 2048}}]}).encode() + b"\0" * 16,
     "header", 400, "does not fit"),
    ("NaN slo", b'{"parameters": {"slo_us": NaN}, "inputs": []}', {}, 400, "'slo_us' must be a whole number"),
    ("1e400 slo", b'{"parameters": {"slo_us": 1e400}, "inputs": []}', {}, 400, "'slo_us' must be a whole number"),
    ("100,000-deep nesting", b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", {}, 400, "nested too deeply"),
    ("400-digit value", json.dumps({"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 1, 16, 16],
                                                "data": [10**400] * 256}]}).encode(), {}, 400, "not FP32 values"),
    ("output parameters not an object", json.dumps({
        "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 1, 16, 16], "data": [0.0] * 256}],
        "outputs": [{"name": "LOGITS", "parameters": "binary"}]}).encode(), {}, 400, "'parameters' must be an object"),
    ("bool in shape", json.dumps({"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [True, 1, 16, 16],
                                              "data": [0.0] * 256}]}).encode(), {}, 400, "list of integers"),
    ("too few values", json.dumps({"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 1, 16, 16],
                                               "data": [1.0, 2.0]}]}).encode(), {}, 400, "2 values, expected 256"),
]


@pytest.mark.parametrize("case", BAD_HTTP, ids=[c[0] for c in BAD_HTTP])
def test_http_errors(sidecar, images, case):
    _, body, headers, status, message = case
    if headers == "header":
        headers = {"Inference-Header-Content-Length": str(body.index(b"}]}") + 3)}
    request = urllib.request.Request(f"http://{sidecar.http_url}/v2/models/digits/infer", data=body, headers=headers)
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request)
    assert err.value.code == status and message in json.loads(err.value.read())["error"]
    with httpclient.InferenceServerClient(sidecar.http_url) as client:
        tensor = httpclient.InferInput("INPUT", [1, 1, 16, 16], "FP32")
        tensor.set_data_from_numpy(images[:1])
        assert client.infer("digits", [tensor]).as_numpy("LOGITS").shape == (1, 10)


def test_metrics_count_every_request(sidecar, images):
    before = metrics(sidecar)
    with grpcclient.InferenceServerClient(sidecar.grpc_url) as client:
        accuracies = [grpc_params(client.infer("digits", [grpc_input(x[None])], parameters=SLO))["accuracy"]
                      for x in images[:5]]
    after = metrics(sidecar)

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    answered = sum(delta("accscale_requests_total", model="digits", outcome=o) for o in ("met", "late"))
    assert answered == 5
    assert metric(after, "accscale_queue_depth", model="digits") == 0
    assert metric(after, "accscale_worker_healthy") == 1
    assert metric(after, "accscale_policy", model="digits", policy="slackfit") == 1
    # the served-accuracy summary observes each request answered within its SLO once, at its variant's accuracy
    met = delta("accscale_requests_total", model="digits", outcome="met")
    assert delta("accscale_served_accuracy_count", model="digits") == met >= 1
    accuracy_sum = delta("accscale_served_accuracy_sum", model="digits")
    assert min(accuracies) * met - 1e-9 <= accuracy_sum <= max(accuracies) * met + 1e-9


def test_policy_switch_is_guarded_and_takes_effect(sidecar, images):
    assert admin(sidecar, "/v2/admin/policy", {"model": "digits", "policy": "maxacc"}, token=None)[0] == 403
    assert admin(sidecar, "/v2/admin/policy", {"model": "digits", "policy": "maxacc"}, token="wrong")[0] == 403
    status, body = admin(sidecar, "/v2/admin/policy", {"model": "digits", "policy": "nosuch"})
    assert status == 400 and "unknown policy" in body["error"]
    status, body = admin(sidecar, "/v2/admin/policy", {"model": "digits", "policy": "proteus"})
    assert status == 400 and "'proteus' routes for a planner, and none plans 'digits'" in body["error"], body
    for options, message in (({"overhead_us": -100_000_000}, "overhead_us must be"), ({"num_buckets": "x"}, "slackfit"),
                             ("fast", "'options' must be an object"), ({"policy_dir": "/etc"}, "config file")):
        policy = "ramsis" if "policy_dir" in options else "slackfit"
        status, body = admin(sidecar, "/v2/admin/policy", {"model": "digits", "policy": policy, "options": options})
        assert status == 400 and message in body["error"], body
    try:
        status, body = admin(sidecar, "/v2/admin/policy", {"model": "digits", "policy": "maxacc"})
        assert status == 200 and body == {"model": "digits", "old": "slackfit", "policy": "maxacc"}
        with grpcclient.InferenceServerClient(sidecar.grpc_url) as client:
            config = client.get_model_config("digits", as_json=True)["config"]
            assert config["parameters"]["policy"]["string_value"] == "maxacc"
            assert client.infer("digits", [grpc_input(images[:1])], parameters=SLO).as_numpy("LOGITS").shape == (1, 10)
        assert metric(metrics(sidecar), "accscale_decisions_total", policy="maxacc") > 0
    finally:
        admin(sidecar, "/v2/admin/policy", {"model": "digits", "policy": "slackfit"})


@pytest.fixture(scope="module")
def perf_analyzer():
    from scheduler_sidecar.experiments.perf_analyzer import ensure

    return ensure()


@pytest.fixture(scope="module", params=EDGES)
def patient_sidecar(fast_build, triton, request):
    """A sidecar whose default SLO (2 s) no busy machine misses: perf_analyzer stops at the first refusal, and over
    HTTP it cannot send an SLO of its own."""
    if request.param == "native":
        request.getfixturevalue("native_edge")
    with SidecarServer(workers=[triton.grpc_url], profile=fast_build.profile_path,
                       extra_args=["--default-slo-ms", "2000", "--edge", request.param]) as server:
        yield server


@pytest.mark.parametrize("protocol", ["grpc", "http", "streaming"])
def test_perf_analyzer_runs_against_the_sidecar(perf_analyzer, patient_sidecar, protocol):
    url = patient_sidecar.http_url if protocol == "http" else patient_sidecar.grpc_url
    # --request-parameter is gRPC-only in perf_analyzer; over HTTP the model's default SLO applies
    slo = [] if protocol == "http" else ["--request-parameter", "slo_us:2000000:int"]
    flags = ["-i", "http"] if protocol == "http" else ["-i", "grpc", *(["--streaming"] if protocol == "streaming" else [])]
    # it must run and report, not find the machine steady: a fixed count of requests, with no stability to reach (a
    # busy 2-core machine, the rest of the suite beside it, once took more than 10 windows to settle within 100%)
    result = subprocess.run([str(perf_analyzer), "-m", "digits", "-u", url, *flags, *slo,
                             "--concurrency-range", "2", "--request-count", "150"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert re.search(r"Concurrency: 2, throughput: [0-9.]+ infer/sec", result.stdout)


@pytest.mark.parametrize("edge", EDGES)
def test_a_killed_worker_loses_no_request(fast_build, images, edge, request):
    """Kill one of two Tritons under load: every request is answered or gets an explicit error (on the native edge
    the batches go out from C++, and a lost worker's status is told from its answer there)."""
    if edge == "native":
        request.getfixturevalue("native_edge")
    with TritonServer(repository=fast_build.repository) as a, TritonServer(repository=fast_build.repository) as b, \
            SidecarServer(workers=[a.grpc_url, b.grpc_url], profile=fast_build.profile_path,
                          extra_args=["--admin-token", TOKEN, "--edge", edge]) as server:
        n, killed_after = 300, 100

        async def load():
            done = 0
            async with grpcaio.InferenceServerClient(server.grpc_url) as client:
                async def one(i):
                    nonlocal done
                    try:
                        result = await client.infer("digits", [grpc_input(images[i % len(images)][None])],
                                                    parameters={"slo_us": 2_000_000})
                        return grpc_params(result)["worker"]
                    except InferenceServerException as exc:
                        return exc.status()
                    finally:
                        done += 1
                        if done == killed_after:
                            b.stop(timeout_s=0)  # SIGTERM then SIGKILL right away: the worker is gone
                limit = asyncio.Semaphore(16)

                async def paced(i):
                    async with limit:
                        return await one(i)
                return await asyncio.gather(*(paced(i) for i in range(n)))

        outcomes = asyncio.run(load())
        assert len(outcomes) == n
        explicit = {"StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED"}
        assert set(outcomes) <= {a.grpc_url, b.grpc_url} | explicit, set(outcomes)
        # after the kill, the survivor serves what is left
        assert outcomes[killed_after + 32:].count(a.grpc_url) > 0
        assert b.grpc_url not in outcomes[killed_after + 32:]
        status, body = admin(server, "/v2/admin/workers", None)
        assert status == 200 and {w["url"]: w["healthy"] for w in body["workers"]} == {a.grpc_url: True, b.grpc_url: False}
        assert metric(metrics(server), "accscale_worker_healthy", endpoint=b.grpc_url) == 0
        # a new worker can be added while the sidecar runs
        with TritonServer(repository=fast_build.repository) as c:
            status, body = admin(server, "/v2/admin/workers", {"url": c.grpc_url})
            assert status == 200 and body["slots"] == 1  # worker slots are shared by every logical model
            assert metric(metrics(server), "accscale_worker_healthy", endpoint=c.grpc_url) == 1


def test_serve_refuses_a_bad_config_with_a_clear_error(tmp_path, triton):
    config = tmp_path / "sidecar.toml"
    config.write_text('workers = ["127.0.0.1:1"]\ncolour = "blue"\n')
    result = subprocess.run([sys.executable, "-m", "scheduler_sidecar.cli", "serve", "--config", str(config)],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "unknown keys ['colour']" in result.stderr


@pytest.mark.parametrize("edge", [*EDGES, "auto"])
def test_sigterm_stops_the_sidecar_cleanly(fast_build, triton, images, edge, request):
    """``auto``, the default: the native edge, which is built here, and the log says so."""
    if edge != "python":
        request.getfixturevalue("native_edge")
    server = SidecarServer(workers=[triton.grpc_url], profile=fast_build.profile_path, extra_args=["--edge", edge])
    server.start()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.infer("digits", [grpc_input(images[:1])], parameters=SLO)
    assert metric(metrics(server), "accscale_requests_total") == 1  # the warm-up is not a client's request
    proc = server._proc
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0
    server.stop()
    log = server.log_path.read_text()
    server.log_path.unlink()
    assert "warmed up ['digits'] with 1 request(s) each" in log  # before it said it was ready
    assert "stopping" in log and "Error in sys.excepthook" not in log and "Traceback" not in log, log
    if edge == "auto":
        assert "the native edge serves gRPC and HTTP by default: the native edge is built" in log, log
    assert f"gRPC and HTTP served by the {'native' if edge == 'auto' else edge} edge" in log


def test_the_default_edge_is_python_where_the_native_one_is_not_built(tmp_path):
    from scheduler_sidecar.native import built_edge

    module, why = built_edge(tmp_path)  # an empty build folder: nothing is built there, and nothing is started
    assert module is None and "not built" in why and not any(tmp_path.iterdir())


def test_ramsis_serves_separate_triton_models_live(fast_build, triton, images, tmp_path):
    """RAMSIS (MDP policies generated at start) picks among statically exported subnets, each its own Triton model."""
    from export.profiler import SUPERNET_MODEL
    from export.repository import static_model_name
    from scheduler_sidecar.core.profile import Actuation, LatencyCurve, Profile, Variant

    candidates = sorted(fast_build.calibration.select(list(fast_build.static_ids)), key=lambda c: (c.accuracy, c.macs))
    device = fast_build.profile.device_kinds[0]
    base = fast_build.profile.variants[0].latency[device]
    variants = tuple(  # latency grows with accuracy, as on a Pareto front
        Variant(c.subnet_id, c.accuracy, Actuation("model", static_model_name(SUPERNET_MODEL, c.subnet_id)),
                {device: LatencyCurve(base.batch_sizes, tuple(x * (1 + i) for x in base.p50_ms),
                                     tuple(x * (1 + i) for x in base.p99_ms))})
        for i, c in enumerate(candidates))
    profile_path = tmp_path / "static.json"
    Profile("static-subnets", "tests/test_sidecar.py", variants).save(profile_path)
    config = tmp_path / "sidecar.toml"
    config.write_text(f'[[models]]\nname = "digits"\nprofile = "{profile_path}"\npolicy = "ramsis"\n'
                      'latency_calibration = false\n[models.policy_options]\nslo_ms = 200.0\nworkers = 1\n'
                      'loads = [20.0, 200.0]\n')
    with SidecarServer(workers=[triton.grpc_url], config=config) as server, \
            grpcclient.InferenceServerClient(server.grpc_url) as client:
        for x in images[:6]:
            result = client.infer("digits", [grpc_input(x[None])], parameters=SLO)
            params = grpc_params(result)
            assert params["variant"] in fast_build.static_ids
            model = static_model_name(SUPERNET_MODEL, params["variant"])
            with grpcclient.InferenceServerClient(triton.grpc_url) as direct_client:
                expected = direct_client.infer(model, [grpc_input(x[None])]).as_numpy("LOGITS")
            np.testing.assert_allclose(result.as_numpy("LOGITS"), expected, rtol=1e-4, atol=1e-4)


def test_a_native_edge_that_cannot_load_says_what_it_needs(tmp_path, monkeypatch):
    """A built edge whose libraries are missing (here: a file that is no shared object) is NativeUnavailable, naming
    the packages, not a bare ImportError; and the default edge falls back to Python on it."""
    import sysconfig

    from scheduler_sidecar.native import NativeUnavailable, built_edge, edge

    (tmp_path / f"_edge{sysconfig.get_config_var('EXT_SUFFIX')}").write_bytes(b"not a shared object")
    (tmp_path / "CMakeCache.txt").write_text("")  # configured: the build is a no-op only where the tools are absent
    monkeypatch.setenv("PATH", "/nonexistent")  # no cmake: the file above is what there is
    with pytest.raises(NativeUnavailable, match="cannot be loaded.*libgrpc"):
        edge(tmp_path)
    module, why = built_edge(tmp_path)
    assert module is None and "cannot be loaded" in why


def test_a_sidecar_whose_port_was_taken_first_starts_again_on_new_ports(fast_build, triton, monkeypatch):
    """Another process binds a port picked for the sidecar before the sidecar does (free ports race on a busy
    host): it starts again on new ports, and its log keeps the collision."""
    import socket

    from scheduler_sidecar.processes import sidecar as launcher

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        picks, pick = iter([taken]), launcher.free_port
        monkeypatch.setattr(launcher, "free_port", lambda: next(picks, None) or pick())
        with SidecarServer(workers=[triton.grpc_url], profile=fast_build.profile_path,
                           extra_args=["--edge", "python"]) as server:
            assert taken not in (server.http_port, server.grpc_port)
            assert launcher.port_taken(server.log_path.read_text())
            with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready") as response:
                assert response.status == 200


def test_the_fake_worker_answers_each_batch_with_its_rows_and_counts_them(fast_build, triton, images, native_edge):
    """`bench sidecar --fake-worker`'s worker (native/floor.cc, fake mode): the first batch goes to Triton, every later
    one is answered at once with as many rows as it has (the first answer's first row, repeated), and the statistics
    count rows, as the bench's CPU per request divides by them."""
    from scheduler_sidecar.experiments.sidecar_bench import floor_server

    control = fast_build.profile.variants[0].actuation.control

    def infer(client, x: np.ndarray) -> np.ndarray:
        rows = np.asarray([control] * len(x), dtype=np.int32)
        return client.infer("digits_supernet", [grpc_input(x), grpc_input(rows, "CONTROL", "INT32")]).as_numpy("LOGITS")

    with floor_server(triton.grpc_url, "fake", native=True) as (url, _), \
            grpcclient.InferenceServerClient(url) as client:
        first = infer(client, images[:1])
        assert first.shape == (1, 10)
        batch = infer(client, images[1:4])  # other images: the answer is the first's, not the model's
        assert batch.shape == (3, 10) and (batch == first[0]).all()
        assert client.get_inference_statistics("digits_supernet").model_stats[0].inference_count == 4


@pytest.mark.parametrize("mode", ["cq-echo", "edge"])
def test_the_floors_beside_the_edge_answer_as_triton_does(fast_build, triton, images, native_edge, mode):
    """`bench sidecar --floor`'s echo on gRPC's completion queue (native/floor.cc) answers every request with
    Triton's first answer and counts what it answered; its edge floor (the native edge, Python passing each request
    to Triton and back) answers each with Triton's answer to it."""
    from scheduler_sidecar.experiments.sidecar_bench import floor_server

    control = np.asarray([fast_build.profile.variants[0].actuation.control], dtype=np.int32)

    def infer(client, x: np.ndarray) -> np.ndarray:
        return client.infer("digits_supernet", [grpc_input(x), grpc_input(control, "CONTROL", "INT32")]).as_numpy(
            "LOGITS")

    with floor_server(triton.grpc_url, mode, native=mode == "cq-echo") as (url, _), \
            grpcclient.InferenceServerClient(url) as client, grpcclient.InferenceServerClient(triton.grpc_url) as direct:
        answers = [infer(client, images[i:i + 1]) for i in range(3)]
        if mode == "cq-echo":
            assert all((a == answers[0]).all() for a in answers)
            assert client.get_inference_statistics("digits_supernet").model_stats[0].inference_count == 3
        else:
            for i, answer in enumerate(answers):
                assert answer.shape == (1, 10)
                np.testing.assert_allclose(answer, infer(direct, images[i:i + 1]), rtol=1e-5)
            assert not np.allclose(answers[0], answers[1])  # each its own: not the first answer repeated

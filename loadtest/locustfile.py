"""Locust file: replay a trace open loop against a KServe v2 server (the sidecar, or Triton itself).

One driver user walks the trace: it sleeps to each arrival time and fires the request in
its own greenlet, so a slow server never delays later arrivals. Each request is a
single held-out digit sent with ``tritonclient.grpc`` and ``parameters={"slo_us": ...}``;
every one is logged (``--request-log``, see ``loadtest.requestlog``) and reported to
Locust's statistics (``--csv``, ``--html``). Run it through ``accscale loadtest``, or::

    locust -f loadtest/locustfile.py --headless --only-summary -u 1 -r 1 \\
        --target 127.0.0.1:8101 --trace t.txt --payloads payloads.npz --request-log requests.csv
"""

from __future__ import annotations

# gRPC must be told about gevent before any channel exists
import grpc.experimental.gevent as grpc_gevent

grpc_gevent.init_gevent()

import time  # noqa: E402

import gevent  # noqa: E402
import numpy as np  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402
from locust import User, constant, events, task  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from loadtest.requestlog import Entry, RequestLog  # noqa: E402
from loadtest.traces import Trace  # noqa: E402

CLIENT_GRACE_S = 5.0  # a request still unanswered this long after its SLO is abandoned (logged as an error)


@events.init_command_line_parser.add_listener
def _options(parser) -> None:
    parser.add_argument("--target", default="127.0.0.1:8101", help="gRPC host:port (default: the sidecar's)")
    parser.add_argument("--trace", required=True, help="trace file to replay")
    parser.add_argument("--payloads", required=True, help=".npz with 'images' and 'labels' (accscale loadtest writes it)")
    parser.add_argument("--model", default="digits", help="model name (default: digits)")
    parser.add_argument("--slo-ms", type=float, default=36.0, help="SLO of trace lines without one (default: 36)")
    parser.add_argument("--request-log", default="requests.csv", help="per-request log to write")
    parser.add_argument("--progress-s", type=float, default=5.0, help="seconds between progress lines (0: none)")


class TraceReplay(User):
    fixed_count = 1  # one driver; the requests are its greenlets
    wait_time = constant(0)

    def on_start(self) -> None:
        options = self.environment.parsed_options
        self.client = grpcclient.InferenceServerClient(options.target)
        self.trace = Trace.load(options.trace)
        payloads = np.load(options.payloads)
        self.images, self.labels = payloads["images"], payloads["labels"]
        (self.input,) = self.client.get_model_metadata(options.model, as_json=True)["inputs"]

    def on_stop(self) -> None:
        self.client.close()  # an open channel keeps the Locust process from exiting

    @task
    def replay(self) -> None:
        options = self.environment.parsed_options
        trace = self.trace
        slo_ms = np.where(np.isnan(trace.slo_ms), options.slo_ms, trace.slo_ms)
        log = RequestLog([Entry(i, float(t), float(s)) for i, (t, s) in enumerate(zip(trace.arrival_s, slo_ms))])
        start = time.perf_counter()
        reporter = gevent.spawn(self._progress, log, start, options.progress_s) if options.progress_s > 0 else None
        requests = []
        for entry in log.entries:
            delay = start + entry.scheduled_s - time.perf_counter()
            if delay > 0:
                gevent.sleep(delay)
            entry.lag_ms = max(0.0, (time.perf_counter() - start - entry.scheduled_s) * 1e3)
            requests.append(gevent.spawn(self._send, entry, start, trace.payload_index[entry.index]))
        gevent.joinall(requests)
        if reporter is not None:
            reporter.kill()
        log.save(options.request_log)
        self._print(log, start, final=True)
        self.environment.runner.quit()

    def _send(self, entry: Entry, start: float, payload: int) -> None:
        k = (payload if payload >= 0 else entry.index) % len(self.images)
        x = self.images[k][None]
        tensor = grpcclient.InferInput(self.input["name"], list(x.shape), self.input["datatype"])
        tensor.set_data_from_numpy(x)
        sent = time.perf_counter()
        try:
            result = self.client.infer(self.environment.parsed_options.model, [tensor],
                                       parameters={"slo_us": round(entry.slo_ms * 1e3)},
                                       client_timeout=entry.slo_ms / 1e3 + CLIENT_GRACE_S)
        except InferenceServerException as exc:
            entry.status = exc.status() or "error"
            self._fire(entry, sent, exc)
            return
        entry.latency_ms = (time.perf_counter() - start - entry.scheduled_s) * 1e3
        entry.status = "ok"
        params = result.get_response().parameters
        entry.variant = params["variant"].string_param if "variant" in params else ""
        entry.accuracy = params["accuracy"].double_param if "accuracy" in params else float("nan")
        entry.batch_size = params["batch_size"].int64_param if "batch_size" in params else 0
        entry.queue_ms = params["queue_us"].int64_param / 1e3 if "queue_us" in params else float("nan")
        entry.service_ms = params["service_us"].int64_param / 1e3 if "service_us" in params else float("nan")
        entry.correct = float(int(result.as_numpy("LOGITS").argmax()) == int(self.labels[k]))
        self._fire(entry, sent, None)

    def _fire(self, entry: Entry, sent: float, exception: Exception | None) -> None:
        self.environment.events.request.fire(
            request_type="grpc", name=self.environment.parsed_options.model,
            response_time=(time.perf_counter() - sent) * 1e3, response_length=0, response=None,
            context={"variant": entry.variant, "lag_ms": entry.lag_ms}, exception=exception)

    def _progress(self, log: RequestLog, start: float, every_s: float) -> None:
        while True:
            gevent.sleep(every_s)
            self._print(log, start)

    @staticmethod
    def _print(log: RequestLog, start: float, final: bool = False) -> None:
        elapsed = time.perf_counter() - start
        sent = [e for e in log.entries if e.scheduled_s <= elapsed]
        done = [e for e in sent if e.status != "pending"]
        met = sum(1 for e in done if e.latency_ms <= e.slo_ms)
        recent = sum(1 for e in sent if e.scheduled_s > elapsed - 5.0) / min(5.0, max(elapsed, 1e-9))
        word = "done" if final else "replay"
        print(f"{word}: {elapsed:6.1f} s, sent {len(sent)}/{len(log.entries)}, rate {recent:6.0f} q/s, "
              f"answered {len(done)}, SLO attainment so far {met / max(len(done), 1):.3f}", flush=True)

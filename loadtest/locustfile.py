"""Locust file: replay a trace open loop against a KServe v2 server (the sidecar, or Triton itself).

One driver user walks the trace: it sleeps to each arrival time and fires the request in
its own greenlet, so a slow server never delays later arrivals. Each request is one sample
of ``--payloads`` (the trace's payload index, else its line number, modulo their count) sent
with ``tritonclient.grpc`` and ``parameters={"slo_us": ...}``; every one is logged
(``--request-log``, see ``loadtest.requestlog``) and reported to Locust's statistics
(``--csv``, ``--html``). Several models are replayed at once by naming one ``--model``,
``--trace``, ``--payloads`` and ``--request-log`` each, in the same order: their traces
become one schedule from one start. Run it through ``accscale loadtest``, or::

    locust -f loadtest/locustfile.py --headless --only-summary -u 1 -r 1 \\
        --target 127.0.0.1:8101 --trace t.txt --payloads payloads.npz --request-log requests.csv
"""

from __future__ import annotations

# gRPC must be told about gevent before any channel exists
import grpc.experimental.gevent as grpc_gevent

grpc_gevent.init_gevent()

import json  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402

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
    parser.add_argument("--trace", nargs="+", required=True, help="trace file to replay, one per model")
    parser.add_argument("--payloads", nargs="+", required=True,
                        help=".npz with 'images' and 'labels', one per model (accscale loadtest writes them)")
    parser.add_argument("--model", nargs="+", default=["digits"], help="model name, one per trace (default: digits)")
    parser.add_argument("--slo-ms", type=float, default=36.0, help="SLO of trace lines without one (default: 36)")
    parser.add_argument("--request-log", nargs="+", default=["requests.csv"], help="per-request log to write, one "
                        "per model")
    parser.add_argument("--start-file", help="write the replay's start here (JSON: this machine's monotonic clock, "
                        "s), to align it with a server's on the same machine")
    parser.add_argument("--progress-s", type=float, default=5.0, help="seconds between progress lines (0: none)")


def _answer_output(outputs: list[dict]) -> str:
    """The output a request's answer is read from: ``LABEL`` (a cascade's, HybridServe's BLS) or ``LOGITS`` (the
    project's classifiers) where the model has one, else its first (an operator's model: scikit-learn's ONNX
    classifiers answer ``label`` first, then ``probabilities``)."""
    names = [o["name"] for o in outputs]
    return next((n for n in ("LABEL", "LOGITS") if n in names), names[0])


@dataclass
class Stream:
    """One model's part of the replay."""

    model: str
    trace: Trace
    images: np.ndarray
    labels: np.ndarray
    input: dict  # the model's input tensor, as its metadata names it
    output: str  # the output that holds its answer (see ``_answer_output``)
    log: RequestLog


class TraceReplay(User):
    fixed_count = 1  # one driver; the requests are its greenlets
    wait_time = constant(0)

    def on_start(self) -> None:
        options = self.environment.parsed_options
        columns = (options.model, options.trace, options.payloads, options.request_log)
        if len({len(c) for c in columns}) != 1:
            raise ValueError("--model, --trace, --payloads and --request-log name one entry per model each")
        self.client = grpcclient.InferenceServerClient(options.target)
        self.streams = []
        for model, trace_path, payloads_path in zip(options.model, options.trace, options.payloads):
            payloads = np.load(payloads_path)
            trace = Trace.load(trace_path)
            slo_ms = np.where(np.isnan(trace.slo_ms), options.slo_ms, trace.slo_ms)
            log = RequestLog([Entry(i, float(t), float(s)) for i, (t, s) in enumerate(zip(trace.arrival_s, slo_ms))])
            metadata = self.client.get_model_metadata(model, as_json=True)
            (tensor,) = metadata["inputs"]
            self.streams.append(Stream(model, trace, payloads["images"], payloads["labels"], tensor,
                                       _answer_output(metadata["outputs"]), log))

    def on_stop(self) -> None:
        self.client.close()  # an open channel keeps the Locust process from exiting

    @task
    def replay(self) -> None:
        options = self.environment.parsed_options
        # one schedule: the models' requests interleave by time, as a simulator of them all sees them
        schedule = sorted(((s, e) for s in self.streams for e in s.log.entries), key=lambda se: se[1].scheduled_s)
        entries = [e for _, e in schedule]
        start, start_monotonic_s = time.perf_counter(), time.monotonic()
        if options.start_file:
            with open(options.start_file, "w") as f:
                json.dump({"start_monotonic_s": start_monotonic_s}, f)
        reporter = gevent.spawn(self._progress, entries, start, options.progress_s) if options.progress_s > 0 else None
        requests = []
        for stream, entry in schedule:
            delay = start + entry.scheduled_s - time.perf_counter()
            if delay > 0:
                gevent.sleep(delay)
            entry.lag_ms = max(0.0, (time.perf_counter() - start - entry.scheduled_s) * 1e3)
            requests.append(gevent.spawn(self._send, stream, entry, start))
        gevent.joinall(requests)
        if reporter is not None:
            reporter.kill()
        for stream, path in zip(self.streams, options.request_log):
            stream.log.save(path)
        self._print(entries, start, final=True)
        self.environment.runner.quit()

    def _send(self, stream: Stream, entry: Entry, start: float) -> None:
        payload = stream.trace.payload_index[entry.index]
        k = (payload if payload >= 0 else entry.index) % len(stream.images)
        x = stream.images[k][None]
        tensor = grpcclient.InferInput(stream.input["name"], list(x.shape), stream.input["datatype"])
        tensor.set_data_from_numpy(x)
        sent = time.perf_counter()
        try:
            result = self.client.infer(stream.model, [tensor], parameters={"slo_us": round(entry.slo_ms * 1e3)},
                                       client_timeout=entry.slo_ms / 1e3 + CLIENT_GRACE_S)
        except InferenceServerException as exc:
            entry.status = exc.status() or "error"
            self._fire(stream, entry, sent, exc)
            return
        entry.latency_ms = (time.perf_counter() - start - entry.scheduled_s) * 1e3
        entry.status = "ok"
        params = result.get_response().parameters
        entry.variant = params["variant"].string_param if "variant" in params else ""
        entry.accuracy = params["accuracy"].double_param if "accuracy" in params else float("nan")
        entry.batch_size = params["batch_size"].int64_param if "batch_size" in params else 0
        entry.queue_ms = params["queue_us"].int64_param / 1e3 if "queue_us" in params else float("nan")
        entry.service_ms = params["service_us"].int64_param / 1e3 if "service_us" in params else float("nan")
        entry.worker = params["worker"].string_param if "worker" in params else ""
        answer = result.as_numpy(stream.output)  # a label (one value), or a score per class
        entry.correct = float(int(answer.flat[0] if answer.size == 1 else answer.argmax()) == int(stream.labels[k]))
        self._fire(stream, entry, sent, None)

    def _fire(self, stream: Stream, entry: Entry, sent: float, exception: Exception | None) -> None:
        self.environment.events.request.fire(
            request_type="grpc", name=stream.model, response_time=(time.perf_counter() - sent) * 1e3,
            response_length=0, response=None, context={"variant": entry.variant, "lag_ms": entry.lag_ms},
            exception=exception)

    def _progress(self, entries: list[Entry], start: float, every_s: float) -> None:
        while True:
            gevent.sleep(every_s)
            self._print(entries, start)

    @staticmethod
    def _print(entries: list[Entry], start: float, final: bool = False) -> None:
        elapsed = time.perf_counter() - start
        sent = [e for e in entries if e.scheduled_s <= elapsed]
        done = [e for e in sent if e.status != "pending"]
        met = sum(1 for e in done if e.latency_ms <= e.slo_ms)
        recent = sum(1 for e in sent if e.scheduled_s > elapsed - 5.0) / min(5.0, max(elapsed, 1e-9))
        word = "done" if final else "replay"
        print(f"{word}: {elapsed:6.1f} s, sent {len(sent)}/{len(entries)}, rate {recent:6.0f} q/s, "
              f"answered {len(done)}, SLO attainment so far {met / max(len(done), 1):.3f}", flush=True)

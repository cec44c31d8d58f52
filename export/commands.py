"""``accscale profile`` and ``accscale export``: build the supernet and put it in Triton's repository."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from export.presets import (
    DEFAULT_BUILD_DIR,
    DEFAULT_REPOSITORY,
    FAMILIES,
    MEASURED_BATCH_SIZES,
    NORMS,
    PRESETS,
    PROFILE_REPEATS,
    get_preset,
)
from scheduler_sidecar.core.profile import Profile

log = logging.getLogger(__name__)


# a profile worth scheduling over: enough Pareto points, a real accuracy and latency range
MIN_PARETO, MIN_ACCURACY_SPAN_POINTS, MIN_LATENCY_SPAN = 20, 5.0, 3.0


def add_build_options(parser: argparse.ArgumentParser) -> None:
    """--preset, --build-dir and --repository, shared by every command that uses the built supernet."""
    parser.add_argument("--preset", choices=sorted(PRESETS), default="full",
                        help="'full' is the demo's supernet; 'fast' trains in about a minute for tests (default: full)")
    parser.add_argument("--build-dir", type=Path, default=DEFAULT_BUILD_DIR,
                        help="cache of trained weights, calibration and profile (default: build/)")
    parser.add_argument("--repository", type=Path, default=DEFAULT_REPOSITORY,
                        help="Triton model repository to write models into (default: model_repository/)")


def add_family_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--family", choices=FAMILIES, default="cnn",
                        help="the supernet: 'cnn', the digits ResNet (default), or 'transformer', the movie-review "
                             "encoder (elastic layers, heads and feed-forward units; token ids in, vocab.txt beside "
                             "the model)")


def _common(parser: argparse.ArgumentParser) -> None:
    add_build_options(parser)
    parser.add_argument("--instances", type=int, default=1, help="Triton model instances (worker slots) per model")
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads per model instance")
    parser.add_argument("--gpu", dest="kind", action="store_const", const="KIND_GPU", default="KIND_CPU",
                        help="KIND_GPU instance groups: the models run on the GPU runtime (torch on CUDA, weights "
                             "shared as views) in a GPU Triton; default KIND_CPU (onnxruntime)")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "profile", help="train (cached), search subnets, measure them and write the Pareto profile",
        description="SuperServe's SuperNet profiler. Trains the supernet if needed, calibrates SubnetNorm "
                    "statistics for searched subnets, measures accuracy on held-out digits and latency per batch "
                    f"size 1..{MEASURED_BATCH_SIZES[-1]} (timed at {', '.join(map(str, MEASURED_BATCH_SIZES))}; "
                    "linear in between), keeps the latency-accuracy Pareto set, writes the profile and installs the "
                    "supernet model (statistics for the Pareto set) into the repository.")
    _common(p)
    p.add_argument("--mode", choices=("triton", "onnxruntime"), default="triton",
                   help="measure latency through a real Triton server (default) or onnxruntime alone (faster)")
    p.add_argument("--repeats", type=int, default=PROFILE_REPEATS,
                   help=f"timed rounds, each calling every shortlisted subnet once at every measured batch size "
                        f"(default: {PROFILE_REPEATS})")
    p.add_argument("--out", type=Path, help="profile path (default: build/<preset>/profile.json, and "
                   "build/transformer-<preset>/profile.json for the transformer)")
    add_family_option(p)
    p.set_defaults(func=run_profile)
    _register_operator_profiles(p.add_subparsers(dest="profile_what", metavar="{triton,import,validate}"))

    e = subparsers.add_parser(
        "export", help="export the supernet and static subnets from a profile into the Triton repository",
        description="Writes the SubNetAct supernet (one ONNX graph, control flow driven by the CONTROL input) "
                    "and, on request, single subnets as their own static Triton models.")
    _common(e)
    e.add_argument("--profile", type=Path, help="profile naming the subnets (default: build/<preset>/profile.json)")
    e.add_argument("--subnets", choices=("pareto", "all"), default="pareto",
                   help="calibrate the supernet model for the profile's Pareto set (default) or every searched subnet")
    e.add_argument("--norms", choices=NORMS, default="shared",
                   help="'shared' (default): one graph whose subnets share every weight, SubnetNorm's statistics "
                        "looked up per subnet (least memory); 'folded': one graph per calibrated subnet, its norms "
                        "folded into its convolutions (least latency, about the memory of separate models)")
    e.add_argument("--static", metavar="SUBNET_ID", action="append", default=[],
                   help="also export this subnet as its own static model (repeatable), e.g. d142-w3.3210.21")
    e.add_argument("--static-spread", type=int, default=0, metavar="N",
                   help="also export N Pareto subnets uniformly spaced in accuracy as static models")
    e.set_defaults(func=run_export)

    a = subparsers.add_parser(
        "add-model", help="put an ONNX model of your own into the Triton repository (any graph, any names)",
        description="Writes the model folder Triton loads: model.onnx, and a config whose inputs and outputs are "
                    "the graph's (names, types, shapes), served by the project's generic ONNX runner on the "
                    "python backend (python_backend/onnx_model.py), the stand-in for Triton's onnxruntime "
                    "backend on a CPU-only tritonserver. Then `accscale profile triton` measures it.")
    a.add_argument("model", type=Path, help="the .onnx file")
    a.add_argument("--name", help="the Triton model's name (default: the file's stem)")
    a.add_argument("--repository", type=Path, default=DEFAULT_REPOSITORY,
                   help="the Triton model repository (default: model_repository/)")
    a.add_argument("--max-batch-size", type=int, default=32,
                   help="Triton's max_batch_size; every tensor's first dimension is then the batch (0: no "
                        "batching; default: 32)")
    a.add_argument("--instances", type=int, default=1, help="model instances (default: 1)")
    a.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads per instance (default: 1)")
    a.set_defaults(func=run_add_model)


def _register_operator_profiles(what: argparse._SubParsersAction) -> None:
    """``accscale profile triton``, ``import`` and ``validate``: an operator's own models (the supernet profiler
    above is ``accscale profile`` with no subcommand)."""
    t = what.add_parser(
        "triton", help="profile the models a running Triton serves, any backend (an operator's own family)",
        description="Reads each model's metadata and config from a running Triton, measures p50 and p99 latency "
                    "per batch size at concurrency 1 (warm-up calls, then --repeats timed ones), with "
                    "--load-repeats its cold-load time (Triton's explicit model control), GPU memory where "
                    "Triton's metrics report it, and takes accuracy from --accuracy (CSV: model, version, "
                    "accuracy, metric, dataset) or measures it through Triton on --data's labelled rows. Writes "
                    "an accscale/profile/v1 file with one variant per model (actuation kind 'model') and its "
                    "provenance. A Model Analyzer config (--config) gives profile_models, batch_sizes and "
                    "triton_grpc_endpoint.")
    t.add_argument("--url", help="Triton's gRPC endpoint (default: the config's triton_grpc_endpoint, or "
                                 "127.0.0.1:8001)")
    t.add_argument("--models", help="comma-separated model names, each NAME or NAME:VERSION (default: the config's "
                                    "profile_models)")
    t.add_argument("--config", type=Path, help="a Model Analyzer config (YAML) to read those keys from")
    t.add_argument("--batch-sizes", help="comma-separated batch sizes (default: 1,2,4,8,16,32; sizes above a "
                                         "model's max batch size are left out)")
    t.add_argument("--repeats", type=int, default=50, help="timed calls per model and batch size (default: 50)")
    t.add_argument("--warmup", type=int, default=5, help="untimed calls before them (default: 5)")
    t.add_argument("--load-repeats", type=int, default=0,
                   help="measure cold-load time this many times per model (unload, load until ready; needs "
                        "--model-control-mode=explicit; default: 0, not measured: it takes a serving model away)")
    t.add_argument("--metrics-url", help="Triton's metrics URL, for the GPU memory a load adds "
                                         "(e.g. http://127.0.0.1:8002/metrics)")
    t.add_argument("--accuracy", type=Path, help="CSV with columns model, version, accuracy, metric, dataset")
    t.add_argument("--data", type=Path,
                   help="a .npz of input rows by input name; with an array 'labels', accuracy is measured "
                        "through Triton for the models --accuracy leaves out")
    t.add_argument("--output", help="the output that gives the class for --data's accuracy: a label per row, or "
                                    "scores whose argmax is it (default: each model's first output)")
    t.add_argument("--shape", action="append", default=[], metavar="NAME:d1,d2",
                   help="dims (without the batch dimension) of an input whose config leaves some variable")
    _add_profile_options(t, "these latencies are for")
    t.set_defaults(func=_run_triton_profile)
    i = what.add_parser("import", help="a profile from Model Analyzer's inference results (CSV)",
                        description="Reads Model Analyzer's metrics-model-inference.csv: the rows at concurrency 1 "
                                    "of one configuration per model (--model-config, else <model>_config_default, "
                                    "else its only one). p99 from 'p99 Latency (ms)'; p50 from 'Avg Latency (ms)' "
                                    "where present (add perf_latency_avg to inference_output_fields), else p99. "
                                    "Accuracy from --accuracy.")
    i.add_argument("file", type=Path, help="Model Analyzer's inference results CSV")
    i.add_argument("--accuracy", type=Path, required=True,
                   help="CSV with columns model, version, accuracy, metric, dataset (a row per model)")
    i.add_argument("--model-config", action="append", default=[], metavar="NAME",
                   help="the configuration to take (its 'Model Config Path', e.g. resnet50_config_3); repeat per "
                        "model")
    _add_profile_options(i, "Model Analyzer measured on")
    i.set_defaults(func=_run_import)
    v = what.add_parser("validate", help="check a profile (hand-written or measured) as the sidecar reads it",
                        description="Loads the profile as the sidecar and simulator do: every error names the "
                                    "file and the field. Then says what it holds.")
    v.add_argument("file", type=Path, help="the profile (JSON)")
    v.set_defaults(func=_run_validate)


def _add_profile_options(p: argparse.ArgumentParser, measured: str) -> None:
    """What an operator's profile is written as: its device kind, its name and its file."""
    p.add_argument("--device-kind", default="cpu",
                   help=f"the device kind {measured}, as the sidecar's workers name it (default: cpu)")
    p.add_argument("--name", help="the profile's name (default: the output file's stem)")
    p.add_argument("--out", type=Path, required=True, help="where the profile goes")


def _run_triton_profile(args: argparse.Namespace) -> int:
    from export import triton_profile  # lazy: tritonclient.grpc

    return triton_profile.run(args)


def _run_import(args: argparse.Namespace) -> int:
    from export import model_analyzer  # lazy: tritonclient.grpc (its accuracy reader's module)

    return model_analyzer.run(args)


def _run_validate(args: argparse.Namespace) -> int:
    from export import triton_profile  # lazy: tritonclient.grpc

    return triton_profile.validate(args.file)


def run_profile(args: argparse.Namespace) -> int:
    from export.supernets import build  # lazy: ctypes, google, onnx, torch

    built = build(args.family, args.preset, args.build_dir, mode=args.mode, repeats=args.repeats, rebuild=True,
                  out=args.out)
    profile, calibration, out = built.profile, built.calibration, built.profile_path
    model_dir = built.export_supernet(built.pareto, args.repository, instances=args.instances, threads=args.threads,
                                      kind=args.kind)
    device = profile.device_kinds[0]
    lo, hi = profile.variants[0], profile.variants[-1]
    fastest = min(v.latency[device].p50_at(1) for v in profile.variants)
    slowest = max(v.latency[device].p50_at(1) for v in profile.variants)
    print(f"profile: {out}")
    print(f"pareto subnets: {len(profile.variants)} of {len(calibration.candidates)} searched")
    print(f"top-1 accuracy: {100 * lo.accuracy:.2f}% .. {100 * hi.accuracy:.2f}%")
    print(f"batch-1 p50 latency ({device}): {fastest:.3f} ms .. {slowest:.3f} ms ({slowest / fastest:.2f}x)")
    # what a serving trade-off needs from a supernet; the default one is built to pass all three
    for label, ok in ((f"at least {MIN_PARETO} Pareto subnets", len(profile.variants) >= MIN_PARETO),
                      (f"accuracy spans at least {MIN_ACCURACY_SPAN_POINTS} points",
                       100 * (hi.accuracy - lo.accuracy) >= MIN_ACCURACY_SPAN_POINTS),
                      (f"batch-1 latency spans at least {MIN_LATENCY_SPAN}x", slowest / fastest >= MIN_LATENCY_SPAN)):
        print(f"  [{'ok' if ok else 'NOT MET'}] {label}")
    print(f"supernet model: {model_dir}")
    return 0


def run_export(args: argparse.Namespace) -> int:
    from export.artifacts import Artifacts  # lazy: ctypes, google, onnx, torch
    from export.profiler import export_static, export_supernet  # lazy: ctypes, google, onnx, torch

    artifacts = Artifacts(get_preset(args.preset), args.build_dir)
    act = artifacts.supernet()
    calibration = artifacts.calibration(act)
    profile_path = args.profile or artifacts.profile_path
    needs_profile = args.subnets == "pareto" or args.static_spread
    profile = Profile.load(profile_path) if needs_profile else None
    if profile is not None:
        chosen = calibration.select([v.id for v in profile.variants])
    else:
        chosen = list(calibration.candidates)
    model_dir = export_supernet(act, chosen, args.repository, norms=args.norms, instances=args.instances,
                                threads=args.threads, kind=args.kind)
    print(f"supernet model: {model_dir} ({len(chosen)} calibrated subnets), norms {args.norms}")
    static_ids = list(args.static) + ([v.id for v in profile.spread(args.static_spread)] if profile else [])
    for candidate in calibration.select(static_ids):
        path = export_static(act, candidate, args.repository, instances=args.instances, threads=args.threads,
                             kind=args.kind)
        print(f"static model: {path} ({candidate.subnet_id}, top-1 {100 * candidate.accuracy:.2f}%)")
    return 0


def run_add_model(args: argparse.Namespace) -> int:
    from export.repository import write_onnx  # lazy: onnx

    model_dir = write_onnx(args.repository, args.name or args.model.stem, args.model,
                           max_batch_size=args.max_batch_size, instances=args.instances, threads=args.threads)
    print(f"model: {model_dir}")
    return 0

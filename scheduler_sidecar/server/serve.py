"""``accscale serve``: the scheduler sidecar.

The sidecar answers KServe v2 on a gRPC and an HTTP port in front of one or more Triton
servers. Clients change nothing but one request parameter, ``slo_us``. The configuration file (``--config``) is
described below.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from pathlib import Path

from scheduler_sidecar.errors import ConfigError
from scheduler_sidecar.server import config as sidecar_config
from scheduler_sidecar.systems import policies

log = logging.getLogger(__name__)

EDGES = ("auto", "python", "native")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve", help="run the scheduler sidecar (KServe v2 gRPC + HTTP) in front of Triton workers",
        description=__doc__ + "\n" + sidecar_config.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, help="TOML configuration file (flags below override it)")
    p.add_argument("--triton", action="append", metavar="HOST:GRPC_PORT", dest="workers",
                   help="a Triton worker's gRPC endpoint (repeatable; replaces the config's workers)")
    p.add_argument("--profile", type=Path, help="serve one logical model from this profile (instead of [[models]])")
    p.add_argument("--model-name", default="digits", help="name clients use for the --profile model (default: digits)")
    names = sorted(policies())
    p.add_argument("--policy", choices=names, metavar="POLICY",
                   help=f"policy for the --profile model, one of {', '.join(names)} (default: slackfit)")
    p.add_argument("--default-slo-ms", type=float, help="SLO of requests without slo_us, --profile model (default 50)")
    p.add_argument("--queue-limit", type=int, help="queued requests before refusing, --profile model (default 1024)")
    p.add_argument("--overhead-us", type=int, help="time per request outside the sidecar's view (client, network), "
                   "taken off every slack, --profile model (default 300; a report's 'unseen p90 ms' measures it)")
    p.add_argument("--host", help="bind address of both ports (default 127.0.0.1)")
    p.add_argument("--http-port", type=int, help="HTTP port (default 8100; 0 picks a free one)")
    p.add_argument("--grpc-port", type=int, help="gRPC port (default 8101; 0 picks a free one)")
    p.add_argument("--edge", choices=EDGES, default="auto",
                   help="what serves the gRPC and HTTP ports: native (native/edge.cc, built on first use: the "
                        "protocols and the calls to Triton in C++, requests handed to Python in bursts), python "
                        "(grpc.aio and aiohttp), or auto (the default: native where it is built, else python; the log "
                        "says which and why)")
    p.add_argument("--admin-token", help="enable the admin endpoints with this bearer token "
                   "(or set ACCSCALE_ADMIN_TOKEN)")
    limits = p.add_argument_group("limits on what one client may send (the config keys of the same names)")
    limits.add_argument("--max-request-bytes", type=int, help="larger requests are refused unread (default 64 MiB)")
    limits.add_argument("--max-slo-us", type=int, help="largest slo_us accepted (default 60000000)")
    limits.add_argument("--read-timeout-s", type=float, help="an HTTP body must arrive within this (default 10)")
    limits.add_argument("--idle-timeout-s", type=float,
                        help="an idle HTTP connection, or one stuck in its headers, is closed (default 60)")
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> sidecar_config.SidecarConfig:
    models = None
    if args.profile is not None:
        spec = {"name": args.model_name, "profile": str(args.profile)}
        for key, value in (("policy", args.policy), ("queue_limit", args.queue_limit),
                           ("default_slo_us", None if args.default_slo_ms is None else round(args.default_slo_ms * 1e3)),
                           ("overhead_us", args.overhead_us)):
            if value is not None:
                spec[key] = value
        models = [spec]
    elif args.policy or args.default_slo_ms or args.queue_limit or args.overhead_us is not None:
        raise ConfigError("--policy, --default-slo-ms, --queue-limit and --overhead-us go with --profile; set them "
                         "per model in the config file otherwise")
    return sidecar_config.load(
        args.config, models=models, workers=args.workers, host=args.host, http_port=args.http_port,
        grpc_port=args.grpc_port, admin_token=args.admin_token or os.environ.get("ACCSCALE_ADMIN_TOKEN"),
        max_request_bytes=args.max_request_bytes, max_slo_us=args.max_slo_us, read_timeout_s=args.read_timeout_s,
        idle_timeout_s=args.idle_timeout_s)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    # asyncio's own loop: under uvloop the sidecar spent as much CPU per request (680 against 675 us, bench
    # sidecar, the same code back to back) and added no less latency, so it is not worth a dependency
    asyncio.run(serve(config, args.edge))
    return 0


async def serve(config: sidecar_config.SidecarConfig, edge: str = "auto") -> None:
    """Run the sidecar until SIGINT or SIGTERM."""
    import grpc  # lazy: grpc

    from scheduler_sidecar.server import (  # lazy: prometheus_client, tritonclient
        grpc_frontend,
        http_frontend,
    )
    from scheduler_sidecar.server.service import Sidecar  # lazy: prometheus_client, tritonclient

    # gRPC 1.67 tears its asyncio layer down when the last gRPC object goes, which here happens while
    # the interpreter is finalizing, and prints an empty "Error in sys.excepthook" on every exit
    # (grpc/grpc#38679, fixed in 1.75). One reference of our own for the process's life keeps that
    # teardown from running.
    grpc.aio.init_grpc_aio()
    if edge == "auto":
        from scheduler_sidecar.native import built_edge  # lazy: loads the native edge

        module, why = built_edge()
        edge = "python" if module is None else "native"
        log.info("the %s edge serves gRPC and HTTP by default: %s", edge, why)
    if edge == "native":
        from scheduler_sidecar.server import native_frontend  # lazy: builds or loads the native edge

        sidecar = Sidecar(config, connect=native_frontend.connect())
        await sidecar.start()
        grpc_server, grpc_port, http_port = await native_frontend.start(sidecar, config.host, config.grpc_port,
                                                                        config.http_port)
        http_runner = None  # the native edge serves HTTP too
    else:
        sidecar = Sidecar(config)
        await sidecar.start()
        grpc_server, grpc_port = await grpc_frontend.start(sidecar, config.host, config.grpc_port)
        http_runner, http_port = await http_frontend.start(sidecar, config.host, config.http_port)
    log.info("gRPC and HTTP served by the %s edge", edge)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"accscale sidecar ready: gRPC {config.host}:{grpc_port}, HTTP {config.host}:{http_port} "
          f"(metrics at http://{config.host}:{http_port}/metrics)", flush=True)
    try:
        await stop.wait()
    finally:
        log.info("stopping")
        await grpc_server.stop(grace=1.0)
        if http_runner is not None:
            await http_runner.cleanup()
        await sidecar.close()

"""``python -m scheduler_sidecar.native [--if-possible]``: build the native edge (a no-op when it is up to date).

``--if-possible``: where the tools are missing, say so and succeed (``make demo``, which the Python edge serves then);
without it, that is an error (``make test``, whose native-edge tests need it).
"""

from __future__ import annotations

import argparse
import sys

from scheduler_sidecar.native import NativeUnavailable, edge


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m scheduler_sidecar.native", description=__doc__.splitlines()[0])
    parser.add_argument("--if-possible", action="store_true", help="a build that cannot run here is not an error")
    args = parser.parse_args()
    try:
        edge()
    except NativeUnavailable as exc:
        if not args.if_possible:
            raise
        print(f"the native edge is not built, and the Python edge serves gRPC: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

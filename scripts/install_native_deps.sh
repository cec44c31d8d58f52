#!/usr/bin/env bash
# What the native programs (native/) build with: CMake, a C++17 compiler, pkg-config and Debian's gRPC and protobuf.
# Installed with apt where it is present and this runs as root; otherwise a message says what to install, and the
# sidecar keeps its Python paths (nothing fails here: the native build is optional until it is asked for).
set -euo pipefail
packages="cmake g++ pkg-config libgrpc++-dev libprotobuf-dev protobuf-compiler-grpc"
if pkg-config --exists grpc++ protobuf 2>/dev/null && command -v grpc_cpp_plugin cmake g++ >/dev/null 2>&1; then
    exit 0
fi
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "== installing the native build's packages: $packages"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q $packages >/dev/null \
        || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $packages >/dev/null; }
else
    echo "note: the native programs need $packages (Debian names); install them to build native/ (not root or no apt here)"
fi

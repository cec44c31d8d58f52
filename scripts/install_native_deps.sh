#!/usr/bin/env bash
# What the native programs (native/) build with: CMake, a C++17 compiler, pkg-config, Debian's gRPC and protobuf, and
# RapidJSON (header-only; the HTTP edge's JSON, as Triton's own HTTP server reads it).
# Installed with apt where it is present and this runs as root; otherwise a message says what to install, and the
# sidecar keeps its Python paths (nothing fails here: the native build is optional until it is asked for).
set -euo pipefail
packages="cmake g++ pkg-config libgrpc++-dev libprotobuf-dev protobuf-compiler-grpc rapidjson-dev"
if pkg-config --exists grpc++ protobuf RapidJSON 2>/dev/null && command -v grpc_cpp_plugin cmake g++ >/dev/null 2>&1; then
    exit 0
fi
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "== installing the native build's packages: $packages"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q $packages >/dev/null \
        || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $packages >/dev/null; }
else
    echo "note: the native programs need $packages (Debian names); install them to build native/ (not root or no apt here)"
fi

"""Writes the KServe v2 protocol's descriptors, as tritonclient carries them, to a FileDescriptorSet for protoc.

Triton ships no ``.proto`` files in the Python packages this project installs; tritonclient's generated modules
hold the same definitions (grpc_service.proto and model_config.proto), and protoc generates C++ from them with
``--descriptor_set_in``. ``python native/kserve_protos.py OUT.pb``
"""

from __future__ import annotations

import sys

from google.protobuf import descriptor_pb2
from tritonclient.grpc import model_config_pb2, service_pb2


def main(out: str) -> int:
    files = descriptor_pb2.FileDescriptorSet()
    for module in (model_config_pb2, service_pb2):  # dependencies first
        module.DESCRIPTOR.CopyToProto(files.file.add())
    with open(out, "wb") as f:
        f.write(files.SerializeToString())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

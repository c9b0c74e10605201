#!/usr/bin/env python3
"""A bare CRI client: the yardstick `benches/plan_output.py` holds the
`imagegc plan` process against. It calls ListImages and ListContainers on a
unix socket, lets the generated stubs parse the answers, and does nothing
more: no records, no plan, no output beyond one line of counts.

    python3 benches/plan_client.py SOCKET STUBS_DIR

STUBS_DIR holds cri_pb2.py and cri_pb2_grpc.py, generated from proto/cri.proto
with grpcio-tools (plan_output.py does that in its venv). Prints
`images=N containers=M in_process_ms=T`, where T runs from just before the
channel is made to just after the second answer is parsed: the interpreter's
start and the imports are outside it, and inside the whole process's time.
"""
import sys
import time

sys.path.insert(0, sys.argv[2])

import grpc  # noqa: E402
import cri_pb2  # noqa: E402
import cri_pb2_grpc  # noqa: E402

# As imagegc (src/cri/client.rs, MAX_MESSAGE_BYTES): 10,000 images answer
# with more than gRPC's 4 MiB default.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024


def main():
    socket = sys.argv[1]
    started = time.perf_counter()
    with grpc.insecure_channel(
        f"unix://{socket}",
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # gRPC's default authority for a unix socket is the socket's
            # path, which hyper (under the fake runtime's tonic server, as
            # under any Rust CRI server) refuses as a malformed `:authority`.
            ("grpc.default_authority", "localhost"),
        ],
    ) as channel:
        images = cri_pb2_grpc.ImageServiceStub(channel).ListImages(cri_pb2.ListImagesRequest(), timeout=30)
        containers = cri_pb2_grpc.RuntimeServiceStub(channel).ListContainers(
            cri_pb2.ListContainersRequest(), timeout=30
        )
        image_count = len(images.images)
        container_count = len(containers.containers)
    elapsed = (time.perf_counter() - started) * 1000
    print(f"images={image_count} containers={container_count} in_process_ms={elapsed:.2f}")


if __name__ == "__main__":
    main()

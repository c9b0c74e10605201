#!/usr/bin/env python3
"""Writes imagegc's container image as an OCI image-layout tarball: one
manifest per architecture under one index, each image the static binary as
/imagegc, deploy/imagegc.toml as /etc/imagegc/imagegc.toml and a bundle of
root certificates as /etc/ssl/certs/ca-certificates.crt (SSL_CERT_FILE) on
an empty base (what the Containerfile's final stage holds).

    scripts/oci-image.py --name ghcr.io/imagegc/imagegc:0.1.0 \\
        --binary amd64=target/x86_64-unknown-linux-musl/release/imagegc \\
        --binary arm64=target/aarch64-unknown-linux-musl/release/imagegc \\
        --config deploy/imagegc.toml --ca-bundle /etc/ssl/certs/ca-certificates.crt \\
        --output target/image/imagegc.oci.tar

Layers are gzip tars with fixed metadata (mtime 0, uid 0): the same binary
gives the same digest. Python's standard library only. scripts/build-image.sh
calls it; skopeo pushes the result (`skopeo copy --all oci-archive:...`) and
`ctr images import --all-platforms` loads it.
"""

import argparse
import gzip
import hashlib
import io
import json
import tarfile

LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
# Where the image keeps its root certificates, for the registry lookups
# (kubernetes.registry_manifests): Debian's path, which rustls-native-certs
# also probes, named by SSL_CERT_FILE so that no other place is read.
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
CONFIG = "application/vnd.oci.image.config.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"


def layer(entries):
    """(uncompressed tar, gzip of it) of entries: (path, bytes, mode)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = sorted({"/".join(p.strip("/").split("/")[:i]) for p, _, _ in entries
                       for i in range(1, len(p.strip("/").split("/")))})
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            tar.addfile(info)
        for path, data, mode in entries:
            info = tarfile.TarInfo(path.strip("/"))
            info.mode = mode
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    data = raw.getvalue()
    return data, gzip.compress(data, mtime=0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", required=True, help="the image reference, REPOSITORY:TAG")
    parser.add_argument("--binary", action="append", required=True, metavar="ARCH=PATH",
                        help="a static imagegc for one architecture (amd64, arm64)")
    parser.add_argument("--config", required=True, help="baked in as /etc/imagegc/imagegc.toml")
    parser.add_argument("--ca-bundle", help=f"PEM root certificates, baked in as {CA_BUNDLE} (SSL_CERT_FILE); "
                        "the file a link names is read")
    parser.add_argument("--version", default="", help="org.opencontainers.image.version")
    parser.add_argument("--output", required=True, help="the OCI image-layout tarball to write")
    args = parser.parse_args()

    blobs = {}

    def blob(data):
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"digest": digest, "size": len(data)}

    with open(args.config, "rb") as f:
        config_file = f.read()
    extra, env = [], ["IMAGEGC_CONFIG=/etc/imagegc/imagegc.toml"]
    if args.ca_bundle:
        with open(args.ca_bundle, "rb") as f:
            bundle = f.read()
        if b"-----BEGIN CERTIFICATE-----" not in bundle:
            parser.error(f"--ca-bundle {args.ca_bundle} holds no PEM certificate")
        extra.append((CA_BUNDLE, bundle, 0o644))
        env.append(f"SSL_CERT_FILE={CA_BUNDLE}")
    labels = {"org.opencontainers.image.source": "https://github.com/imagegc/imagegc",
              "org.opencontainers.image.title": "imagegc"}
    if args.version:
        labels["org.opencontainers.image.version"] = args.version
    manifests = []
    for spec in args.binary:
        arch, _, path = spec.partition("=")
        with open(path, "rb") as f:
            exe = f.read()
        raw, compressed = layer([("/imagegc", exe, 0o755), ("/etc/imagegc/imagegc.toml", config_file, 0o644), *extra])
        layer_desc = blob(compressed)
        config = {
            "architecture": arch, "os": "linux",
            "config": {"Entrypoint": ["/imagegc"], "Cmd": ["run", "--config", "/etc/imagegc/imagegc.toml"],
                       "User": "0:0", "ExposedPorts": {"9105/tcp": {}},
                       "Env": env, "Labels": labels},
            "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(raw).hexdigest()]},
        }
        config_desc = blob(json.dumps(config, sort_keys=True).encode())
        manifest = {"schemaVersion": 2, "mediaType": MANIFEST,
                    "config": {"mediaType": CONFIG, **config_desc},
                    "layers": [{"mediaType": LAYER, **layer_desc}]}
        manifest_desc = blob(json.dumps(manifest, sort_keys=True).encode())
        manifests.append({"mediaType": MANIFEST, **manifest_desc, "platform": {"architecture": arch, "os": "linux"}})
    index = {"schemaVersion": 2, "mediaType": INDEX, "manifests": manifests}
    index_desc = blob(json.dumps(index, sort_keys=True).encode())
    # The layout's own index names the image (containerd's and skopeo's
    # annotations) and points at the multi-architecture index.
    tag = args.name.rsplit(":", 1)[-1] if ":" in args.name.rsplit("/", 1)[-1] else "latest"
    top = {"schemaVersion": 2, "mediaType": INDEX,
           "manifests": [{"mediaType": INDEX, **index_desc,
                          "annotations": {"io.containerd.image.name": args.name,
                                          "org.opencontainers.image.ref.name": tag}}]}
    with tarfile.open(args.output, "w") as tar:
        def add(member, data):
            info = tarfile.TarInfo(member)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
        add("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        add("index.json", json.dumps(top).encode())
        for digest, data in blobs.items():
            add("blobs/sha256/" + digest.split(":", 1)[1], data)
    print(f"{args.output}: {args.name} ({', '.join(m['platform']['architecture'] for m in manifests)}) "
          f"index {index_desc['digest']}")


if __name__ == "__main__":
    main()

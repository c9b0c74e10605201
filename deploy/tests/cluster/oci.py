"""OCI image-layout tarballs built in the test, for `ctr images import`.

Layers are uncompressed tars with fixed metadata, so the same files give
byte-identical layers, which containerd stores once (the busybox layer is
shared by the pause image and every workload image).
"""

import hashlib
import io
import json
import os
import tarfile

LAYER = "application/vnd.oci.image.layer.v1.tar"
CONFIG = "application/vnd.oci.image.config.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
BUSYBOX = "/bin/busybox"


def layer(entries):
    """entries: (path, bytes | ('symlink', target), mode). Returns tar bytes."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = set()
        for path, _, _ in entries:
            parts = path.strip("/").split("/")[:-1]
            for i in range(1, len(parts) + 1):
                dirs.add("/".join(parts[:i]))
        for d in sorted(dirs):
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            tar.addfile(info)
        for path, data, mode in entries:
            info = tarfile.TarInfo(path.strip("/"))
            info.mode = mode
            if isinstance(data, tuple):
                info.type = tarfile.SYMTYPE
                info.linkname = data[1]
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def busybox_layer():
    with open(BUSYBOX, "rb") as f:
        busybox = f.read()
    return layer([("/bin/busybox", busybox, 0o755), ("/bin/sh", ("symlink", "busybox"), 0o777),
                  ("/bin/sleep", ("symlink", "busybox"), 0o777)])


def write_image(path, name, layers, entrypoint=None, cmd=None, user=None, exposed_ports=None):
    """Writes an OCI image layout of `layers` (tar bytes each), named `name`,
    as one tar file at `path`. Returns the image config's digest (the id)."""
    blobs = {}

    def blob(data):
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return digest, len(data)

    layer_descs = [blob(data) for data in layers]
    config = {"architecture": "amd64", "os": "linux",
              "config": {k: v for k, v in (("Entrypoint", entrypoint), ("Cmd", cmd), ("User", user),
                                           ("ExposedPorts", exposed_ports)) if v is not None},
              "rootfs": {"type": "layers", "diff_ids": [d for d, _ in layer_descs]}}
    config_digest, config_size = blob(json.dumps(config, sort_keys=True).encode())
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST,
                "config": {"mediaType": CONFIG, "digest": config_digest, "size": config_size},
                "layers": [{"mediaType": LAYER, "digest": d, "size": s} for d, s in layer_descs]}
    manifest_digest, manifest_size = blob(json.dumps(manifest, sort_keys=True).encode())
    index = {"schemaVersion": 2, "mediaType": INDEX,
             "manifests": [{"mediaType": MANIFEST, "digest": manifest_digest, "size": manifest_size,
                            "platform": {"architecture": "amd64", "os": "linux"},
                            "annotations": {"io.containerd.image.name": name,
                                            "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1]}}]}
    with tarfile.open(path, "w") as tar:
        def add(member, data):
            info = tarfile.TarInfo(member)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
        add("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        add("index.json", json.dumps(index).encode())
        for digest, data in blobs.items():
            add("blobs/sha256/" + digest.split(":", 1)[1], data)
    return config_digest


def random_layer(size, seed_name):
    """A layer of `size` incompressible bytes in one file."""
    return layer([(f"/fill/{seed_name}", os.urandom(size), 0o644)])

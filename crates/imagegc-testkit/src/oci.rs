//! OCI image-layout tarballs built in the test process, with no registry,
//! no docker and no network: `ctr images import` reads them as they are.
//!
//! Layers are tars made deterministically from their description, so two
//! images that use the same layer get byte-identical blobs and the runtime
//! stores that layer once. They are written plain (uncompressed, the fastest
//! to import) unless the image is built with [`ImageSpec::gzip`], as
//! registries serve them: then the blob is smaller than the tar it unpacks
//! to, and runtimes that report compressed sizes (containerd) and those that
//! report uncompressed ones (CRI-O) disagree about the image's size. Every image starts with a
//! layer holding `/sleeper`, a static binary that sleeps until SIGTERM and
//! is the image's entrypoint, so any image can back a running container.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{self, BufWriter, Read};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use flate2::Compression;
use flate2::write::GzEncoder;

use serde_json::json;
use sha2::{Digest, Sha256};

pub const LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar";
pub const LAYER_GZIP_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
pub const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";
/// The OCI index annotation `skopeo copy oci-archive:FILE:NAME` picks an
/// entry by.
const REF_NAME_ANNOTATION: &str = "org.opencontainers.image.ref.name";
/// The index annotation `ctr images import` names the image after.
pub const NAME_ANNOTATION: &str = "io.containerd.image.name";
/// The runs of a [`Layer::compressible`] file: this many pseudo-random bytes,
/// then as many zeros, and so on. gzip keeps the random half and squeezes
/// the zeros to almost nothing: the blob is about half the tar.
const COMPRESSIBLE_RUN: usize = 4096;
/// Where the sleeping entrypoint lives in every image.
pub const SLEEPER_PATH: &str = "/sleeper";

/// The seed of [`Layer::shared_base`]: any fixed value works, as long as no
/// test uses it with [`Layer::random`] by accident.
const SHARED_BASE_SEED: u64 = 0xba5e_ba5e_ba5e_ba5e;

/// The sleeper: exits on SIGTERM or SIGINT (a handler is needed because a
/// sandbox's first process is PID 1 of its namespace, which ignores signals
/// left at their default action), otherwise sleeps forever.
const SLEEPER_SOURCE: &str = r#"#include <signal.h>
#include <unistd.h>
static void bye(int sig) { (void)sig; _exit(0); }
int main(void) {
    signal(SIGTERM, bye);
    signal(SIGINT, bye);
    for (;;) pause();
}
"#;

/// One layer of an image, described by what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    kind: LayerKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum LayerKind {
    /// One file of `size` incompressible bytes drawn from `seed`.
    Random { seed: u64, size: u64 },
    /// One file of `size` bytes drawn from `seed`, half of them zeros.
    Compressible { seed: u64, size: u64 },
    /// One regular file.
    File { path: String, mode: u32, contents: Vec<u8> },
}

impl Layer {
    /// A layer with one file of `size_bytes` pseudo-random (incompressible)
    /// bytes. The same seed and size always give the same bytes, so images
    /// built with the same `(seed, size_bytes)` share the layer.
    pub fn random(seed: u64, size_bytes: u64) -> Self {
        Self {
            kind: LayerKind::Random { seed, size: size_bytes },
        }
    }

    /// A layer with one file of `size_bytes` bytes that gzip halves:
    /// pseudo-random bytes and zeros in alternate runs of 4 KiB. The same
    /// seed and size always give the same bytes, as with [`Layer::random`].
    pub fn compressible(seed: u64, size_bytes: u64) -> Self {
        Self {
            kind: LayerKind::Compressible { seed, size: size_bytes },
        }
    }

    /// The "base image" layer: identical in every image that uses it with the
    /// same size, so it is stored once however many images have it.
    pub fn shared_base(size_bytes: u64) -> Self {
        Self::random(SHARED_BASE_SEED, size_bytes)
    }

    /// A layer with one regular file at `path` (absolute inside the image).
    pub fn file(path: &str, mode: u32, contents: impl Into<Vec<u8>>) -> Self {
        Self {
            kind: LayerKind::File {
                path: path.trim_start_matches('/').to_string(),
                mode,
                contents: contents.into(),
            },
        }
    }

    /// The layer holding the static `/sleeper` binary (built on first use).
    pub fn sleeper() -> Self {
        Self::file(SLEEPER_PATH, 0o755, sleeper_binary())
    }

    /// What identifies a generated layer's bytes, for the caches below.
    fn generated(&self) -> Option<(bool, u64, u64)> {
        match self.kind {
            LayerKind::Random { seed, size } => Some((false, seed, size)),
            LayerKind::Compressible { seed, size } => Some((true, seed, size)),
            LayerKind::File { .. } => None,
        }
    }

    /// The layer as the layout stores it, gzip-compressed or not. Hashing
    /// (and compressing) is the slow part of building an image in an
    /// unoptimised test build, so for generated layers (shared bases above
    /// all) the digests of plain ones and the whole of compressed ones are
    /// remembered for the process.
    fn packed(&self, gzip: bool) -> Packed {
        type Cache<T> = Mutex<BTreeMap<(bool, u64, u64), T>>;
        static DIGESTS: Cache<Blob> = Mutex::new(BTreeMap::new());
        static COMPRESSED: Cache<Packed> = Mutex::new(BTreeMap::new());
        let key = self.generated();
        if gzip {
            if let Some(packed) = key.and_then(|k| COMPRESSED.lock().unwrap().get(&k).cloned()) {
                return packed;
            }
            let tar = self.tar();
            let mut encoder = GzEncoder::new(Vec::with_capacity(tar.len() / 2), Compression::fast());
            io::Write::write_all(&mut encoder, &tar).expect("compressing a layer in memory");
            let bytes = encoder.finish().expect("compressing a layer in memory");
            let packed = Packed {
                blob: Blob::of(&bytes),
                unpacked: Blob::of(&tar),
                bytes: Arc::new(bytes),
            };
            if let Some(key) = key {
                COMPRESSED.lock().unwrap().insert(key, packed.clone());
            }
            return packed;
        }
        let tar = self.tar();
        let blob = match key.and_then(|k| DIGESTS.lock().unwrap().get(&k).cloned()) {
            Some(blob) => blob,
            None => {
                let blob = Blob::of(&tar);
                if let Some(key) = key {
                    DIGESTS.lock().unwrap().insert(key, blob.clone());
                }
                blob
            }
        };
        Packed {
            unpacked: blob.clone(),
            blob,
            bytes: Arc::new(tar),
        }
    }

    /// The layer as an uncompressed tar; the same layer always gives the same bytes.
    pub fn tar(&self) -> Vec<u8> {
        match &self.kind {
            LayerKind::Random { seed, size } => {
                let mut builder = tar::Builder::new(Vec::with_capacity(*size as usize + 4096));
                append_dir(&mut builder, "data/");
                let path = format!("data/{seed:016x}-{size}");
                append_file(&mut builder, &path, 0o644, *size, RandomBytes::new(*seed).take(*size));
                builder.into_inner().expect("finishing a layer tar in memory")
            }
            LayerKind::Compressible { seed, size } => {
                let mut data = vec![0u8; *size as usize];
                let mut random = RandomBytes::new(*seed);
                for run in data.chunks_mut(2 * COMPRESSIBLE_RUN) {
                    let end = run.len().min(COMPRESSIBLE_RUN);
                    random.read_exact(&mut run[..end]).expect("reading pseudo-random bytes");
                }
                let mut builder = tar::Builder::new(Vec::with_capacity(data.len() + 4096));
                append_dir(&mut builder, "data/");
                let path = format!("data/{seed:016x}-{size}-compressible");
                append_file(&mut builder, &path, 0o644, *size, data.as_slice());
                builder.into_inner().expect("finishing a layer tar in memory")
            }
            LayerKind::File { path, mode, contents } => {
                let mut builder = tar::Builder::new(Vec::with_capacity(contents.len() + 4096));
                let components: Vec<&str> = path.split('/').collect();
                for depth in 1..components.len() {
                    append_dir(&mut builder, &format!("{}/", components[..depth].join("/")));
                }
                append_file(&mut builder, path, *mode, contents.len() as u64, contents.as_slice());
                builder.into_inner().expect("finishing a layer tar in memory")
            }
        }
    }
}

fn header(entry_type: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(entry_type);
    header.set_mode(mode);
    header.set_size(size);
    header.set_mtime(0);
    header.set_uid(0);
    header.set_gid(0);
    header
}

fn append_dir(builder: &mut tar::Builder<Vec<u8>>, path: &str) {
    let mut header = header(tar::EntryType::Directory, 0o755, 0);
    builder
        .append_data(&mut header, path, io::empty())
        .expect("appending a directory to a tar in memory");
}

fn append_file(builder: &mut tar::Builder<Vec<u8>>, path: &str, mode: u32, size: u64, data: impl Read) {
    let mut header = header(tar::EntryType::Regular, mode, size);
    builder
        .append_data(&mut header, path, data)
        .expect("appending a file to a tar in memory");
}

/// A fast pseudo-random byte stream (xorshift64*, seeded through splitmix64
/// so that nearby seeds give unrelated streams). Not cryptographic; its only
/// job is to be incompressible and reproducible.
struct RandomBytes {
    state: u64,
    pending: [u8; 8],
    pending_len: usize,
}

impl RandomBytes {
    fn new(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        Self {
            state: z | 1,
            pending: [0; 8],
            pending_len: 0,
        }
    }

    fn next_u64(&mut self) -> u64 {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        self.state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

impl Read for RandomBytes {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut written = 0;
        while self.pending_len > 0 && written < buf.len() {
            buf[written] = self.pending[8 - self.pending_len];
            self.pending_len -= 1;
            written += 1;
        }
        let mut chunks = buf[written..].chunks_exact_mut(8);
        for chunk in &mut chunks {
            chunk.copy_from_slice(&self.next_u64().to_le_bytes());
            written += 8;
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            self.pending = self.next_u64().to_le_bytes();
            self.pending_len = 8;
            for byte in rest {
                *byte = self.pending[8 - self.pending_len];
                self.pending_len -= 1;
                written += 1;
            }
        }
        Ok(written)
    }
}

/// The static sleeper binary, compiled once per test process with
/// `gcc -static`. Panics with the reason when it cannot be built.
pub fn sleeper_binary() -> &'static [u8] {
    static SLEEPER: OnceLock<Vec<u8>> = OnceLock::new();
    SLEEPER.get_or_init(|| build_sleeper().unwrap_or_else(|reason| panic!("{reason}")))
}

fn build_sleeper() -> Result<Vec<u8>, String> {
    let dir = tempfile::Builder::new()
        .prefix("imagegc-sleeper-")
        .tempdir()
        .map_err(|e| format!("cannot create a temp dir to build the sleeper: {e}"))?;
    let source = dir.path().join("sleeper.c");
    let binary = dir.path().join("sleeper");
    std::fs::write(&source, SLEEPER_SOURCE).map_err(|e| format!("cannot write {}: {e}", source.display()))?;
    let output = Command::new("gcc")
        .args(["-static", "-O2", "-s", "-o"])
        .arg(&binary)
        .arg(&source)
        .output()
        .map_err(|e| {
            format!(
                "the e2e tests need gcc to build the static /sleeper binary their images run, \
                 and running gcc failed: {e} (install it with `apt-get install -y gcc libc6-dev`)"
            )
        })?;
    if !output.status.success() {
        return Err(format!(
            "gcc -static failed to build the /sleeper binary ({}): {} \
             (static linking needs libc6-dev: `apt-get install -y gcc libc6-dev`)",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    std::fs::read(&binary).map_err(|e| format!("cannot read {}: {e}", binary.display()))
}

/// A layer as the layout stores it.
#[derive(Clone)]
struct Packed {
    /// The blob: the tar, or the tar gzip-compressed.
    blob: Blob,
    /// The tar itself: its digest is the layer's diff id.
    unpacked: Blob,
    bytes: Arc<Vec<u8>>,
}

/// A content-addressed blob of the layout.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Blob {
    /// `sha256:<hex>`.
    pub digest: String,
    pub size: u64,
}

impl Blob {
    fn of(bytes: &[u8]) -> Self {
        Self {
            digest: format!("sha256:{:x}", Sha256::digest(bytes)),
            size: bytes.len() as u64,
        }
    }

    fn hex(&self) -> &str {
        self.digest.trim_start_matches("sha256:")
    }
}

/// An image to build: its names and its layers, bottom first.
#[derive(Debug, Clone)]
pub struct ImageSpec {
    names: Vec<String>,
    layers: Vec<Layer>,
    gzip: bool,
}

impl ImageSpec {
    /// An image named `name` (a full reference such as
    /// `docker.io/library/app:1`) whose only layer so far holds `/sleeper`.
    pub fn new(name: &str) -> Self {
        Self {
            names: vec![name.to_string()],
            layers: vec![Layer::sleeper()],
            gzip: false,
        }
    }

    /// `docker.io/library/<name>:1`, a small image: the 2 MiB base that
    /// such images share, and 1 MiB of its own made from `seed`.
    pub fn small(name: &str, seed: u64) -> Self {
        const MIB: u64 = 1024 * 1024;
        Self::new(&format!("docker.io/library/{name}:1"))
            .layer(Layer::shared_base(2 * MIB))
            .layer(Layer::random(seed, MIB))
    }

    /// Adds a layer on top.
    pub fn layer(mut self, layer: Layer) -> Self {
        self.layers.push(layer);
        self
    }

    /// Writes every layer gzip-compressed, as registries serve them.
    pub fn gzip(mut self) -> Self {
        self.gzip = true;
        self
    }

    /// Gives the same image one more name (another tag of the same image id).
    pub fn also_tagged(mut self, name: &str) -> Self {
        self.names.push(name.to_string());
        self
    }

    /// The first name.
    pub fn name(&self) -> &str {
        &self.names[0]
    }

    /// Writes the image as an OCI image-layout tarball at `path`.
    // Long on purpose: the layout's files (blobs, manifest, config, index)
    // are written in the order the format nests them, each digest feeding
    // the next.
    pub fn write_layout(&self, path: &Path) -> io::Result<BuiltImage> {
        let file = BufWriter::new(File::create(path)?);
        let mut out = tar::Builder::new(file);
        let dir = |out: &mut tar::Builder<BufWriter<File>>, path: &str| {
            let mut header = header(tar::EntryType::Directory, 0o755, 0);
            out.append_data(&mut header, path, io::empty())
        };
        let blob = |out: &mut tar::Builder<BufWriter<File>>, blob: &Blob, bytes: &[u8]| {
            let mut header = header(tar::EntryType::Regular, 0o644, bytes.len() as u64);
            out.append_data(&mut header, format!("blobs/sha256/{}", blob.hex()), bytes)
        };
        dir(&mut out, "blobs/")?;
        dir(&mut out, "blobs/sha256/")?;

        let mut layers = Vec::new();
        let mut unpacked = Vec::new();
        let mut written = BTreeSet::new();
        for layer in &self.layers {
            let packed = layer.packed(self.gzip);
            if written.insert(packed.blob.digest.clone()) {
                blob(&mut out, &packed.blob, &packed.bytes)?;
            }
            layers.push(packed.blob);
            unpacked.push(packed.unpacked);
        }
        let diff_ids: Vec<&str> = unpacked.iter().map(|tar| tar.digest.as_str()).collect();
        let layer_media_type = if self.gzip {
            LAYER_GZIP_MEDIA_TYPE
        } else {
            LAYER_MEDIA_TYPE
        };

        let config = json!({
            "architecture": oci_architecture(),
            "os": "linux",
            "config": {
                "Entrypoint": [SLEEPER_PATH],
                "Env": ["PATH=/"],
                // Keeps image ids distinct per name even when layers match.
                "Labels": {"io.imagegc.e2e.name": self.name()},
            },
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        });
        let config_bytes = serde_json::to_vec(&config).expect("serializing an image config");
        let config_blob = Blob::of(&config_bytes);
        blob(&mut out, &config_blob, &config_bytes)?;

        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": config_blob.digest, "size": config_blob.size},
            "layers": layers
                .iter()
                .map(|l| json!({"mediaType": layer_media_type, "digest": l.digest, "size": l.size}))
                .collect::<Vec<_>>(),
        });
        let manifest_bytes = serde_json::to_vec(&manifest).expect("serializing a manifest");
        let manifest_blob = Blob::of(&manifest_bytes);
        blob(&mut out, &manifest_blob, &manifest_bytes)?;

        // Each tag, and each repository by digest: the references a CRI pull
        // records, which CRI lists as tags and repo digests.
        let built = BuiltImage {
            names: self.names.clone(),
            id: config_blob.digest.clone(),
            config: config_blob,
            manifest: manifest_blob,
            layers,
            unpacked,
        };
        let references: Vec<String> = built.names.iter().cloned().chain(built.repo_digests()).collect();
        let index = json!({
            "schemaVersion": 2,
            "mediaType": INDEX_MEDIA_TYPE,
            "manifests": references
                .iter()
                .map(|reference| json!({
                    "mediaType": MANIFEST_MEDIA_TYPE,
                    "digest": built.manifest.digest,
                    "size": built.manifest.size,
                    "platform": {"architecture": oci_architecture(), "os": "linux"},
                    // containerd imports by the first; skopeo (CRI-O's
                    // test bed) picks an entry by the second.
                    "annotations": {NAME_ANNOTATION: reference, REF_NAME_ANNOTATION: reference},
                }))
                .collect::<Vec<_>>(),
        });
        let index_bytes = serde_json::to_vec(&index).expect("serializing an index");
        let layout_bytes = br#"{"imageLayoutVersion":"1.0.0"}"#;
        let mut layout_header = header(tar::EntryType::Regular, 0o644, layout_bytes.len() as u64);
        out.append_data(&mut layout_header, "oci-layout", &layout_bytes[..])?;
        let mut index_header = header(tar::EntryType::Regular, 0o644, index_bytes.len() as u64);
        out.append_data(&mut index_header, "index.json", index_bytes.as_slice())?;
        out.into_inner()?
            .into_inner()
            .map_err(std::io::IntoInnerError::into_error)?
            .sync_all()?;

        Ok(built)
    }
}

/// What was built: the facts a test compares the runtime's answers with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltImage {
    pub names: Vec<String>,
    /// The image id containerd reports: the config digest.
    pub id: String,
    pub config: Blob,
    pub manifest: Blob,
    /// The layer blobs as the layout holds them (gzip-compressed for an
    /// image built with [`ImageSpec::gzip`]). Bottom first; a layer used
    /// twice in one image appears twice.
    pub layers: Vec<Blob>,
    /// Each layer's tar, uncompressed (its digest is the diff id): the same
    /// as `layers` for an uncompressed image.
    pub unpacked: Vec<Blob>,
}

impl BuiltImage {
    /// The first name.
    pub fn name(&self) -> &str {
        &self.names[0]
    }

    /// `repository@sha256:<manifest digest>` for each name, as CRI lists them.
    pub fn repo_digests(&self) -> Vec<String> {
        let mut digests: Vec<String> = Vec::new();
        for name in &self.names {
            let digest = format!("{}@{}", repository(name), self.manifest.digest);
            if !digests.contains(&digest) {
                digests.push(digest);
            }
        }
        digests
    }

    /// Bytes of all layer blobs, counting each of its layers once (what an
    /// uncompressed image weighs; what a compressed one weighs packed).
    pub fn layer_bytes(&self) -> u64 {
        self.layers.iter().collect::<BTreeSet<_>>().iter().map(|l| l.size).sum()
    }

    /// Bytes of all layers unpacked (their tars), counting each once.
    pub fn unpacked_bytes(&self) -> u64 {
        self.unpacked
            .iter()
            .collect::<BTreeSet<_>>()
            .iter()
            .map(|l| l.size)
            .sum()
    }
}

/// The bytes of the distinct layers of `images` that are not among `already`:
/// what importing `images` adds to a store that holds `already`.
pub fn new_layer_bytes(images: &[&BuiltImage], already: &[&BuiltImage]) -> u64 {
    let old: BTreeSet<&Blob> = already.iter().flat_map(|i| &i.layers).collect();
    images
        .iter()
        .flat_map(|i| &i.layers)
        .filter(|l| !old.contains(l))
        .collect::<BTreeSet<_>>()
        .iter()
        .map(|l| l.size)
        .sum()
}

/// The name without its tag: `docker.io/library/app:1` -> `docker.io/library/app`.
pub fn repository(name: &str) -> &str {
    match name.rfind(':') {
        Some(colon) if !name[colon..].contains('/') => &name[..colon],
        _ => name,
    }
}

fn oci_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_layers_are_reproducible_and_sized() {
        let one = Layer::random(7, 100_003).tar();
        assert_eq!(one, Layer::random(7, 100_003).tar());
        assert_ne!(one, Layer::random(8, 100_003).tar());
        assert!(one.len() as u64 > 100_003 && (one.len() as u64) < 100_003 + 8192);
        assert_eq!(Layer::shared_base(4096).tar(), Layer::shared_base(4096).tar());
    }

    #[test]
    fn random_bytes_do_not_depend_on_read_sizes() {
        let mut whole = vec![0u8; 1000];
        RandomBytes::new(3).read_exact(&mut whole).unwrap();
        let mut pieces = Vec::new();
        let mut rng = RandomBytes::new(3);
        for size in [1, 7, 9, 3, 100, 880] {
            let mut buf = vec![0u8; size];
            rng.read_exact(&mut buf).unwrap();
            pieces.extend(buf);
        }
        assert_eq!(whole, pieces);
    }

    #[test]
    fn gzip_layers_unpack_to_the_tar_their_diff_id_names() {
        let layer = Layer::compressible(11, 300_001);
        let packed = layer.packed(true);
        let mut tar = Vec::new();
        flate2::read::GzDecoder::new(packed.bytes.as_slice())
            .read_to_end(&mut tar)
            .unwrap();
        assert_eq!(tar, layer.tar());
        assert_eq!(packed.unpacked, Blob::of(&tar));
        assert_eq!(packed.blob, Blob::of(&packed.bytes));
        // File layers are compressed anew each time: the same bytes each time
        // (no timestamp or name in the gzip header), so images built twice match.
        let file = Layer::file("/etc/motd", 0o644, vec![b'a'; 10_000]);
        assert_eq!(file.packed(true).blob, file.packed(true).blob);
    }

    #[test]
    fn compressible_layers_gzip_to_about_half_and_random_ones_do_not_shrink() {
        let size = 1024 * 1024;
        let compressible = Layer::compressible(5, size).packed(true);
        let ratio = compressible.blob.size as f64 / compressible.unpacked.size as f64;
        assert!((0.49..0.53).contains(&ratio), "compressible layer: gzip ratio {ratio}");
        let random = Layer::random(5, size).packed(true);
        // Only the tar's headers and end blocks shrink.
        assert!(
            random.blob.size * 100 >= random.unpacked.size * 99,
            "random layers stay incompressible"
        );
        let plain = Layer::compressible(5, size).packed(false);
        assert_eq!(plain.blob, plain.unpacked, "an uncompressed layer's blob is its tar");
        assert_eq!(plain.unpacked, compressible.unpacked);
    }

    #[test]
    fn repository_strips_the_tag_only() {
        assert_eq!(repository("docker.io/library/app:1"), "docker.io/library/app");
        assert_eq!(repository("localhost:5000/app"), "localhost:5000/app");
        assert_eq!(repository("localhost:5000/app:v2"), "localhost:5000/app");
    }
}

//! Image references: how a container's image string, a tag, a digest and an
//! id are matched to one another, and the glob patterns of `protect.images`.
//!
//! Runtimes differ in what they put where (containerd reports the image id in
//! `image_ref`, CRI-O has reported a repo digest; users write `nginx:1.27`
//! where the runtime lists `docker.io/library/nginx:1.27`). Matching errs on
//! the side of "same image": a false match keeps an image, a missed one could
//! remove an image in use.

use std::borrow::Cow;

/// The docker.io defaults applied to familiar names.
const DEFAULT_REGISTRY: &str = "docker.io";
const OFFICIAL_NAMESPACE: &str = "library";

/// Normalizes a reference to its fully qualified form:
/// `nginx` → `docker.io/library/nginx:latest`,
/// `user/app:1` → `docker.io/user/app:1`,
/// `ghcr.io/o/app@sha256:…` unchanged. Ids (`sha256:…`) are returned as is.
#[cfg(test)]
pub fn normalize(reference: &str) -> String {
    normalized(reference).into_owned()
}

/// [`normalize`], borrowing the reference when it is already fully
/// qualified: runtimes list tags and digests that way, so indexing them
/// allocates nothing.
pub fn normalized(reference: &str) -> Cow<'_, str> {
    let reference = reference.trim();
    if reference.is_empty() || is_id(reference) || is_qualified(reference) {
        return Cow::Borrowed(reference);
    }
    let (name, suffix) = split_name(reference);
    // Byte searches: the separators are ASCII, and this runs for every tag
    // and digest of every image each cycle.
    let qualified = match name.as_bytes().iter().position(|&b| b == b'/') {
        None => Cow::Owned(format!("{DEFAULT_REGISTRY}/{OFFICIAL_NAMESPACE}/{name}")),
        Some(slash) => {
            let first = &name.as_bytes()[..slash];
            if first.iter().any(|&b| b == b'.' || b == b':') || first == b"localhost" {
                Cow::Borrowed(name)
            } else {
                Cow::Owned(format!("{DEFAULT_REGISTRY}/{name}"))
            }
        }
    };
    let qualified = if qualified.starts_with("docker.io/") && qualified.matches('/').count() == 1 {
        // `docker.io/nginx` is also an official image.
        Cow::Owned(qualified.replacen("docker.io/", "docker.io/library/", 1))
    } else {
        qualified
    };
    match (qualified, suffix) {
        // The name needed nothing and the tag or digest is there: `name`
        // and `suffix` are the two halves of `reference`.
        (Cow::Borrowed(_), Some(_)) => Cow::Borrowed(reference),
        (qualified, Some(suffix)) => Cow::Owned(format!("{qualified}{suffix}")),
        (qualified, None) => Cow::Owned(format!("{qualified}:latest")),
    }
}

/// True when `reference` is already fully qualified, so that normalizing
/// it changes nothing: a registry host first (with a dot or a port, or
/// `localhost`; `docker.io` only with a namespace), then a tag or a digest.
/// The fast path of [`normalized`]: runtimes list names this way, and the
/// planner normalizes every tag and digest of every image each cycle.
fn is_qualified(reference: &str) -> bool {
    let bytes = reference.as_bytes();
    let Some(slash) = bytes.iter().position(|&b| b == b'/') else {
        return false;
    };
    let host = &bytes[..slash];
    if !(host.contains(&b'.') || host.contains(&b':') || host == b"localhost") {
        return false;
    }
    // The name ends at the first `@` (a digest follows).
    let at = memchr(b'@', bytes);
    if at.is_some_and(|at| at < slash) {
        return false;
    }
    let name = &bytes[..at.unwrap_or(bytes.len())];
    if host == b"docker.io" && !name[slash + 1..].contains(&b'/') {
        // `docker.io/nginx` is `docker.io/library/nginx`.
        return false;
    }
    if at.is_some() {
        return true;
    }
    // A tag: a colon after the last slash.
    for &b in bytes.iter().rev() {
        match b {
            b':' => return true,
            b'/' => return false,
            _ => {}
        }
    }
    false
}

/// The first position of `needle`; `<[u8]>::contains` and `position` on
/// bytes compile to a scan the optimizer vectorizes.
fn memchr(needle: u8, haystack: &[u8]) -> Option<usize> {
    if haystack.contains(&needle) {
        haystack.iter().position(|&b| b == needle)
    } else {
        None
    }
}

/// The familiar short form of a fully qualified reference, as people write it:
/// `docker.io/library/nginx:1` → `nginx:1`, `docker.io/user/app:1` → `user/app:1`.
pub fn familiar(reference: &str) -> &str {
    if let Some(rest) = reference.strip_prefix("docker.io/library/") {
        rest
    } else if let Some(rest) = reference.strip_prefix("docker.io/") {
        rest
    } else {
        reference
    }
}

/// True for image ids: `sha256:<64 hex>` or a bare 64-hex id (CRI-O).
pub fn is_id(reference: &str) -> bool {
    let hex = reference.strip_prefix("sha256:").unwrap_or(reference);
    // Without an early exit: ids are random hex, on which a per-byte branch
    // mispredicts about every other byte (this runs for every container's
    // image reference each cycle).
    hex.len() == 64 && hex.bytes().fold(true, |all, b| all & b.is_ascii_hexdigit())
}

/// An id in the one form imagegc uses everywhere: `sha256:<hex>`. CRI-O
/// lists bare hex; anything that is not an id is returned as it is.
pub fn canonical_id(id: String) -> String {
    if id.len() == 64 && is_id(&id) {
        format!("sha256:{id}")
    } else {
        id
    }
}

/// The digest of a digest reference, `sha256:<hex>`, whatever name stands
/// before the `@`: `reg:5000/app@sha256:…`, `app:1@sha256:…`, and CRI-O's
/// port-less `127.0.0.1@sha256:…` all give the digest itself. `None` for
/// anything without an `@` followed by a digest.
pub fn digest_of(reference: &str) -> Option<&str> {
    let at = memchr(b'@', reference.as_bytes())?;
    let digest = &reference[at + 1..];
    digest.starts_with("sha256:").then_some(digest)
}

/// The id without its `sha256:` prefix, for comparing ids across runtimes.
pub fn bare_id(id: &str) -> &str {
    id.strip_prefix("sha256:").unwrap_or(id)
}

/// Splits `name[:tag][@digest]` into the name and the `:tag`/`@digest` suffix.
fn split_name(reference: &str) -> (&str, Option<&str>) {
    // Byte searches: all three separators are ASCII. `contains` is a fast
    // scan, and most references (tags) have no digest.
    let bytes = reference.as_bytes();
    if let Some(at) = memchr(b'@', bytes) {
        return (&reference[..at], Some(&reference[at..]));
    }
    let last_slash = bytes.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
    match bytes[last_slash..].iter().rposition(|&b| b == b':') {
        Some(colon) => {
            let at = last_slash + colon;
            (&reference[..at], Some(&reference[at..]))
        }
        None => (reference, None),
    }
}

/// The repository of a tag or digest reference: `docker.io/library/nginx:1`
/// → `docker.io/library/nginx`; `localhost:5000/app:2` → `localhost:5000/app`.
pub fn repository(reference: &str) -> &str {
    split_name(reference).0
}

/// The repository a tag or digest reference names, normalized, the tag
/// left out: `nginx:1` → `docker.io/library/nginx`,
/// `reg:5000/app:1@sha256:…` → `reg:5000/app`. `None` for an image id or
/// nothing, which name no repository.
pub fn repository_of(reference: &str) -> Option<String> {
    let reference = reference.trim();
    if reference.is_empty() || is_id(reference) {
        return None;
    }
    let normalized = normalized(reference);
    let mut name = repository(&normalized);
    let last_slash = name.rfind('/').map_or(0, |i| i + 1);
    if let Some(colon) = name[last_slash..].rfind(':') {
        name = &name[..last_slash + colon];
    }
    (!name.is_empty()).then(|| name.to_owned())
}

/// Where a tag or digest reference is pulled from: its registry as written
/// (`docker.io`, `127.0.0.1:5000`), the repository's path in it
/// (`library/nginx`) and the tag or digest (`1.27`, `sha256:…`; `latest`
/// when none is given). `None` for an image id.
#[cfg(any(feature = "kubernetes", test))]
pub fn pull_parts(reference: &str) -> Option<(String, String, String)> {
    let reference = reference.trim();
    if reference.is_empty() || is_id(reference) {
        return None;
    }
    let normalized = normalized(reference);
    let (mut name, suffix) = split_name(&normalized);
    // `app:1@sha256:…`: the digest is what is pulled, the tag goes.
    let last_slash = name.rfind('/').map_or(0, |i| i + 1);
    if let Some(colon) = name[last_slash..].rfind(':') {
        name = &name[..last_slash + colon];
    }
    let (registry, path) = name.split_once('/')?;
    let tag_or_digest = match suffix {
        Some(suffix) => suffix[1..].to_owned(),
        None => "latest".to_owned(),
    };
    Some((registry.to_owned(), path.to_owned(), tag_or_digest))
}

/// A compiled `protect.images` pattern: `*` matches any run of characters
/// (slashes and colons included), `?` exactly one; everything else literally.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    pattern: String,
    /// Length of the literal text before the first wildcard: a quick
    /// rejection for most names.
    literal: usize,
}

impl Glob {
    pub fn new(pattern: &str) -> Self {
        Glob {
            pattern: pattern.to_string(),
            literal: pattern.find(['*', '?']).unwrap_or(pattern.len()),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.pattern
    }

    /// True when the pattern matches `text` whole.
    pub fn matches(&self, text: &str) -> bool {
        let pattern = self.pattern.as_bytes();
        text.as_bytes().starts_with(&pattern[..self.literal]) && glob_match(pattern, text.as_bytes())
    }

    /// True when the pattern matches the image's id (with or without the
    /// `sha256:` prefix), any tag or digest, or their familiar forms.
    pub fn matches_image<'n, N>(&self, id: &str, tags: N, digests: N) -> bool
    where
        N: IntoIterator<Item = &'n str> + Copy,
    {
        self.matches(id)
            || self.matches(bare_id(id))
            || tags
                .into_iter()
                .chain(digests)
                .any(|r| self.matches(r) || self.matches(familiar(r)))
    }
}

/// A `protect.images` pattern, read the way image names are read: a
/// familiar name is qualified (`nginx:*` → `docker.io/library/nginx:*`,
/// `bitnami/redis:*` → `docker.io/bitnami/redis:*`, `docker.io/nginx:*` →
/// `docker.io/library/nginx:*`), `index.docker.io` is `docker.io`, and a
/// repository with no tag or digest means every tag and digest of it
/// (`registry.k8s.io/kube-proxy` → `registry.k8s.io/kube-proxy:*` and
/// `…@*`). The pattern as written is matched too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtectPattern {
    globs: Vec<Glob>,
}

impl ProtectPattern {
    pub fn new(pattern: &str) -> Self {
        let forms = pattern_forms(pattern.trim());
        let mut globs: Vec<Glob> = Vec::with_capacity(forms.len() + 1);
        for form in std::iter::once(pattern.to_string()).chain(forms) {
            if !globs.iter().any(|g| g.as_str() == form) {
                globs.push(Glob::new(&form));
            }
        }
        ProtectPattern { globs }
    }

    /// True when any form matches the image (see [`Glob::matches_image`]).
    pub fn matches_image<'n, N>(&self, id: &str, tags: N, digests: N) -> bool
    where
        N: IntoIterator<Item = &'n str> + Copy,
    {
        self.globs.iter().any(|g| g.matches_image(id, tags, digests))
    }

    /// Why the pattern can match nothing a runtime reports (ids
    /// `sha256:<hex>`, tags `registry/repository:tag`, digests
    /// `registry/repository@sha256:<hex>`), when it cannot.
    pub fn problem(pattern: &str) -> Option<String> {
        let pattern = pattern.trim();
        if let Some(bad) = pattern
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || "._-/:@*?".contains(*c)))
        {
            return Some(format!(
                "{bad:?} appears in no image id, tag or digest: this pattern protects nothing"
            ));
        }
        if let Some(hex) = pattern.strip_prefix("sha256:") {
            if let Some(bad) = hex.chars().find(|c| !(c.is_ascii_hexdigit() || *c == '*' || *c == '?')) {
                return Some(format!(
                    "an image id is sha256: and hexadecimal digits; {bad:?} is not one: this pattern protects nothing"
                ));
            }
            if hex.chars().filter(char::is_ascii_hexdigit).count() > 64 {
                return Some("an image id has 64 hexadecimal digits; this pattern has more".to_string());
            }
            return None;
        }
        if let Some(at) = pattern.find('@') {
            let digest = &pattern[at + 1..];
            let literal = &digest[..digest.find(['*', '?']).unwrap_or(digest.len())];
            if !("sha256:".starts_with(literal) || literal.starts_with("sha256:")) {
                return Some(format!(
                    "the digest after @ must start with sha256: (runtimes report sha256 digests), not {digest:?}"
                ));
            }
        }
        // Repository names are lower case; tags may not be.
        let (name, _) = split_name(pattern);
        let path = name.split_once('/').map_or(name, |(first, rest)| {
            if first.contains(['.', ':']) || first == "localhost" {
                rest
            } else {
                name
            }
        });
        if path.chars().any(|c| c.is_ascii_uppercase()) {
            return Some(format!(
                "repository names are lower case, so {name:?} matches no image: this pattern protects nothing"
            ));
        }
        None
    }
}

/// The forms a pattern stands for beyond itself (see [`ProtectPattern`]).
fn pattern_forms(written: &str) -> Vec<String> {
    if written.is_empty() || written.starts_with("sha256:") || is_id(written) {
        return Vec::new();
    }
    let pattern = match written.strip_prefix("index.docker.io/") {
        Some(rest) => format!("docker.io/{rest}"),
        None => written.to_string(),
    };
    let (name, suffix) = split_name(&pattern);
    let mut names = vec![name.to_string()];
    let first = name.split('/').next().unwrap_or(name);
    // Qualify a familiar name, unless a wildcard stands where the registry
    // would (`*/nginx:*` is left as written).
    if !first.contains(['*', '?']) {
        let qualified = if !name.contains('/') {
            format!("{DEFAULT_REGISTRY}/{OFFICIAL_NAMESPACE}/{name}")
        } else if first.contains(['.', ':']) || first == "localhost" {
            name.to_string()
        } else {
            format!("{DEFAULT_REGISTRY}/{name}")
        };
        let qualified = match qualified.strip_prefix("docker.io/") {
            Some(rest) if !rest.contains('/') => format!("docker.io/library/{rest}"),
            _ => qualified,
        };
        if qualified != name {
            names.push(qualified);
        }
    }
    let mut forms = Vec::new();
    for name in names {
        match suffix {
            Some(suffix) => forms.push(format!("{name}{suffix}")),
            // A repository alone: every tag and digest of it.
            None => {
                forms.push(format!("{name}:*"));
                forms.push(format!("{name}@*"));
            }
        }
    }
    forms.retain(|f| f != written);
    forms
}

/// Iterative wildcard matching with single-star backtracking: linear in
/// practice, no recursion, no allocation.
fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && (pattern[p] == b'?' || pattern[p] == text[t]) {
            p += 1;
            t += 1;
        } else if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if let Some((sp, st)) = star {
            p = sp + 1;
            t = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    while p < pattern.len() && pattern[p] == b'*' {
        p += 1;
    }
    p == pattern.len()
}

#[cfg(test)]
mod tests {
    #[test]
    fn pull_parts_name_the_registry_the_path_and_what_is_pulled() {
        let parts = |r: &str| pull_parts(r).map(|(a, b, c)| format!("{a} {b} {c}"));
        assert_eq!(parts("nginx").as_deref(), Some("docker.io library/nginx latest"));
        assert_eq!(parts("user/app:1").as_deref(), Some("docker.io user/app 1"));
        assert_eq!(
            parts("127.0.0.1:5000/pull/big:2").as_deref(),
            Some("127.0.0.1:5000 pull/big 2")
        );
        assert_eq!(
            parts("localhost:5001/app").as_deref(),
            Some("localhost:5001 app latest")
        );
        let digest = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
        assert_eq!(
            parts(&format!("ghcr.io/o/app:1@{digest}")),
            Some(format!("ghcr.io o/app {digest}"))
        );
        assert_eq!(parts(digest), None);
        assert_eq!(parts(""), None);
    }

    use super::*;
    use crate::cri::Names;

    /// Whether `pattern` protects an image listed with these names.
    fn protects(pattern: &str, tag: &str) -> bool {
        let digest = format!(
            "{}@sha256:1111111111111111111111111111111111111111111111111111111111111111",
            repository(tag)
        );
        ProtectPattern::new(pattern).matches_image(
            "sha256:2222222222222222222222222222222222222222222222222222222222222222",
            &Names::from([tag]),
            &Names::from([digest.as_str()]),
        )
    }

    #[test]
    fn protect_patterns_are_read_as_image_names_are() {
        let nginx = "docker.io/library/nginx:1.27";
        for pattern in [
            "nginx",
            "nginx:*",
            "nginx:1.27",
            "docker.io/nginx:*",
            "docker.io/library/nginx",
            "index.docker.io/library/nginx:*",
            "library/nginx:*",
            "docker.io/library/nginx@sha256:*",
        ] {
            assert!(protects(pattern, nginx), "{pattern} protects {nginx}");
        }
        assert!(protects(
            "registry.k8s.io/kube-proxy",
            "registry.k8s.io/kube-proxy:v1.31.0"
        ));
        assert!(protects("bitnami/redis", "docker.io/bitnami/redis:7.4"));
        assert!(protects("localhost:5000/app", "localhost:5000/app:2"));
        assert!(protects("sha256:2222*", nginx), "ids as before");
        assert!(protects("2222*", nginx), "bare ids as before");
        // A repository means its own tags, not those of a longer name.
        assert!(!protects("nginx", "docker.io/library/nginx-unprivileged:1"));
        assert!(!protects(
            "registry.k8s.io/kube-proxy",
            "registry.k8s.io/kube-proxy-amd64:v1"
        ));
        assert!(!protects("bitnami/redis", "docker.io/library/redis:7"));
        assert!(!protects("nginx:1.26", nginx));
    }

    #[test]
    fn patterns_that_can_match_nothing_are_named() {
        for pattern in [
            "nginx latest",
            "sha256:xyz*",
            "docker.io/library/nginx@md5:*",
            "Nginx:*",
            "ghcr.io/Org/app",
        ] {
            assert!(ProtectPattern::problem(pattern).is_some(), "{pattern}");
        }
        for pattern in [
            "nginx",
            "registry.k8s.io/pause:*",
            "sha256:8238e0f45fe9*",
            "*",
            "nginx@sha*",
            "ghcr.io/org/app:Latest",
            "localhost:5000/app",
        ] {
            assert_eq!(ProtectPattern::problem(pattern), None, "{pattern}");
        }
    }

    #[test]
    fn normalizes_familiar_names() {
        assert_eq!(normalize("nginx"), "docker.io/library/nginx:latest");
        assert_eq!(normalize("nginx:1.27"), "docker.io/library/nginx:1.27");
        assert_eq!(normalize("user/app:1"), "docker.io/user/app:1");
        assert_eq!(normalize("docker.io/nginx:1"), "docker.io/library/nginx:1");
        assert_eq!(normalize("ghcr.io/o/app:2"), "ghcr.io/o/app:2");
        assert_eq!(normalize("localhost:5000/app"), "localhost:5000/app:latest");
        assert_eq!(normalize("localhost/app:3"), "localhost/app:3");
        assert_eq!(
            normalize("nginx@sha256:0123456789012345678901234567890123456789012345678901234567890123"),
            "docker.io/library/nginx@sha256:0123456789012345678901234567890123456789012345678901234567890123"
        );
        let id = "sha256:0123456789012345678901234567890123456789012345678901234567890123";
        assert_eq!(normalize(id), id);
    }

    /// The fast path agrees with the full normalization (written the plain
    /// way, as the oracle): what it calls qualified, normalizing leaves as
    /// is, and `normalized` gives the oracle's answer for every reference.
    #[test]
    fn the_qualified_fast_path_agrees_with_normalizing() {
        let parts = [
            "",
            "nginx",
            "docker.io",
            "docker.io/",
            "library",
            "localhost",
            "localhost:5000",
            "ghcr.io",
            "a.b",
            "user",
            "/",
            ":",
            "@",
            ":1",
            "@sha256:ab",
            "a@b",
            "x:y",
            " ",
        ];
        let mut checked = 0;
        for a in parts {
            for b in parts {
                for c in parts {
                    let reference = format!("{a}/{b}{c}");
                    for r in [reference.as_str(), &reference[1..], &format!("{a}{b}{c}")] {
                        let slow = {
                            // The full path, skipping the fast one.
                            let trimmed = r.trim();
                            if trimmed.is_empty() || is_id(trimmed) {
                                continue;
                            }
                            normalized_without_fast_path(trimmed)
                        };
                        assert_eq!(normalized(r), slow, "{r:?}");
                        if is_qualified(r.trim()) {
                            assert_eq!(slow, r.trim(), "{r:?} was taken as qualified");
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert!(checked > 100, "only {checked} qualified references were checked");
    }

    fn normalized_without_fast_path(reference: &str) -> String {
        let (name, suffix) = split_name(reference);
        let qualified = match name.split_once('/') {
            None => format!("{DEFAULT_REGISTRY}/{OFFICIAL_NAMESPACE}/{name}"),
            Some((first, _)) if !(first.contains('.') || first.contains(':') || first == "localhost") => {
                format!("{DEFAULT_REGISTRY}/{name}")
            }
            Some(_) => name.to_string(),
        };
        let qualified = if qualified.starts_with("docker.io/") && qualified.matches('/').count() == 1 {
            qualified.replacen("docker.io/", "docker.io/library/", 1)
        } else {
            qualified
        };
        match suffix {
            Some(suffix) => format!("{qualified}{suffix}"),
            None => format!("{qualified}:latest"),
        }
    }

    #[test]
    fn fully_qualified_references_are_borrowed() {
        for reference in [
            "docker.io/library/nginx:1.27",
            "ghcr.io/o/app:2",
            "localhost:5000/app:1",
            "registry.example.com/team-1/app-2@sha256:0123456789012345678901234567890123456789012345678901234567890123",
            "sha256:0123456789012345678901234567890123456789012345678901234567890123",
        ] {
            assert!(
                matches!(normalized(reference), Cow::Borrowed(r) if r == reference),
                "{reference}"
            );
        }
        for reference in [
            "nginx",
            "nginx:1",
            "user/app:1",
            "docker.io/nginx:1",
            "ghcr.io/o/app",
            " ghcr.io/o/app:2 ",
        ] {
            assert_eq!(normalized(reference), normalize(reference), "{reference}");
        }
        assert!(matches!(
            normalized(" ghcr.io/o/app:2 "),
            Cow::Borrowed("ghcr.io/o/app:2")
        ));
        assert!(matches!(normalized("docker.io/nginx:1"), Cow::Owned(_)));
    }

    #[test]
    fn repositories() {
        assert_eq!(repository("docker.io/library/nginx:1"), "docker.io/library/nginx");
        assert_eq!(repository("localhost:5000/app:2"), "localhost:5000/app");
        assert_eq!(repository("localhost:5000/app"), "localhost:5000/app");
        assert_eq!(repository("ghcr.io/o/app@sha256:abc"), "ghcr.io/o/app");
    }

    #[test]
    fn familiar_forms() {
        assert_eq!(familiar("docker.io/library/nginx:1"), "nginx:1");
        assert_eq!(familiar("docker.io/user/app:1"), "user/app:1");
        assert_eq!(familiar("ghcr.io/o/app:1"), "ghcr.io/o/app:1");
    }

    #[test]
    fn globs() {
        let g = Glob::new("registry.k8s.io/*");
        assert!(g.matches("registry.k8s.io/pause:3.9"));
        assert!(!g.matches("docker.io/library/nginx:1"));
        assert!(Glob::new("*:v?").matches("x/y:v1"));
        assert!(!Glob::new("*:v?").matches("x/y:v10"));
        assert!(Glob::new("*").matches(""));
        assert!(Glob::new("a*b*c").matches("aXXbYYc"));
        assert!(!Glob::new("a*b*c").matches("aXXbYY"));
        assert!(Glob::new("exact").matches("exact"));
        assert!(!Glob::new("exact").matches("exactly"));
    }

    #[test]
    fn globs_match_images_by_familiar_name_and_bare_id() {
        let tags = Names::from(["docker.io/library/nginx:1.27"]);
        let none = Names::default();
        let id = "sha256:0123456789012345678901234567890123456789012345678901234567890123";
        assert!(Glob::new("nginx:*").matches_image(id, &tags, &none));
        assert!(Glob::new("docker.io/library/nginx:1.27").matches_image(id, &tags, &none));
        assert!(Glob::new("0123456789*").matches_image(id, &tags, &none));
        assert!(!Glob::new("redis:*").matches_image(id, &tags, &none));
    }
}

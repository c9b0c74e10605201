//! How a runtime speaks where the CRI leaves it open ([`Dialect`]): decided
//! once, from its `Version` answer, here and nowhere else. The policy and
//! the engine read what a dialect says (an image's size as its compressed
//! content or as the layers stored), never a runtime's name.

/// What imagegc knows of a runtime beyond the CRI's messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dialect {
    /// The runtime's name, as its `Version` call gives it.
    name: String,
    /// See [`Dialect::reports_compressed`].
    reports_compressed: bool,
}

impl Dialect {
    /// The dialect of the runtime whose `Version` call names it `name`
    /// (`containerd`, `cri-o`, `docker`, ...): a name not known speaks as
    /// a runtime that reports what it stores.
    pub fn of(name: &str) -> Self {
        Dialect {
            name: name.to_string(),
            reports_compressed: name.eq_ignore_ascii_case("containerd"),
        }
    }

    /// The runtime's name, as its `Version` call gives it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether an image's size is its compressed content (containerd,
    /// which keeps that content beside the unpacked snapshot, on the same
    /// filesystem), not the unpacked layers the runtime stores (CRI-O,
    /// cri-dockerd).
    pub fn reports_compressed(&self) -> bool {
        self.reports_compressed
    }
}

impl Default for Dialect {
    /// A runtime not named yet: as one that reports what it stores.
    fn default() -> Self {
        Dialect::of("")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containerd_alone_reports_compressed_content() {
        assert!(Dialect::of("containerd").reports_compressed());
        assert!(Dialect::of("Containerd").reports_compressed());
        assert!(!Dialect::of("cri-o").reports_compressed());
        assert!(!Dialect::of("docker").reports_compressed());
        assert!(!Dialect::default().reports_compressed());
    }
}

//! What an image takes on the image filesystem per byte the runtime
//! reports for it ([`DiskFootprint`]), and the per-thousand arithmetic the
//! policy sizes with.

use crate::model::Dialect;

/// How many bytes of the image filesystem an image takes per byte of the
/// size the runtime reports for it. containerd reports the compressed size
/// of an image's content, and keeps on the same filesystem both that content
/// and the unpacked snapshot, which is at least as large: at least twice the
/// reported size. CRI-O (and cri-dockerd) report the unpacked size of the
/// layers they store: once. Measured removals that free more per reported
/// byte raise the factor; it never drops below the runtime's own, so that
/// the verdict "images cannot bring usage to low" is given only when even
/// this generous estimate of what images hold says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskFootprint {
    /// On-disk bytes per reported byte, in thousandths.
    permille: u64,
    /// The runtime's own factor: the floor.
    floor: u64,
}

/// The most a measured removal may raise the factor to (8 on-disk bytes per
/// reported byte): a removal that frees far more than its image (someone
/// else deleted data meanwhile) must not make every image look huge.
const FOOTPRINT_CAP_PERMILLE: u64 = 8_000;

impl DiskFootprint {
    /// The factor for a runtime of `dialect`: twice for one that reports
    /// an image's compressed content, once for the others.
    pub fn for_dialect(dialect: &Dialect) -> Self {
        let permille = if dialect.reports_compressed() { 2_000 } else { 1_000 };
        DiskFootprint {
            permille,
            floor: permille,
        }
    }

    /// A measured removal of an image the runtime reported at `reported`
    /// bytes freed `freed` bytes: the factor rises to what it shows.
    pub fn learn(&mut self, reported: u64, freed: u64) {
        let Some(seen) = permille_of(freed, reported) else {
            return;
        };
        self.permille = self.permille.max(seen.min(FOOTPRINT_CAP_PERMILLE)).max(self.floor);
    }

    /// What measured removals raised the factor to, for the state file:
    /// `(the runtime's own factor, the factor)` in thousandths; `None`
    /// while it is the runtime's own.
    pub fn learnt(&self) -> Option<(u64, u64)> {
        (self.permille > self.floor).then_some((self.floor, self.permille))
    }

    /// Takes back a factor measured removals raised before (see
    /// [`DiskFootprint::learnt`]), for a runtime of the same kind only (the
    /// same own factor): a node whose runtime changed starts afresh.
    pub fn restore(&mut self, (floor, permille): (u64, u64)) {
        if floor == self.floor {
            self.permille = self.permille.max(permille.min(FOOTPRINT_CAP_PERMILLE));
        }
    }

    /// Whether the runtime reports an image's compressed content
    /// (containerd), not the unpacked layers it stores (CRI-O,
    /// cri-dockerd).
    pub fn reports_compressed(&self) -> bool {
        self.floor >= 2_000
    }

    /// The bytes an image of `reported` bytes may take on disk.
    pub fn on_disk(&self, reported: u64) -> u64 {
        times_permille(reported, self.permille)
    }

    /// On-disk bytes per reported byte.
    pub fn factor(&self) -> f64 {
        self.permille as f64 / 1000.0
    }
}

/// `bytes` times `permille` thousandths, saturating.
pub(crate) fn times_permille(bytes: u64, permille: u64) -> u64 {
    (u128::from(bytes) * u128::from(permille) / 1000).min(u128::from(u64::MAX)) as u64
}

/// How many thousandths of `per` `of` is, saturating; `None` when `per`
/// is 0.
pub(crate) fn permille_of(of: u64, per: u64) -> Option<u64> {
    (per != 0).then(|| (u128::from(of) * 1000 / u128::from(per)).min(u128::from(u64::MAX)) as u64)
}

impl Default for DiskFootprint {
    /// Once: the factor of a runtime that reports what it stores.
    fn default() -> Self {
        DiskFootprint::for_dialect(&Dialect::default())
    }
}

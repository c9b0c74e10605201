//! Shared layers, counted once: what removing an image frees when other
//! images hold some of its layers.
//!
//! The runtime reports each image's size with its shared layers counted in
//! every image that has them (containerd and CRI-O alike), so reported
//! sizes add up to more than the disk holds, and removing an image whose
//! base another image keeps frees only its own layers. Where the runtime
//! names an image's layers (the diff ids of its config, in the verbose
//! `ImageStatus`: see [`crate::cri::Runtime::image_layers`]), the
//! [`LayerBook`] keeps them, and [`Freeing`] estimates what each removal
//! frees: the layers no image left on disk holds.
//!
//! The runtime names the layers, not their sizes. The layers held by the
//! same images are freed together (a *block*); each image's on-disk bytes
//! (its reported size by the [`DiskFootprint`]) are the sum of its
//! blocks, and the blocks are sized by projections onto those sums from
//! zero, none negative (Kaczmarz's method: the minimum-norm split where it
//! converges; on a large group it gives the shared block nearly all).
//! Where imagegc measured what a removal freed, the layers it freed keep
//! that measure, and what it left behind is bounded by it (a [`Ghost`]):
//! see [`LayerBook::removed`]. An image whose layers are not known counts
//! whole, as before layers were read.
//!
//! Layers are kept by a 64-bit key of their digest ([`layer_key`]) and
//! images by one of their id: 8 bytes each instead of a 71-byte string, so
//! that a node of 100,000 images of several layers each costs a few MiB. Two
//! digests of one key would be one layer to the estimate: an estimate gone
//! wrong, never a removal, which the measured walk and the re-check decide.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::collections::{HashMap, HashSet};
use crate::model::Image;

use super::footprint::DiskFootprint;

/// A layer, by [`layer_key`].
pub type LayerKey = u64;

/// How many measured layers are remembered at most (the oldest go first).
pub const LEARNED_MAX: usize = 10_000;

/// How long a measured layer is remembered.
pub const LEARNED_FOR: Duration = Duration::from_secs(30 * 24 * 3600);

/// How many removed images' layer lists are kept at most (the oldest go
/// first; see [`Ghost`]).
pub const GHOSTS_MAX: usize = 1_000;

/// The key of a layer's digest: 64-bit FNV-1a, which never changes with a
/// dependency's version, so the keys the state file holds stay valid.
pub fn layer_key(digest: &str) -> LayerKey {
    fnv1a(digest.as_bytes(), 0xcbf2_9ce4_8422_2325)
}

/// The key of an image id (in memory only).
fn id_key(id: &str) -> u64 {
    fnv1a(id.as_bytes(), 0x84222325_cbf29ce4)
}

fn fnv1a(bytes: &[u8], basis: u64) -> u64 {
    bytes
        .iter()
        .fold(basis, |hash, &b| (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// A layer key as the state file writes it: 16 hex digits.
pub fn key_text(key: LayerKey) -> String {
    format!("{key:016x}")
}

/// A layer key from the state file; `None` for anything but 16 hex digits.
pub fn key_from_text(text: &str) -> Option<LayerKey> {
    (text.len() == 16 && text.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| u64::from_str_radix(text, 16).ok())
        .flatten()
}

/// A removed image whose layers other images still hold: its layers took
/// its bytes together, so what it left behind takes its bytes less what its
/// removal freed. One measured removal on a base so sizes the base for
/// every image on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ghost {
    /// Its layers.
    pub layers: Box<[LayerKey]>,
    /// The size the runtime reported for it.
    pub reported: u64,
    /// When it was removed.
    pub at: SystemTime,
}

/// What a measured removal showed a layer takes on disk, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Learned {
    /// On-disk bytes.
    pub bytes: u64,
    /// When it was measured.
    pub at: SystemTime,
}

/// The layers of the images the runtime named them for, and what measured
/// removals taught of their sizes.
#[derive(Debug, Clone, Default)]
pub struct LayerBook {
    /// Image id (by its key) to its layers, lowest first.
    images: HashMap<u64, Box<[LayerKey]>>,
    /// How many known images hold each layer.
    holders: HashMap<LayerKey, u32>,
    /// Layers a measured removal freed.
    learned: HashMap<LayerKey, Learned>,
    /// Removed images whose layers others still hold.
    ghosts: Vec<Ghost>,
    /// Whether `learned` or `ghosts` changed since
    /// [`LayerBook::take_learned_change`].
    learned_changed: bool,
}

impl LayerBook {
    /// Whether the layers of image `id` are known.
    pub fn knows(&self, id: &str) -> bool {
        self.images.contains_key(&id_key(id))
    }

    /// The layers of image `id`, when known.
    pub fn layers(&self, id: &str) -> Option<&[LayerKey]> {
        self.images.get(&id_key(id)).map(|layers| &layers[..])
    }

    /// How many images' layers are known.
    pub fn len(&self) -> usize {
        self.images.len()
    }

    /// True when no image's layers are known.
    pub fn is_empty(&self) -> bool {
        self.images.is_empty()
    }

    /// Notes that image `id` has `layers` (digests, lowest first). An
    /// image's layers never change (its id is its config's digest); a
    /// second note of the same image is ignored. A layer listed twice in
    /// one image (an empty layer repeated) is held once.
    pub fn insert(&mut self, id: &str, layers: &[String]) {
        if self.knows(id) {
            return;
        }
        let mut own: Vec<LayerKey> = Vec::with_capacity(layers.len());
        for key in layers.iter().map(|layer| layer_key(layer)) {
            if !own.contains(&key) {
                *self.holders.entry(key).or_insert(0) += 1;
                own.push(key);
            }
        }
        self.images.insert(id_key(id), own.into());
    }

    /// Forgets image `id` (gone), releasing its layers.
    pub fn forget(&mut self, id: &str) {
        self.forget_key(id_key(id));
    }

    fn forget_key(&mut self, key: u64) {
        let Some(layers) = self.images.remove(&key) else {
            return;
        };
        for layer in &layers {
            if let Some(count) = self.holders.get_mut(layer) {
                *count -= 1;
                if *count == 0 {
                    self.holders.remove(layer);
                }
            }
        }
    }

    /// Keeps only the images of `listed` (ids).
    pub fn retain<'i>(&mut self, listed: impl IntoIterator<Item = &'i str>) {
        let listed: HashSet<u64> = listed.into_iter().map(id_key).collect();
        let gone: Vec<u64> = self
            .images
            .keys()
            .filter(|key| !listed.contains(key))
            .copied()
            .collect();
        for key in gone {
            self.forget_key(key);
        }
    }

    /// The layers removing image `id` frees now: its layers no other known
    /// image holds.
    pub fn freed_by(&self, id: &str) -> Vec<LayerKey> {
        self.layers(id)
            .unwrap_or_default()
            .iter()
            .filter(|layer| self.holders.get(*layer) == Some(&1))
            .copied()
            .collect()
    }

    /// Image `id`, reported at `reported` bytes, was removed and that
    /// freed `freed` bytes, measured at `now`: the layers it freed take
    /// those bytes (the ones not measured before share what the measured
    /// ones leave; when all were, they are scaled to it); when other images
    /// hold some of its layers, it stays as a [`Ghost`]; and the image is
    /// forgotten.
    pub fn removed(&mut self, id: &str, reported: u64, freed: u64, now: SystemTime) {
        let freed_layers = self.freed_by(id);
        if !freed_layers.is_empty() {
            self.learn(&freed_layers, freed, now);
        }
        if let Some(layers) = self.layers(id)
            && freed_layers.len() < layers.len()
        {
            let ghost = Ghost {
                layers: layers.into(),
                reported,
                at: now,
            };
            self.ghosts.push(ghost);
            self.learned_changed = true;
            self.bound_ghosts(now);
        }
        self.forget(id);
    }

    fn learn(&mut self, layers: &[LayerKey], freed: u64, now: SystemTime) {
        let known_bytes = layers
            .iter()
            .filter_map(|l| self.learned.get(l))
            .fold(0u64, |sum, learned| sum.saturating_add(learned.bytes));
        let unknown: Vec<LayerKey> = layers
            .iter()
            .copied()
            .filter(|l| !self.learned.contains_key(l))
            .collect();
        if unknown.is_empty() {
            for layer in layers {
                if let Some(learned) = self.learned.get_mut(layer) {
                    let scaled = u128::from(learned.bytes) * u128::from(freed) / u128::from(known_bytes.max(1));
                    *learned = Learned {
                        bytes: scaled.min(u128::from(u64::MAX)) as u64,
                        at: now,
                    };
                }
            }
        } else {
            let each = freed.saturating_sub(known_bytes) / unknown.len() as u64;
            for layer in unknown {
                self.learned.insert(layer, Learned { bytes: each, at: now });
            }
        }
        self.learned_changed = true;
        self.bound_learned(now);
    }

    /// Whether a measured removal taught something that
    /// [`LayerBook::save_into`] has not handed on yet.
    pub fn learned_changed(&self) -> bool {
        self.learned_changed
    }

    /// Forgets measured layers past [`LEARNED_FOR`], then the oldest past
    /// [`LEARNED_MAX`].
    fn bound_learned(&mut self, now: SystemTime) {
        self.learned
            .retain(|_, learned| now.duration_since(learned.at).unwrap_or_default() <= LEARNED_FOR);
        if self.learned.len() > LEARNED_MAX {
            let mut by_age: Vec<(SystemTime, LayerKey)> = self.learned.iter().map(|(k, l)| (l.at, *k)).collect();
            by_age.sort_unstable();
            let extra = self.learned.len() - LEARNED_MAX;
            for (_, key) in by_age.into_iter().take(extra) {
                self.learned.remove(&key);
            }
        }
    }

    /// Forgets ghosts past [`LEARNED_FOR`], then the oldest past
    /// [`GHOSTS_MAX`].
    fn bound_ghosts(&mut self, now: SystemTime) {
        self.ghosts
            .retain(|ghost| now.duration_since(ghost.at).unwrap_or_default() <= LEARNED_FOR);
        if self.ghosts.len() > GHOSTS_MAX {
            self.ghosts.sort_by_key(|ghost| std::cmp::Reverse(ghost.at));
            self.ghosts.truncate(GHOSTS_MAX);
        }
    }

    /// Forgets ghosts none of whose layers an image holds: they bound
    /// nothing on disk. Called once every listed image's layers are known
    /// (or known to be untold).
    pub fn drop_idle_ghosts(&mut self) {
        let before = self.ghosts.len();
        let holders = &self.holders;
        self.ghosts
            .retain(|ghost| ghost.layers.iter().any(|layer| holders.contains_key(layer)));
        if self.ghosts.len() != before {
            self.learned_changed = true;
        }
    }

    /// The ghosts.
    #[cfg(test)]
    fn ghosts(&self) -> &[Ghost] {
        &self.ghosts
    }

    /// Restores ghosts (from the state file: layer keys as
    /// [`key_text`] writes them, reported size, when), bounded as
    /// [`LayerBook::removed`] bounds them; a key that does not parse is
    /// left out. Those none of whose layers an image holds go once every
    /// image's layers are known.
    fn restore_ghosts(&mut self, ghosts: impl IntoIterator<Item = (Vec<String>, u64, SystemTime)>, now: SystemTime) {
        for (layers, reported, at) in ghosts {
            let layers: Box<[LayerKey]> = layers.iter().filter_map(|l| key_from_text(l)).collect();
            if !layers.is_empty() {
                self.ghosts.push(Ghost { layers, reported, at });
            }
        }
        self.bound_ghosts(now);
    }

    /// The measured layers.
    #[cfg(test)]
    fn learned(&self) -> impl Iterator<Item = (LayerKey, Learned)> + '_ {
        self.learned.iter().map(|(layer, learned)| (*layer, *learned))
    }

    /// What is measured of the layer of this digest, if anything.
    pub fn learned_of(&self, digest: &str) -> Option<Learned> {
        self.learned.get(&layer_key(digest)).copied()
    }

    /// Restores measured layers (from the state file: keys as
    /// [`key_text`] writes them), bounded as [`LayerBook::removed`] bounds
    /// them; a key that does not parse is left out.
    fn restore_learned(&mut self, learned: impl IntoIterator<Item = (String, Learned)>, now: SystemTime) {
        let mut learned: Vec<(LayerKey, Learned)> = learned
            .into_iter()
            .filter_map(|(key, learned)| Some((key_from_text(&key)?, learned)))
            .collect();
        if learned.len() > LEARNED_MAX {
            learned.sort_unstable_by_key(|(_, l)| std::cmp::Reverse(l.at));
            learned.truncate(LEARNED_MAX);
        }
        self.learned.extend(learned);
        self.bound_learned(now);
    }

    /// A book with what `records` saved of measured layers and ghosts (see
    /// [`LayerBook::save_into`]), as of `now`: no image's layers yet.
    pub fn restored(records: &crate::records::Records, now: SystemTime) -> Self {
        let mut book = LayerBook::default();
        book.restore_learned(
            records
                .layer_sizes()
                .map(|(key, bytes, at)| (key.to_string(), Learned { bytes, at })),
            now,
        );
        book.restore_ghosts(records.layer_ghosts().iter().cloned(), now);
        book
    }

    /// Hands what measured removals taught (measured layers and ghosts)
    /// to `records`, which the state file saves, when it changed since the
    /// last time.
    pub fn save_into(&mut self, records: &mut crate::records::Records) {
        if !std::mem::take(&mut self.learned_changed) {
            return;
        }
        records.set_layer_sizes(
            self.learned
                .iter()
                .map(|(key, learned)| (key_text(*key), learned.bytes, learned.at)),
        );
        records.set_layer_ghosts(
            self.ghosts
                .iter()
                .map(|ghost| {
                    (
                        ghost.layers.iter().copied().map(key_text).collect(),
                        ghost.reported,
                        ghost.at,
                    )
                })
                .collect(),
        );
    }

    /// What removals of the images of `images` (a listing) free, by
    /// `footprint` (see [`Freeing`]).
    pub fn freeing(&self, images: &[Image], footprint: DiskFootprint) -> Freeing {
        Freeing::new(self, images, footprint)
    }
}

/// How many rounds of projections the estimate makes at most; it stops
/// sooner once every image's blocks add up to its bytes within
/// [`CLOSE_ENOUGH`].
const ROUNDS: usize = 40;
/// Relative error at which the estimate stops.
const CLOSE_ENOUGH: f64 = 1e-4;

/// The layers of one listing by block, sized (see the module docs).
#[derive(Debug, Default)]
struct Blocks {
    /// Image id (by its key) to its row.
    index: HashMap<u64, u32>,
    /// Each row's blocks.
    rows: Vec<Vec<u32>>,
    /// Each block's on-disk bytes.
    bytes: Vec<u64>,
    /// How many rows hold each block.
    holders: Vec<u32>,
}

/// What removals free, one after the other, by the estimate: a walk that
/// cannot wait to measure (`plan`, a dry run, a hurry past the kubelet's
/// eviction line) counts each removal by [`Freeing::release`]. Cheap to
/// clone: the sized blocks are shared, and only what was released is
/// copied.
#[derive(Debug, Clone, Default)]
pub struct Freeing {
    footprint: DiskFootprint,
    blocks: Arc<Blocks>,
    /// Rows released so far.
    released: HashSet<u32>,
    /// Blocks some release touched, with the rows still holding them.
    remaining: HashMap<u32, u32>,
}

impl Freeing {
    /// Every image counted whole, by `footprint`: no layers known.
    pub fn whole(footprint: DiskFootprint) -> Self {
        Freeing {
            footprint,
            ..Freeing::default()
        }
    }

    /// The blocks of `images` whose layers `book` knows, sized. The
    /// ghosts' rows come after the images' (they bound sizes; releasing
    /// frees nothing of theirs): layers held alike by images and ghosts are
    /// one block.
    fn new(book: &LayerBook, images: &[Image], footprint: DiskFootprint) -> Self {
        if book.is_empty() {
            return Freeing::whole(footprint);
        }
        let mut rows = Rows::of_images(book, images, footprint);
        rows.add_ghosts(book, footprint);
        let listed = rows.listed;
        let Grouped {
            mut constraints,
            fixed,
            open,
            holders,
        } = rows.group(book);
        let bytes = solve(&constraints, &rows.sizes, &rows.extra, &fixed, &open);
        constraints.truncate(listed as usize);
        Freeing {
            footprint,
            blocks: Arc::new(Blocks {
                index: rows.index,
                rows: constraints,
                bytes,
                holders,
            }),
            released: HashSet::default(),
            remaining: HashMap::default(),
        }
    }

    /// Removes image `id` (reported at `size` bytes) from the estimate and
    /// returns the on-disk bytes that frees: its blocks no image left
    /// holds; the whole image by the footprint when its layers are not
    /// known; nothing for an image already released.
    pub fn release(&mut self, id: &str, size: u64) -> u64 {
        let Some(&row) = self.blocks.index.get(&id_key(id)) else {
            return self.footprint.on_disk(size);
        };
        if !self.released.insert(row) {
            return 0;
        }
        let blocks = Arc::clone(&self.blocks);
        let mut freed = 0u64;
        for &block in &blocks.rows[row as usize] {
            let left = self.remaining.entry(block).or_insert(blocks.holders[block as usize]);
            *left = left.saturating_sub(1);
            if *left == 0 {
                freed = freed.saturating_add(blocks.bytes[block as usize]);
            }
        }
        freed
    }

    /// What removing image `id` (reported at `size`) would free now,
    /// without removing it.
    pub fn would_free(&self, id: &str, size: u64) -> u64 {
        self.clone().release(id, size)
    }
}

/// The rows of the estimate: one per listed image whose layers are known,
/// then one per ghost holding a layer of theirs, each with the on-disk
/// bytes its blocks add up to.
struct Rows {
    /// Image id (by its key) to its row.
    index: HashMap<u64, u32>,
    /// Each row's on-disk bytes.
    sizes: Vec<u64>,
    /// Each row's bytes measured outside its blocks (a ghost's layers no
    /// image holds any more).
    extra: Vec<u64>,
    /// How many rows are listed images (the ghosts' come after).
    listed: u32,
    /// (layer, row) for every layer of every row, sorted: each layer's
    /// rows side by side, in order.
    held: Vec<(LayerKey, u32)>,
}

/// The blocks the rows' layers form (see [`Rows::group`]).
struct Grouped {
    /// Each row's blocks.
    constraints: Vec<Vec<u32>>,
    /// Each block's measured bytes.
    fixed: Vec<u64>,
    /// Whether a block has a layer not measured.
    open: Vec<bool>,
    /// How many listed images hold each block.
    holders: Vec<u32>,
}

impl Rows {
    /// A row for each image of `images` whose layers `book` knows.
    fn of_images(book: &LayerBook, images: &[Image], footprint: DiskFootprint) -> Self {
        let mut rows = Rows {
            index: HashMap::default(),
            sizes: Vec::new(),
            extra: Vec::new(),
            listed: 0,
            held: Vec::new(),
        };
        for image in images {
            let key = id_key(&image.id);
            let Some(layers) = book.images.get(&key) else {
                continue;
            };
            if rows.index.contains_key(&key) {
                continue;
            }
            let row = rows.sizes.len() as u32;
            rows.index.insert(key, row);
            rows.sizes.push(footprint.on_disk(image.size));
            rows.held.extend(layers.iter().map(|&layer| (layer, row)));
        }
        rows.listed = rows.sizes.len() as u32;
        rows.extra = vec![0; rows.sizes.len()];
        rows.held.sort_unstable();
        rows
    }

    /// A row for each ghost that holds a layer of a listed image: its
    /// reported bytes bound the blocks it shares, less what its layers no
    /// image holds were measured to free.
    fn add_ghosts(&mut self, book: &LayerBook, footprint: DiskFootprint) {
        let held = &self.held;
        let is_held = |layer: &LayerKey| held.binary_search_by_key(layer, |&(l, _)| l).is_ok();
        let mut ghosts_held: Vec<(LayerKey, u32)> = Vec::new();
        for ghost in &book.ghosts {
            let row = self.sizes.len() as u32;
            let mut holds = false;
            let mut measured = 0u64;
            for layer in &ghost.layers {
                if is_held(layer) {
                    holds = true;
                    ghosts_held.push((*layer, row));
                } else {
                    measured = measured.saturating_add(book.learned.get(layer).map_or(0, |l| l.bytes));
                }
            }
            if holds {
                self.sizes.push(footprint.on_disk(ghost.reported));
                self.extra.push(measured);
            }
        }
        self.held.extend(ghosts_held);
        self.held.sort_unstable();
        self.held.dedup();
    }

    /// The blocks: layers held by the same rows are one block, its bytes
    /// measured where `book` learnt them.
    fn group(&self, book: &LayerBook) -> Grouped {
        // The runs of rows, each borrowed from `held`, name the blocks.
        let mut block_of: HashMap<Vec<u32>, u32> = HashMap::default();
        let mut own_block: HashMap<u32, u32> = HashMap::default();
        let mut grouped = Grouped {
            constraints: vec![Vec::new(); self.sizes.len()],
            fixed: Vec::new(),
            open: Vec::new(),
            holders: Vec::new(),
        };
        let mut rows_of_layer: Vec<u32> = Vec::new();
        for run in self.held.chunk_by(|a, b| a.0 == b.0) {
            let layer = run[0].0;
            rows_of_layer.clear();
            rows_of_layer.extend(run.iter().map(|&(_, row)| row));
            // Most layers are one image's own: found by that row alone.
            let found = match rows_of_layer[..] {
                [row] => own_block.get(&row).copied(),
                _ => block_of.get(&rows_of_layer).copied(),
            };
            let block = match found {
                Some(block) => block,
                None => {
                    let block = grouped.fixed.len() as u32;
                    match rows_of_layer[..] {
                        [row] => _ = own_block.insert(row, block),
                        _ => _ = block_of.insert(rows_of_layer.clone(), block),
                    }
                    grouped.fixed.push(0);
                    grouped.open.push(false);
                    grouped
                        .holders
                        .push(rows_of_layer.iter().filter(|&&row| row < self.listed).count() as u32);
                    for &row in &rows_of_layer {
                        grouped.constraints[row as usize].push(block);
                    }
                    block
                }
            };
            match book.learned.get(&layer) {
                Some(learned) => {
                    grouped.fixed[block as usize] = grouped.fixed[block as usize].saturating_add(learned.bytes);
                }
                None => grouped.open[block as usize] = true,
            }
        }
        grouped
    }
}

/// The blocks' bytes: each row's blocks (and its `extra` bytes, measured
/// outside them) add up to its size, blocks with a measured part (`fixed`)
/// no smaller than it, blocks without an unmeasured layer (`open` false)
/// exactly it, none negative; otherwise as small as can be (projections
/// from zero, a row at a time).
fn solve(rows: &[Vec<u32>], sizes: &[u64], extra_bytes: &[u64], fixed: &[u64], open: &[bool]) -> Vec<u64> {
    let mut extra = vec![0f64; fixed.len()];
    let free_blocks: Vec<Vec<u32>> = rows
        .iter()
        .map(|blocks| blocks.iter().copied().filter(|&b| open[b as usize]).collect())
        .collect();
    let fixed_sums: Vec<f64> = rows
        .iter()
        .zip(extra_bytes)
        .map(|(blocks, &outside)| outside as f64 + blocks.iter().map(|&b| fixed[b as usize] as f64).sum::<f64>())
        .collect();
    for _ in 0..ROUNDS {
        let mut worst = 0f64;
        for (row, free) in free_blocks.iter().enumerate() {
            let size = sizes[row] as f64;
            if free.is_empty() || size <= 0.0 {
                continue;
            }
            let have: f64 = fixed_sums[row] + free.iter().map(|&b| extra[b as usize]).sum::<f64>();
            let off = size - have;
            worst = worst.max(off.abs() / size);
            let step = off / free.len() as f64;
            for &b in free {
                extra[b as usize] = (extra[b as usize] + step).max(0.0);
            }
        }
        if worst < CLOSE_ENOUGH {
            break;
        }
    }
    fixed
        .iter()
        .zip(&extra)
        .map(|(&f, &x)| f.saturating_add(x.round().clamp(0.0, u64::MAX as f64) as u64))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Dialect;
    use crate::testing::library_image;

    const MIB: u64 = 1 << 20;

    fn digest(name: &str) -> String {
        let mut hex = String::new();
        for b in name.bytes().cycle().take(32) {
            hex.push_str(&format!("{b:02x}"));
        }
        format!("sha256:{hex}")
    }

    /// Within a thousandth: the estimate stops at [`CLOSE_ENOUGH`].
    fn close(got: u64, want: u64) {
        assert!(got.abs_diff(want) <= want / 1000, "{got} against {want}");
    }

    fn book(images: &[(&str, &[&str])]) -> LayerBook {
        let mut book = LayerBook::default();
        for (id, layers) in images {
            book.insert(id, &layers.iter().map(|l| digest(l)).collect::<Vec<_>>());
        }
        book
    }

    /// Two images on one base: removing the first frees its own layer
    /// only, the second frees the base with its own; the two add up to what
    /// both take on disk, counted once.
    #[test]
    fn a_shared_base_is_freed_by_the_last_image_that_holds_it() {
        let book = book(&[("a", &["base", "a"]), ("b", &["base", "b"])]);
        let images = [library_image("a", 60 * MIB), library_image("b", 60 * MIB)];
        let mut freeing = book.freeing(&images, DiskFootprint::default());
        // Minimum norm: base 40, a 20, b 20 MiB.
        close(freeing.release("a", 60 * MIB), 20 * MIB);
        close(freeing.release("b", 60 * MIB), 60 * MIB);
        assert_eq!(freeing.release("b", 60 * MIB), 0, "released once");
    }

    /// An image whose layers are not known counts whole, by the footprint;
    /// one with no layer of its own frees nothing while its base stays.
    #[test]
    fn unknown_images_count_whole_and_an_image_of_shared_layers_only_frees_nothing() {
        let book = book(&[("base", &["base"]), ("app", &["base", "app"])]);
        let images = [
            library_image("base", 50 * MIB),
            library_image("app", 70 * MIB),
            library_image("other", 10 * MIB),
        ];
        let mut freeing = book.freeing(&images, DiskFootprint::for_dialect(&Dialect::of("containerd")));
        assert_eq!(freeing.would_free("other", 10 * MIB), 20 * MIB);
        assert_eq!(freeing.release("base", 50 * MIB), 0, "the app holds the base");
        assert_eq!(freeing.release("app", 70 * MIB), 140 * MIB);
        assert_eq!(Freeing::whole(DiskFootprint::default()).release("x", 7), 7);
    }

    /// A measured removal sizes the layers it freed; when the same layer
    /// is on disk again (pulled back), the estimate counts it at that size
    /// and the rest of its image's bytes go to the others.
    #[test]
    fn a_measured_removal_sizes_the_layers_it_freed() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut book = book(&[("a", &["base", "a"]), ("b", &["base", "b"])]);
        assert_eq!(book.freed_by("a"), vec![layer_key(&digest("a"))]);
        book.removed("a", 60 * MIB, 25 * MIB, now);
        assert!(!book.knows("a"));
        assert_eq!(book.learned_of(&digest("a")).map(|l| l.bytes), Some(25 * MIB));
        // "b" now holds the base alone: removing it frees both its layers.
        assert_eq!(book.freed_by("b").len(), 2);
        book.insert("a", &[digest("base"), digest("a")]);
        let images = [library_image("a", 60 * MIB), library_image("b", 60 * MIB)];
        let mut freeing = book.freeing(&images, DiskFootprint::default());
        assert_eq!(freeing.would_free("a", 60 * MIB), 25 * MIB);
        // a = base + 25 → base 35, b = 60 - 35 = 25.
        close(freeing.release("b", 60 * MIB), 25 * MIB);
        close(freeing.release("a", 60 * MIB), 60 * MIB);
    }

    /// A removed image whose base another image keeps stays as a ghost:
    /// its bytes less what it freed are what the base takes, so the images
    /// still on the base split the rest by it, not by the smallest split.
    #[test]
    fn a_removal_that_left_its_base_behind_sizes_the_base() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut layers = book(&[("a", &["base", "a"]), ("b", &["base", "b"]), ("c", &["base", "c"])]);
        layers.removed("a", 60 * MIB, 25 * MIB, now);
        assert_eq!(layers.ghosts().len(), 1);
        let images = [library_image("b", 60 * MIB), library_image("c", 60 * MIB)];
        let mut freeing = layers.freeing(&images, DiskFootprint::default());
        // Without the ghost: base 40, b and c 20 each.
        close(freeing.release("b", 60 * MIB), 25 * MIB);
        close(freeing.release("c", 60 * MIB), 60 * MIB);
        // A ghost whose layers no image holds any more bounds nothing.
        layers.forget("b");
        layers.forget("c");
        layers.drop_idle_ghosts();
        assert!(layers.ghosts().is_empty());
        // One that freed everything it had is none.
        let mut book = book(&[("x", &["x"])]);
        book.removed("x", 10, 10, now);
        assert!(book.ghosts().is_empty());
    }

    /// Layers measured twice are scaled to the second measure; the memory
    /// is bounded in time and in count.
    #[test]
    fn measured_layers_are_rescaled_and_bounded() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(10_000_000);
        let mut book = book(&[("a", &["x", "y"])]);
        book.removed("a", 10 * MIB, 10 * MIB, t0);
        assert_eq!(book.learned_of(&digest("x")).map(|l| l.bytes), Some(5 * MIB));
        book.insert("a", &[digest("x"), digest("y")]);
        book.removed("a", 30 * MIB, 30 * MIB, t0);
        assert_eq!(book.learned_of(&digest("y")).map(|l| l.bytes), Some(15 * MIB));
        let later = t0 + LEARNED_FOR + Duration::from_secs(1);
        book.restore_learned([], later);
        assert_eq!(book.learned().count(), 0);
        let many = (0..LEARNED_MAX + 5).map(|i| {
            (
                key_text(layer_key(&format!("sha256:{i:064x}"))),
                Learned {
                    bytes: 1,
                    at: t0 + Duration::from_secs(i as u64),
                },
            )
        });
        book.restore_learned(many, t0 + Duration::from_secs(LEARNED_MAX as u64 + 10));
        assert_eq!(book.learned().count(), LEARNED_MAX);
        assert!(
            book.learned_of(&format!("sha256:{:064x}", 0)).is_none(),
            "the oldest go first"
        );
        assert!(book.learned_of(&format!("sha256:{:064x}", LEARNED_MAX + 4)).is_some());
        // What is not a key the state file wrote is left out.
        book.restore_learned([("sha256:abc".to_string(), Learned { bytes: 1, at: t0 })], t0);
        assert_eq!(book.learned().count(), LEARNED_MAX);
        assert_eq!(key_from_text(&key_text(u64::MAX)), Some(u64::MAX));
        for bad in ["", "0123", "0123456789abcdeg", "+123456789abcdef", "0123456789abcdef0"] {
            assert_eq!(key_from_text(bad), None, "{bad}");
        }
    }

    /// The book holds a layer once however many images share it, and lets
    /// go of it with the last.
    #[test]
    fn layers_are_held_once_and_released_with_the_last_image() {
        let mut book = book(&[("a", &["base", "a", "a"]), ("b", &["base", "b"])]);
        assert_eq!(book.layers("a").map(<[LayerKey]>::len), Some(2));
        assert_eq!(book.layers("a").unwrap()[0], book.layers("b").unwrap()[0]);
        book.retain(["b"]);
        assert!(!book.knows("a") && book.knows("b"));
        assert_eq!(book.holders.len(), 2);
        book.forget("b");
        assert!(book.holders.is_empty() && book.is_empty());
    }

    /// Absurd sizes and many images neither panic nor overflow.
    #[test]
    fn absurd_sizes_do_not_overflow() {
        let book = book(&[("a", &["base", "a"]), ("b", &["base", "b"]), ("c", &["c"])]);
        let images = [
            library_image("a", u64::MAX),
            library_image("b", u64::MAX / 3),
            library_image("c", 0),
        ];
        let mut freeing = book.freeing(&images, DiskFootprint::for_dialect(&Dialect::of("containerd")));
        let total = [("a", u64::MAX), ("b", u64::MAX / 3), ("c", 0)]
            .iter()
            .fold(0u64, |sum, (id, size)| sum.saturating_add(freeing.release(id, *size)));
        assert!(total > 0);
    }
}

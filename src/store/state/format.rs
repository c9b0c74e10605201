//! The state file's format, pure: encoding the records (version 7) and
//! decoding every version imagegc ever wrote (see the module docs of
//! [`super`]). Never panics, whatever the input.

use std::collections::BTreeMap;
use std::collections::hash_map::Entry;
use std::io;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::{Corruption, MAGIC, VERSION};
use crate::records::{Record, Records};
use crate::time::{from_unix_millis, to_unix_millis};

/// The first line of a version 2 payload.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Head {
    saved_at: u64,
    /// The number of record lines that follow.
    records: usize,
    /// When the last successful cycle finished (unix ms); absent in files
    /// written before it was kept, or before any cycle succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_success: Option<u64>,
    /// Version 5: what is remembered of images removed after they were
    /// used (see [`Records::removed_memory`]), `[id, last used, removed
    /// at, usual break, its spread]` each (unix ms; a break of 0: none
    /// known; the spread from version 7, `null` when not known); absent
    /// when there is none, and in older files.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    removed: Vec<RemovedLine>,
    /// Version 6: what measured removals showed layers take on disk (see
    /// [`Records::layer_sizes`]), `[layer key, bytes, measured at]` each (a layer's key: 16 hex
    /// digits, see [`crate::policy::layers::layer_key`]);
    /// absent when there is none, and in older files.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    layers: Vec<LayerLine>,
    /// Version 6: what measured removals raised the on-disk bytes per
    /// reported byte to, `[the runtime's own, learnt]` in thousandths;
    /// absent while it is the runtime's own, and in older files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    footprint: Option<(u64, u64)>,
    /// Version 6: removed images whose layers others still held (see
    /// [`Records::layer_ghosts`]), `[[layer key, ...], reported size, removed
    /// at]` each; absent when there is none, and in older files.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    ghosts: Vec<GhostLine>,
}

/// A removed image whose layers others held, as stored: its layers, its
/// reported size, when it was removed (unix ms).
pub(super) type GhostLine = (Vec<String>, u64, u64);

/// A layer's measured size, as stored: digest, on-disk bytes, when (unix ms).
pub(super) type LayerLine = (String, u64, u64);

/// What is remembered of one removed image, as stored: id, last used,
/// removed at, usual break (ms; 0: none known) and, from version 7, its
/// spread (ms; `null`: not known).
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(untagged)]
pub(super) enum RemovedLine {
    /// Version 7.
    WithSpread(String, u64, u64, u64, Option<u64>),
    /// Versions 5 and 6.
    Plain(String, u64, u64, u64),
}

impl RemovedLine {
    /// Id, last used, removed at (unix ms) and the usual break.
    pub(super) fn into_parts(self) -> (String, u64, u64, Option<crate::records::Break>) {
        match self {
            RemovedLine::WithSpread(id, last_used, removed_at, usual, spread) => {
                (id, last_used, removed_at, break_from_millis(usual, spread))
            }
            RemovedLine::Plain(id, last_used, removed_at, usual) => {
                (id, last_used, removed_at, break_from_millis(usual, None))
            }
        }
    }
}

/// A record line of version 7 as read (as [`encode`] writes it): id, first
/// seen, last used, size, pinned, tags, digests, ever used, usual break
/// (ms; 0: none known), its spread (ms; `null`: not known).
type Line = (
    String,
    u64,
    u64,
    u64,
    bool,
    Vec<String>,
    Vec<String>,
    bool,
    u64,
    Option<u64>,
);
/// A record line of versions 4 to 6: as version 7, without the spread.
type LineV4 = (String, u64, u64, u64, bool, Vec<String>, Vec<String>, bool, u64);
/// A record line of version 3: as version 4, without the usual break.
type LineV3 = (String, u64, u64, u64, bool, Vec<String>, Vec<String>, bool);
/// A record line of version 2: as version 3, without `ever used`.
type LineV2 = (String, u64, u64, u64, bool, Vec<String>, Vec<String>);

/// The payload of version 1.
#[derive(Deserialize)]
struct PayloadV1 {
    saved_at: u64,
    records: BTreeMap<String, StoredRecordV1>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredRecordV1 {
    first_seen: u64,
    last_used: u64,
    size: u64,
    pinned: bool,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default)]
    digests: Vec<String>,
}

/// A verified file's content: the save time (unix ms) and the records with
/// their times as stored.
pub(super) struct Decoded {
    pub(super) saved_at: u64,
    pub(super) last_success: Option<u64>,
    /// Keyed the records' own way, so loading builds the map once.
    pub(super) records: crate::collections::HashMap<String, Record>,
    /// What is remembered of removed images (version 5).
    pub(super) removed: Vec<RemovedLine>,
    /// The layers' measured sizes (version 6).
    pub(super) layers: Vec<LayerLine>,
    /// The footprint measured removals raised (version 6).
    pub(super) footprint: Option<(u64, u64)>,
    /// Removed images whose layers others held (version 6).
    pub(super) ghosts: Vec<GhostLine>,
}

/// The header line, which is written last, over a placeholder of the same
/// width: `len` has ten digits, room for any payload this module reads.
pub(super) fn header(crc: u32, len: usize) -> String {
    format!("{MAGIC} v{VERSION} crc32={crc:08x} len={len:010}\n")
}

/// The width of [`header`].
pub(super) const HEADER_BYTES: usize = "imagegc-state v2 crc32=00000000 len=0000000000\n".len();

/// How much of the payload is encoded before it is handed on: large enough
/// that writing costs a few system calls, small enough that the disk starts
/// early (10,000 records are about 2.7 MiB).
pub(super) const CHUNK_BYTES: usize = 256 * 1024;

/// The file's bytes for these records.
pub fn encode(records: &Records, now: SystemTime) -> Vec<u8> {
    let mut bytes = vec![b' '; HEADER_BYTES];
    let (crc, len) = encode_payload(records, now, None, |chunk| {
        bytes.extend_from_slice(chunk);
        Ok(())
    })
    .expect("writing to memory does not fail");
    bytes[..HEADER_BYTES].copy_from_slice(header(crc, len).as_bytes());
    bytes
}

/// Encodes the payload, handing it to `out` a chunk at a time, and returns
/// its CRC-32 and length.
pub(super) fn encode_payload(
    records: &Records,
    now: SystemTime,
    last_success: Option<SystemTime>,
    mut out: impl FnMut(&[u8]) -> io::Result<()>,
) -> io::Result<(u32, usize)> {
    // Sorted by id; the first sixteen bytes of each, kept beside it,
    // decide nearly every comparison without reading the ids themselves.
    let mut sorted: Vec<(u128, &String, &Record)> = records.iter().map(|(id, r)| (sort_prefix(id), id, r)).collect();
    sorted.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1)));
    let sorted = sorted.into_iter().map(|(_, id, r)| (id, r));
    let mut crc = crc32fast::Hasher::new();
    let mut len = 0;
    let mut chunk = Vec::with_capacity(CHUNK_BYTES + 4096);
    let mut hand_on = |chunk: &mut Vec<u8>| {
        crc.update(chunk);
        len += chunk.len();
        out(chunk)?;
        chunk.clear();
        io::Result::Ok(())
    };
    let json = "records serialize to JSON";
    let mut removed: Vec<RemovedLine> = records
        .removed_memory()
        .map(|(id, last_used, removed_at, usual_break)| {
            RemovedLine::WithSpread(
                id.to_string(),
                to_unix_millis(last_used),
                to_unix_millis(removed_at),
                break_millis(usual_break),
                spread_millis(usual_break),
            )
        })
        .collect();
    removed.sort_unstable();
    let mut layers: Vec<LayerLine> = records
        .layer_sizes()
        .map(|(layer, bytes, at)| (layer.to_string(), bytes, to_unix_millis(at)))
        .collect();
    layers.sort_unstable();
    let head = Head {
        saved_at: to_unix_millis(now),
        records: sorted.len(),
        last_success: last_success.map(to_unix_millis),
        removed,
        layers,
        footprint: records.footprint(),
        ghosts: records
            .layer_ghosts()
            .iter()
            .map(|(layers, reported, at)| (layers.clone(), *reported, to_unix_millis(*at)))
            .collect(),
    };
    serde_json::to_writer(&mut chunk, &head).expect(json);
    chunk.push(b'\n');
    for (id, r) in sorted {
        write_line(&mut chunk, id, r);
        if chunk.len() >= CHUNK_BYTES {
            hand_on(&mut chunk)?;
        }
    }
    if !chunk.is_empty() {
        hand_on(&mut chunk)?;
    }
    Ok((crc.finalize(), len))
}

/// An id's first sixteen bytes, big-endian, padded with zeros: ids in the
/// order of these keys are in the order of the ids, as far as the keys
/// tell them apart (after `sha256:`, nine hex digits do nearly always).
fn sort_prefix(id: &str) -> u128 {
    let mut prefix = [0u8; 16];
    let n = id.len().min(16);
    prefix[..n].copy_from_slice(&id.as_bytes()[..n]);
    u128::from_be_bytes(prefix)
}

/// One record's line: `["<id>",<first seen>,<last used>,<size>,<pinned>,[<tag>,...],[<digest>,...],<ever used>,<usual break>,<spread>]`
/// and a newline, exactly as `serde_json` writes that array.
fn write_line(out: &mut Vec<u8>, id: &str, r: &Record) {
    let mut numbers = itoa::Buffer::new();
    out.push(b'[');
    write_str(out, id);
    for n in [to_unix_millis(r.first_seen), to_unix_millis(r.last_used), r.size] {
        out.push(b',');
        out.extend_from_slice(numbers.format(n).as_bytes());
    }
    out.extend_from_slice(if r.pinned { b",true," } else { b",false," });
    for (k, names) in [&r.tags, &r.digests].into_iter().enumerate() {
        if k > 0 {
            out.push(b',');
        }
        out.push(b'[');
        for (i, name) in names.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_str(out, name);
        }
        out.push(b']');
    }
    out.extend_from_slice(if r.ever_used { b",true," } else { b",false," });
    out.extend_from_slice(numbers.format(break_millis(r.usual_break)).as_bytes());
    out.push(b',');
    match spread_millis(r.usual_break) {
        Some(ms) => out.extend_from_slice(numbers.format(ms).as_bytes()),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b"]\n");
}

/// A usual break as stored: whole seconds in milliseconds, 0 for none.
fn break_millis(usual_break: Option<crate::records::Break>) -> u64 {
    usual_break.map_or(0, |b| b.duration().as_secs().saturating_mul(1000))
}

/// A usual break's spread as stored: whole seconds in milliseconds, none
/// when not known.
fn spread_millis(usual_break: Option<crate::records::Break>) -> Option<u64> {
    usual_break
        .and_then(crate::records::Break::spread)
        .map(|s| s.as_secs().saturating_mul(1000))
}

/// A usual break and its spread as read back.
pub(super) fn break_from_millis(ms: u64, spread_ms: Option<u64>) -> Option<crate::records::Break> {
    (ms > 0).then(|| {
        crate::records::Break::from_duration(std::time::Duration::from_millis(ms))
            .with_spread(spread_ms.map(std::time::Duration::from_millis))
    })
}

/// A JSON string, as `serde_json` writes it. Names and ids need no escape
/// (nearly always): they are copied in one go, after a check that reads
/// the bytes without a branch each.
fn write_str(out: &mut Vec<u8>, s: &str) {
    let plain = s
        .bytes()
        .fold(true, |plain, b| plain & (b >= 0x20) & (b != b'"') & (b != b'\\'));
    if plain {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        serde_json::to_writer(&mut *out, s).expect("a string serializes to JSON");
    }
}

/// Verifies and parses a state file's bytes. Never panics, whatever the input.
pub(super) fn decode(bytes: &[u8]) -> Result<Decoded, Corruption> {
    if bytes.is_empty() {
        return Err(Corruption::Empty);
    }
    let newline = bytes
        .iter()
        .take(128)
        .position(|&b| b == b'\n')
        .ok_or(Corruption::BadHeader)?;
    let header = std::str::from_utf8(&bytes[..newline]).map_err(|_| Corruption::BadHeader)?;
    let body = &bytes[newline + 1..];
    let mut fields = header.split(' ');
    if fields.next() != Some(MAGIC) {
        return Err(Corruption::BadHeader);
    }
    let version = fields.next().ok_or(Corruption::BadHeader)?;
    let version = match version {
        "v1" => 1,
        "v2" => 2,
        "v3" => 3,
        "v4" => 4,
        "v5" => 5,
        "v6" => 6,
        "v7" => 7,
        _ => return Err(Corruption::WrongVersion(version.trim_start_matches('v').to_string())),
    };
    let crc = fields
        .next()
        .and_then(|f| f.strip_prefix("crc32="))
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .ok_or(Corruption::BadHeader)?;
    let len = fields
        .next()
        .and_then(|f| f.strip_prefix("len="))
        .and_then(|n| n.parse::<usize>().ok())
        .ok_or(Corruption::BadHeader)?;
    if fields.next().is_some() {
        return Err(Corruption::BadHeader);
    }
    if body.len() != len {
        return Err(Corruption::Length {
            expected: len,
            found: body.len(),
        });
    }
    let found = crc32fast::hash(body);
    if found != crc {
        return Err(Corruption::Checksum { expected: crc, found });
    }
    match version {
        1 => decode_v1(body),
        2 => decode_lines(
            body,
            |(id, first_seen, last_used, size, pinned, tags, digests): LineV2| {
                let ever_used = last_used > first_seen;
                (
                    id,
                    record(first_seen, last_used, size, pinned, &tags, &digests, ever_used),
                )
            },
        ),
        3 => decode_lines(
            body,
            |(id, first_seen, last_used, size, pinned, tags, digests, ever_used): LineV3| {
                (
                    id,
                    record(first_seen, last_used, size, pinned, &tags, &digests, ever_used),
                )
            },
        ),
        4..=6 => decode_lines(
            body,
            |(id, first_seen, last_used, size, pinned, tags, digests, ever_used, usual_break): LineV4| {
                let mut record = record(first_seen, last_used, size, pinned, &tags, &digests, ever_used);
                record.usual_break = break_from_millis(usual_break, None);
                (id, record)
            },
        ),
        _ => decode_lines(
            body,
            |(id, first_seen, last_used, size, pinned, tags, digests, ever_used, usual_break, spread): Line| {
                let mut record = record(first_seen, last_used, size, pinned, &tags, &digests, ever_used);
                record.usual_break = break_from_millis(usual_break, spread);
                (id, record)
            },
        ),
    }
}

/// A record as stored, before `load` adjusts its times.
fn record(
    first_seen: u64,
    last_used: u64,
    size: u64,
    pinned: bool,
    tags: &[String],
    digests: &[String],
    ever_used: bool,
) -> Record {
    Record {
        first_seen: from_unix_millis(first_seen),
        last_used: from_unix_millis(last_used),
        size,
        pinned,
        tags: crate::model::names::shared(tags),
        digests: crate::model::names::shared(digests),
        from_history: true,
        ever_used,
        usual_break: None,
    }
}

fn decode_v1(payload: &[u8]) -> Result<Decoded, Corruption> {
    let payload: PayloadV1 = serde_json::from_slice(payload).map_err(|e| Corruption::Payload(e.to_string()))?;
    let records = payload
        .records
        .into_iter()
        .map(|(id, r)| {
            (
                id,
                record(
                    r.first_seen,
                    r.last_used,
                    r.size,
                    r.pinned,
                    &r.tags,
                    &r.digests,
                    r.last_used > r.first_seen,
                ),
            )
        })
        .collect();
    Ok(Decoded {
        saved_at: payload.saved_at,
        last_success: None,
        records,
        removed: Vec::new(),
        layers: Vec::new(),
        footprint: None,
        ghosts: Vec::new(),
    })
}

/// The payload of versions 2 and 3: the head, then one record line of type
/// `L` each, turned into a record by `to_record`.
fn decode_lines<L: serde::de::DeserializeOwned>(
    payload: &[u8],
    to_record: impl Fn(L) -> (String, Record),
) -> Result<Decoded, Corruption> {
    let bad = |e: serde_json::Error| Corruption::Payload(e.to_string());
    // One UTF-8 check for the whole payload, rather than one a string.
    let payload = std::str::from_utf8(payload).map_err(|e| Corruption::Payload(e.to_string()))?;
    let mut values = serde_json::Deserializer::from_str(payload);
    let head = Head::deserialize(&mut values).map_err(bad)?;
    let mut lines = values.into_iter::<L>();
    let mut records = crate::collections::HashMap::default();
    // Room for the records announced, or the map rehashes every id as it
    // grows; no more than the payload can hold (a record line is at least
    // 22 bytes), and only a hint: without the memory the map grows instead.
    let _ = records.try_reserve(head.records.min(payload.len() / 22));
    loop {
        // Each value ends its line, and the next line is a record or nothing.
        let end = lines.byte_offset();
        let rest = &payload.as_bytes()[end..];
        if rest != b"\n" && !rest.starts_with(b"\n[") {
            return Err(Corruption::Payload(format!("byte {end}: not one value a line")));
        }
        let Some(line) = lines.next() else { break };
        let (id, record) = to_record(line.map_err(bad)?);
        match records.entry(id) {
            Entry::Occupied(known) => {
                return Err(Corruption::Payload(format!("image {:?} is listed twice", known.key())));
            }
            Entry::Vacant(entry) => {
                entry.insert(record);
            }
        }
    }
    if records.len() != head.records {
        return Err(Corruption::Payload(format!(
            "{} records announced, {} found",
            head.records,
            records.len()
        )));
    }
    Ok(Decoded {
        saved_at: head.saved_at,
        last_success: head.last_success,
        records,
        removed: head.removed,
        layers: head.layers,
        footprint: head.footprint,
        ghosts: head.ghosts,
    })
}

/// Checks a state file's bytes the way [`super::StateStore::load`] does and returns
/// the number of records, or why it would be set aside (fuzzing entry point).
pub fn verify(bytes: &[u8]) -> Result<usize, Corruption> {
    decode(bytes).map(|d| d.records.len())
}

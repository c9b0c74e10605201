//! What the benches share: the deterministic names they build their worlds
//! from.

/// A deterministic 64-hex digest for `n` in namespace `kind` (splitmix64
/// rounds): ids and digests that look like a runtime's, the same every run.
pub fn hex(kind: u64, n: u64) -> String {
    let mut x = kind.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ n.wrapping_add(1);
    let mut out = String::with_capacity(64);
    for _ in 0..4 {
        x ^= x >> 30;
        x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x ^= x >> 27;
        x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^= x >> 31;
        out.push_str(&format!("{x:016x}"));
    }
    out
}

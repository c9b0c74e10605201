//! The integers of the raw form: read from a file whatever their size, so
//! that ranges are checked once the whole file is read (`validate`), and
//! used by every section of the raw form (`raw`, `protect`).

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

/// An integer of any size; ranges are checked when building the `Config`,
/// so that `-1` and `101` get "must be within" rather than a type error.
#[derive(Debug, Clone, Copy)]
pub(super) struct RawInt(pub(super) i64);

impl<'de> Deserialize<'de> for RawInt {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct IntVisitor;
        impl Visitor<'_> for IntVisitor {
            type Value = RawInt;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer")
            }
            fn visit_i64<E: de::Error>(self, value: i64) -> Result<RawInt, E> {
                Ok(RawInt(value))
            }
            fn visit_u64<E: de::Error>(self, value: u64) -> Result<RawInt, E> {
                Ok(RawInt(i64::try_from(value).unwrap_or(i64::MAX)))
            }
        }
        deserializer.deserialize_any(IntVisitor)
    }
}

//! QNN's `major.minor.patch` versions.

use crate::bindings as b;

/// A `major.minor.patch` version (`Qnn_Version_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Version {
    /// Major version: must match.
    pub major: u32,
    /// Minor version: must be at least the required one.
    pub minor: u32,
    /// Patch version.
    pub patch: u32,
}

impl Version {
    /// Builds a version.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Version {
            major,
            minor,
            patch,
        }
    }

    pub(crate) fn from_raw(v: &b::Qnn_Version_t) -> Self {
        Version::new(v.major, v.minor, v.patch)
    }

    /// The raw struct.
    pub fn to_raw(self) -> b::Qnn_Version_t {
        b::Qnn_Version_t {
            major: self.major,
            minor: self.minor,
            patch: self.patch,
        }
    }

    /// True when `self` can serve a client that needs `needed`: same major, minor at least.
    pub fn satisfies(self, needed: Version) -> bool {
        self.major == needed.major && self.minor >= needed.minor
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

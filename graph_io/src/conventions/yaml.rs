//! Conventions described in YAML: the fields of [`Convention`] (unknown fields rejected; documented
//! in the README, "Qualcomm models"). Graph names are written with the first graph pattern and the
//! phases `prompt` / `token`; tensor names with the first pattern of each role that fits.

use crate::convention::{Convention, ConventionError};

impl Convention {
    /// Parses a YAML convention and checks its patterns; `origin` names the source in errors.
    pub fn from_yaml(text: &str, origin: &str) -> Result<Convention, ConventionError> {
        let c: Convention =
            serde_saphyr::from_str(text).map_err(|source| ConventionError::Parse {
                path: origin.to_string(),
                source: Box::new(source),
            })?;
        c.check_patterns()?;
        Ok(c)
    }
}

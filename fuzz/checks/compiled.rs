//! Fuzz check of the compiled-model file (`ref_backend::CompiledModel::from_bytes`).
//!
//! The data is parsed as it is, and again with its header's payload length and checksum fixed
//! up, so that mutations reach the content checks behind the CRC. Neither may panic; a model that
//! parses must serialize back to exactly the bytes it came from.

use ref_backend::CompiledModel;
use ref_backend::format::HEADER_LEN;

pub fn check(data: &[u8]) {
    parse(data);
    if data.len() >= HEADER_LEN {
        let mut sealed = data.to_vec();
        let payload_len = (data.len() - HEADER_LEN) as u64;
        sealed[16..24].copy_from_slice(&payload_len.to_le_bytes());
        let crc = ref_backend::crc32(&sealed[HEADER_LEN..]);
        sealed[24..28].copy_from_slice(&crc.to_le_bytes());
        parse(&sealed);
    }
}

fn parse(data: &[u8]) {
    if let Ok(model) = CompiledModel::from_bytes(data, "fuzz") {
        assert!(
            model.to_bytes() == data,
            "a parsed model does not serialize back to its bytes"
        );
    }
}

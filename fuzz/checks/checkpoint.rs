//! Fuzz check of the llama2.c checkpoint parser (`model::llama2c::Checkpoint::from_bytes`): no panic,
//! and a checkpoint that parses has exactly the size its header implies and re-parses from its
//! own serialization to the same weights (bit for bit).

use model::llama2c::Checkpoint;

pub fn check(data: &[u8]) {
    if let Ok(ckpt) = Checkpoint::from_bytes(data, "fuzz") {
        assert_eq!(ckpt.config.file_bytes(), data.len() as u64);
        let bytes = ckpt.to_bytes();
        let again =
            Checkpoint::from_bytes(&bytes, "fuzz again").expect("a serialized checkpoint parses");
        assert!(
            again.to_bytes() == bytes,
            "the weights changed in a round trip"
        );
    }
}

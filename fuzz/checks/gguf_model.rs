//! Fuzz check of a GGUF model's metadata against its tensors: the bytes are a GGUF file. When a
//! description comes out of the header, every tensor of the file is one it needs, with its shape
//! (none missing, none left over); when the weights load, every value is finite. The tokenizer and
//! the chat template built from the same header fail with typed errors or work.

use std::io::Cursor;

use model::gguf::{GgufFile, llama_config, read_weights};
use model::{ChatTemplate, HfTokenizer, Message, Tensor, WeightSource};

pub fn check(data: &[u8]) {
    let Ok(file) = GgufFile::read(Cursor::new(data), data.len() as u64) else {
        return;
    };
    if let Ok(tok) = HfTokenizer::from_gguf(&file) {
        let _ = tok.encode("Once upon a time", true);
    }
    if let Ok(t) = ChatTemplate::from_gguf(&file) {
        let _ = t.render_capped(&[Message::new("user", "hi")], true, 1 << 16);
    }
    let Ok(config) = llama_config(&file, "fuzz.gguf", &mut Cursor::new(data)) else {
        return;
    };
    // The description accounts for every tensor, with its shape: each needed tensor is stored
    // under its family's name (whole ones with its shape), and every tensor of the file is
    // either stored for one or read into the description.
    let arch = file.get("general.architecture").and_then(|v| v.as_str());
    let fam = arch
        .and_then(model::family::by_gguf_arch)
        .expect("a described file's family");
    let required = Tensor::required(&config);
    let mut stored = std::collections::HashSet::new();
    for t in &required {
        let s = (fam.gguf_tensor)(*t, &config);
        let info = file.tensor(&s.name).expect("a needed tensor is missing");
        if s.rows.is_none() {
            assert_eq!(info.shape(), t.shape(&config));
        }
        stored.insert(s.name);
    }
    for t in &file.tensors {
        let known = stored.contains(&t.name) || fam.gguf_config_tensors.contains(&t.name.as_str());
        assert!(known, "tensor {} left over", t.name);
    }
    // Bounded work: dequantize only small models.
    if file.tensors.iter().map(|t| t.n_elements).sum::<u64>() > 1 << 20 {
        return;
    }
    let Ok(weights) = read_weights(&file, &config, &mut Cursor::new(data), "fuzz.gguf") else {
        return;
    };
    for t in required {
        let w = weights.tensor(t).expect("a loaded tensor");
        assert_eq!(w.len(), t.len(&config));
        assert!(
            w.iter().all(|v| v.is_finite()),
            "a non-finite weight loaded"
        );
    }
}

//! Prints a GGUF file's description, metadata keys and tensor types, and the time to load and
//! dequantize it: `cargo run --release -p model --example gguf_info -- FILE.gguf`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path: PathBuf = std::env::args_os()
        .nth(1)
        .ok_or("usage: gguf_info FILE.gguf")?
        .into();
    let t0 = Instant::now();
    let m = model::gguf::GgufModel::load(&path)?;
    let secs = t0.elapsed().as_secs_f64();
    println!("{:#?}", m.config);
    for (k, v) in &m.file.metadata {
        let s = format!("{v:?}");
        println!("{k}: {}", if s.len() > 100 { &s[..100] } else { &s });
    }
    let mut types: BTreeMap<String, usize> = BTreeMap::new();
    for t in &m.file.tensors {
        *types.entry(format!("{:?}", t.ty)).or_default() += 1;
    }
    println!("tensor types: {types:?}");
    println!("loaded and dequantized in {secs:.2} s");
    Ok(())
}

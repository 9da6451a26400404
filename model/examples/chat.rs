//! Answers one question with the f32 reference forward of a GGUF model and reports speed:
//! `cargo run --release -p model --example chat -- MODEL.gguf "What is the capital of France?"`

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use model::gguf::GgufModel;
use model::{ChatTemplate, FloatModel, HfTokenizer, Message, ops::argmax};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args_os().skip(1);
    let path: PathBuf = args.next().ok_or("usage: chat MODEL.gguf QUESTION")?.into();
    let question = args.next().ok_or("usage: chat MODEL.gguf QUESTION")?;
    let t0 = Instant::now();
    let m = GgufModel::load(&path)?;
    let load = t0.elapsed().as_secs_f64();
    let tok = HfTokenizer::from_gguf(&m.file)?;
    let chat = ChatTemplate::from_gguf(&m.file)?;
    let prompt = chat.render_chat(&[Message::new("user", &question.to_string_lossy())], true)?;
    let ids = tok.encode(&prompt, true)?;
    let stop = m.config.special.stop_tokens();
    let mut fm = FloatModel::new(m.config.clone(), m.weights.clone(), 1024)?;
    let t1 = Instant::now();
    for (pos, &t) in ids[..ids.len() - 1].iter().enumerate() {
        fm.forward(t, pos)?;
    }
    let prefill = t1.elapsed().as_secs_f64();
    let (mut token, mut pos, mut out) = (ids[ids.len() - 1], ids.len() - 1, Vec::new());
    let mut text = tok.stream(true);
    let t2 = Instant::now();
    while pos < fm.context() && out.len() < 256 {
        let next = argmax(fm.forward(token, pos)?) as u32;
        if stop.contains(&next) {
            break;
        }
        out.push(next);
        print!("{}", text.step(next)?.unwrap_or_default());
        std::io::stdout().flush()?;
        (token, pos) = (next, pos + 1);
    }
    let decode = t2.elapsed().as_secs_f64();
    println!();
    eprintln!(
        "load+dequantize {load:.2} s; prefill {} tokens {:.1} tok/s; decode {} tokens {:.1} tok/s ({} threads)",
        ids.len() - 1,
        (ids.len() - 1) as f64 / prefill,
        out.len() + 1,
        (out.len() + 1) as f64 / decode,
        rayon::current_num_threads()
    );
    Ok(())
}

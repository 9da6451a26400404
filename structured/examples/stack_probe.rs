//! Measures how deep a schema or grammar llguidance compiles within a given stack: the numbers
//! behind the limits of `htpkv_structured`'s guard (see `guard.rs`). It compiles one generated
//! input on a thread of the given stack and prints `ok` or the error; a stack overflow aborts the
//! process, which is the measurement (run it in a loop from a shell):
//!
//! ```text
//! cargo run -p htpkv_structured --example stack_probe -- KIND DEPTH STACK_KIB
//! ```
//!
//! KIND: `refchain` (`$ref` to `$ref`), `refprops` (an object whose property is a `$ref` to the
//! next), `anyof` (an `anyOf` holding a `$ref` to the next), `nest` (objects in objects, written
//! out), `larkchain` (rule to rule), `larkparen` (parentheses in one rule), `schema` (the JSON
//! schema in the environment variable `SCHEMA`, DEPTH ignored).
//! The guard itself is switched off here (`compile_unguarded`), so this measures llguidance.

use htpkv_runtime::session::TextCodec;
use htpkv_structured::{OutputFormat, Vocabulary};
use serde_json::{Value, json};
use std::sync::Arc;

#[derive(Debug)]
struct Bytes;

impl TextCodec for Bytes {
    fn encode(&self, text: &str, _bos: bool) -> Vec<u32> {
        text.bytes().map(u32::from).collect()
    }
    fn decode_piece(&self, _prev: u32, token: u32) -> Vec<u8> {
        if token < 256 {
            vec![token as u8]
        } else {
            Vec::new()
        }
    }
    fn is_stop(&self, token: u32) -> bool {
        token == 256
    }
    fn vocab_size(&self) -> Option<usize> {
        Some(257)
    }
    fn token_bytes(&self, token: u32) -> Vec<u8> {
        if token == 256 {
            b"\xFF<end>".to_vec()
        } else {
            vec![token as u8]
        }
    }
}

fn defs(depth: usize, link: impl Fn(&str) -> Value) -> Value {
    let mut defs = serde_json::Map::new();
    for i in 0..depth {
        defs.insert(format!("a{i}"), link(&format!("#/$defs/a{}", i + 1)));
    }
    defs.insert(format!("a{depth}"), json!({"type": "integer"}));
    json!({"$ref": "#/$defs/a0", "$defs": defs})
}

fn input(kind: &str, depth: usize) -> OutputFormat {
    match kind {
        "refchain" => OutputFormat::JsonSchema(defs(depth, |r| json!({"$ref": r}))),
        "refprops" => OutputFormat::JsonSchema(defs(
            depth,
            |r| json!({"type": "object", "properties": {"x": {"$ref": r}}, "required": ["x"]}),
        )),
        "anyof" => OutputFormat::JsonSchema(defs(
            depth,
            |r| json!({"anyOf": [{"$ref": r}, {"type": "null"}]}),
        )),
        "nest" => {
            let mut v = json!({"type": "integer"});
            for _ in 0..depth {
                v = json!({"type": "object", "properties": {"x": v}, "required": ["x"]});
            }
            OutputFormat::JsonSchema(v)
        }
        "larkchain" => {
            let mut g = String::from("start: r0\n");
            for i in 0..depth {
                g.push_str(&format!("r{i}: \"a\" r{} | \"b\"\n", i + 1));
            }
            g.push_str(&format!("r{depth}: \"c\"\n"));
            OutputFormat::Lark(g)
        }
        "larkparen" => OutputFormat::Lark(format!(
            "start: {}\"a\"{}\n",
            "(".repeat(depth),
            ")".repeat(depth)
        )),
        "schema" => OutputFormat::JsonSchema(
            serde_json::from_str(&std::env::var("SCHEMA").expect("SCHEMA")).expect("JSON"),
        ),
        other => panic!("unknown kind {other}"),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (kind, depth, kib) = (
        &args[1],
        args[2].parse().unwrap(),
        args[3].parse::<usize>().unwrap(),
    );
    let format = input(kind, depth);
    let vocab = Arc::new(Vocabulary::new(&Bytes).unwrap());
    let out = std::thread::Builder::new()
        .stack_size(kib << 10)
        .spawn(move || vocab.compile_unguarded(&format, "probe").map(|_| ()))
        .unwrap()
        .join();
    match out {
        Ok(Ok(())) => println!("ok"),
        Ok(Err(e)) => println!(
            "err: {e}: {}",
            std::error::Error::source(&e)
                .map(|s| s.to_string())
                .unwrap_or_default()
                .lines()
                .next()
                .unwrap_or("")
        ),
        Err(_) => println!("panic"),
    }
}

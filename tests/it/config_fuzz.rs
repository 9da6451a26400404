//! Fuzzing the YAML config parser through the entry point the CLI uses (`Config::load` on a file):
//! arbitrary bytes and mutated valid configs must give a config or a [`ConfigError`] naming the file,
//! never a panic, and every accepted config must be budgeted (or refused with a typed error) for every
//! strategy. `tests/corpus/config/` holds the interesting inputs found so far and is replayed here:
//! files named `ok_*` must load, the others must be refused.

use htpkv::budget::report;
use htpkv::config::{Config, ConfigError};
use proptest::prelude::*;
use std::path::{Path, PathBuf};
use test_support::files::ScratchDir;

const SEED: &str = include_str!("../../configs/stories260K.yaml");

/// Values that sit on or just past a limit, overflow a type, or are not numbers at all.
const INTERESTING: &[&str] = &[
    "0",
    "1",
    "2",
    "-1",
    "4096",
    "4097",
    "262144",
    "16777215",
    "16777216",
    "16777217",
    "67108865",
    "4294967296",
    "18446744073709551615",
    "18446744073709551616",
    "1e300",
    "1e300x",
    "0.5x",
    "nanx",
    "+18446744073709551615",
    ".nan",
    "~",
    "[]",
    "{}",
    "\"\"",
    "*x",
    "&x",
    "rotate",
    "per_layer",
    "transposed",
    "naive",
    "conveyor",
    "f32",
];

/// Loads `bytes` as the CLI does and budgets every strategy of an accepted config.
fn check(bytes: &[u8]) -> Result<Config, ConfigError> {
    let dir = ScratchDir::new("config-fuzz");
    let path = dir.join("config.yaml");
    std::fs::write(&path, bytes).unwrap();
    let result = Config::load(&path);
    match &result {
        Ok(config) => {
            for update in htpkv::kv_manager::Strategy::ALL {
                // Ok or a typed error; a panic fails the test.
                let _ = report(config, update, 0);
            }
        }
        Err(e) => {
            let message = e.to_string();
            assert!(
                message.starts_with(&path.display().to_string()),
                "{message}"
            );
        }
    }
    result
}

/// Splits text into words (runs of letters, digits and `_ . + -`) and the separators between them.
fn tokens(text: &str) -> Vec<String> {
    let word = |c: char| c.is_ascii_alphanumeric() || "_.+-".contains(c);
    let mut out: Vec<String> = Vec::new();
    for c in text.chars() {
        match out.last_mut() {
            Some(last) if last.chars().all(word) == word(c) => last.push(c),
            _ => out.push(c.to_string()),
        }
    }
    out
}

/// One edit of a token list: replace a token with an interesting value, delete it, or duplicate it.
#[derive(Debug, Clone)]
enum Edit {
    Replace(usize, usize),
    Delete(usize),
    Duplicate(usize),
    Insert(usize, String),
}

fn apply(mut toks: Vec<String>, edits: &[Edit]) -> String {
    for edit in edits {
        let n = toks.len().max(1);
        match edit {
            Edit::Replace(i, v) => toks[i % n] = INTERESTING[v % INTERESTING.len()].to_string(),
            Edit::Delete(i) => {
                toks.remove(i % n);
            }
            Edit::Duplicate(i) => {
                let t = toks[i % n].clone();
                toks.insert(i % n, t);
            }
            Edit::Insert(i, s) => toks.insert(i % n, s.clone()),
        }
    }
    toks.concat()
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        4 => (any::<usize>(), any::<usize>()).prop_map(|(i, v)| Edit::Replace(i, v)),
        1 => any::<usize>().prop_map(Edit::Delete),
        1 => any::<usize>().prop_map(Edit::Duplicate),
        1 => (any::<usize>(), "[ -~\n\t]{1,8}").prop_map(|(i, s)| Edit::Insert(i, s)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        let _ = check(&bytes);
    }

    #[test]
    fn arbitrary_text_never_panics(text in "[ -~\n\t]{0,400}") {
        let _ = check(text.as_bytes());
    }

    #[test]
    fn mutated_configs_never_panic(edits in prop::collection::vec(edit(), 1..5)) {
        let text = apply(tokens(SEED), &edits);
        let _ = check(text.as_bytes());
    }
}

#[test]
fn tokens_round_trip() {
    assert_eq!(tokens(SEED).concat(), SEED);
    assert!(tokens("layers: 5,").contains(&"layers".to_string()));
}

#[test]
fn corpus_replays() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/config");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 10, "{files:?}");
    for file in files {
        let bytes = std::fs::read(&file).unwrap();
        assert!(
            bytes.len() < 2048,
            "{}: keep corpus files small",
            file.display()
        );
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let result = check(&bytes);
        assert_eq!(
            result.is_ok(),
            name.starts_with("ok_"),
            "{name}: {:?}",
            result.err().map(|e| e.to_string())
        );
    }
}

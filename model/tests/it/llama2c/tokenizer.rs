//! Tokenizer tests against the real tok512.bin, committed under `models/stories260K`.

use model::llama2c::{ModelError, TOK512_BYTES, TOK512_SHA256, Tokenizer, sha256_hex};

fn real() -> (Vec<u8>, Tokenizer) {
    let files = test_support::stories::stories260k();
    let bytes = std::fs::read(&files.tokenizer).expect("tokenizer readable");
    let tok = Tokenizer::load(&files.tokenizer, 512).expect("tokenizer loads");
    (bytes, tok)
}

/// An independent, deliberately naive implementation of llama2.c's encoder (linear scans over
/// the vocabulary, merged pieces rebuilt every round) to cross-check the real one.
fn reference_encode(t: &Tokenizer, text: &str) -> Vec<u32> {
    let vocab: Vec<(Vec<u8>, f32)> = (0..t.vocab_size() as u32)
        .map(|i| (t.piece(i).unwrap().to_vec(), t.score(i).unwrap()))
        .collect();
    let find = |s: &[u8]| vocab.iter().position(|(p, _)| p == s);
    let mut toks: Vec<usize> = Vec::new();
    if !text.is_empty() {
        toks.push(find(b" ").unwrap());
    }
    for ch in text.chars() {
        let s = ch.to_string();
        match find(s.as_bytes()) {
            Some(i) => toks.push(i),
            None => toks.extend(s.bytes().map(|b| b as usize + 3)),
        }
    }
    loop {
        let mut best: Option<(usize, usize)> = None;
        for i in 0..toks.len().saturating_sub(1) {
            let merged = [vocab[toks[i]].0.clone(), vocab[toks[i + 1]].0.clone()].concat();
            if let Some(j) = find(&merged)
                && (best.is_none() || vocab[j].1 > vocab[best.unwrap().1].1)
            {
                best = Some((i, j));
            }
        }
        let Some((i, j)) = best else { break };
        toks.splice(i..i + 2, [j]);
    }
    toks.into_iter().map(|i| i as u32).collect()
}

const SAMPLES: &[&str] = &[
    "Once upon a time",
    "Once upon a time, there was a little girl named Lily.",
    "Hello, World! 123",
    "  leading and trailing spaces  ",
    "line one\nline two\ttab",
    "héllo wörld, ça va?",
    "日本語のテキスト",
    "emoji 🎉🦀 and math ∑∞",
    "a",
    " ",
    "\u{0}nul\u{7f}",
];

#[test]
fn file_identity_and_special_pieces() {
    let (bytes, t) = real();
    assert_eq!(bytes.len() as u64, TOK512_BYTES);
    assert_eq!(sha256_hex(&bytes), TOK512_SHA256);
    assert_eq!(t.vocab_size(), 512);
    assert_eq!(t.piece(Tokenizer::BOS), Some(&b"\n<s>\n"[..]));
    assert_eq!(t.piece(Tokenizer::EOS), Some(&b"\n</s>\n"[..]));
    assert_eq!(t.piece(3), Some(&b"<0x00>"[..]));
    assert_eq!(t.piece(258), Some(&b"<0xFF>"[..]));
    assert_eq!(t.piece(512), None);
    let longest = (0..512).map(|i| t.piece(i).unwrap().len()).max().unwrap();
    assert_eq!(longest, t.max_token_length());
}

#[test]
fn once_upon_a_time_encodes_as_traced() {
    let (_, t) = real();
    // Hand-traced with the llama2.c algorithm over tok512.bin: after the dummy prefix the
    // merges by score are " t"(0) " a"(-2) "im"(-29) "on"(-30) " u"(-59) " O"(-60) " On"(-62)
    // "ce"(-72) " up"(-91) "ime"(-110) " time"(-119) " Once"(-144) " upon"(-148).
    let ids = t.encode("Once upon a time", true, false);
    assert_eq!(ids, vec![1, 403, 407, 261, 378]);
    let pieces: Vec<&[u8]> = ids[1..].iter().map(|&i| t.piece(i).unwrap()).collect();
    assert_eq!(pieces, [&b" Once"[..], b" upon", b" a", b" time"]);
    assert_eq!(t.score(403), Some(-144.0));
    assert_eq!(
        t.encode("Once upon a time", true, true).last(),
        Some(&Tokenizer::EOS)
    );
}

#[test]
fn encode_matches_naive_reference_and_is_merge_complete() {
    let (_, t) = real();
    for s in SAMPLES {
        let ids = t.encode(s, false, false);
        assert_eq!(ids, reference_encode(&t, s), "{s:?}");
        // No adjacent pair is left that the vocabulary could merge.
        for w in ids.windows(2) {
            let m = [t.piece(w[0]).unwrap(), t.piece(w[1]).unwrap()].concat();
            assert_eq!(
                t.lookup(&m),
                None,
                "{s:?}: unmerged pair {:?}",
                String::from_utf8_lossy(&m)
            );
        }
    }
    assert_eq!(
        t.encode("", true, true),
        vec![Tokenizer::BOS, Tokenizer::EOS]
    );
}

#[test]
fn decode_inverts_encode() {
    let (_, t) = real();
    for s in SAMPLES {
        let ids = t.encode(s, true, true);
        assert_eq!(t.decode(&ids), s.as_bytes(), "{s:?} -> {ids:?}");
        // Without BOS the dummy-prefix space stays.
        let no_bos = t.encode(s, false, false);
        assert_eq!(t.decode(&no_bos), format!(" {s}").as_bytes(), "{s:?}");
        // Piece by piece, the way a streaming printer calls it.
        let mut out = Vec::new();
        for w in ids.windows(2) {
            if w[1] != Tokenizer::EOS {
                out.extend(t.decode_piece(w[0], w[1]));
            }
        }
        assert_eq!(out, s.as_bytes(), "{s:?}");
    }
    // Non-ASCII goes through byte fallback tokens (ids 3..=258).
    let ids = t.encode("日本", false, false);
    assert!(ids.iter().any(|&i| (3..=258).contains(&i)), "{ids:?}");
    assert_eq!(t.decode_piece(Tokenizer::BOS, 0xE6 + 3), vec![0xE6]);
}

#[test]
fn malformed_files_are_rejected() {
    let (bytes, _) = real();
    assert!(matches!(
        Tokenizer::from_bytes(&bytes, 511, "t"),
        Err(ModelError::VocabMismatch {
            expected: 511,
            found: 512,
            ..
        })
    ));
    assert!(matches!(
        Tokenizer::from_bytes(&bytes, 600, "t"),
        Err(ModelError::VocabMismatch {
            expected: 600,
            found: 512,
            ..
        })
    ));
    // Cut inside the last entry's bytes.
    let cut = &bytes[..bytes.len() - 2];
    match Tokenizer::from_bytes(cut, 512, "cut.bin") {
        Err(e @ ModelError::Truncated { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("entry 511") && msg.contains("cut.bin"),
                "{msg}"
            );
            assert!(msg.contains(&bytes.len().to_string()), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    // Cut inside an entry's length field: entry 0 starts at 4, its length at 8.
    assert!(matches!(
        Tokenizer::from_bytes(&bytes[..10], 512, "t"),
        Err(ModelError::Truncated { ref what, expected: 12, found: 10, .. }) if what.contains("entry 0")
    ));
    // Negative length in entry 1 (entry 0 "<unk>" occupies bytes 4..17).
    let mut neg = bytes.clone();
    neg[21..25].copy_from_slice(&(-3i32).to_le_bytes());
    assert!(matches!(
        Tokenizer::from_bytes(&neg, 512, "t"),
        Err(ModelError::BadTokenizer { index: 1, .. })
    ));
    let mut neg_max = bytes.clone();
    neg_max[..4].copy_from_slice(&(-1i32).to_le_bytes());
    assert!(matches!(
        Tokenizer::from_bytes(&neg_max, 512, "t"),
        Err(ModelError::BadTokenizer { .. })
    ));
}

/// A small deterministic generator (xorshift64*), so the varied texts are reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn varied_text(rng: &mut Rng, alphabet: &[&str], len: usize) -> String {
    (0..len)
        .map(|_| alphabet[rng.below(alphabet.len())])
        .collect()
}

const ALPHABET: &[&str] = &[
    "a", "b", "e", "t", "h", "o", "n", " ", " ", "the ", "and ", "Lily", ".", ",", "\n", "é", "日",
    "🎉", "ing ", "was ", "'", "1",
];

#[test]
fn encode_matches_the_naive_reference_on_varied_real_text() {
    let (_, t) = real();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..40 {
        let len = 1 + rng.below(60);
        let s = varied_text(&mut rng, ALPHABET, len);
        assert_eq!(
            t.encode(&s, false, false),
            reference_encode(&t, &s),
            "round {round}: {s:?}"
        );
    }
}

/// Toy vocabularies with many equal, negative-zero and infinite scores exercise the tie rule
/// (best score, then leftmost) of the heap-based merge against the naive rescanning one.
#[test]
fn encode_matches_the_naive_reference_on_toy_vocabularies_with_ties() {
    let mut rng = Rng(42);
    let letters = ["a", "b", "c", " "];
    for round in 0..30 {
        let mut pieces: Vec<Vec<u8>> =
            vec![b"<unk>".to_vec(), b"\n<s>\n".to_vec(), b"\n</s>\n".to_vec()];
        pieces.extend((0..=255u8).map(|b| format!("<0x{b:02X}>").into_bytes()));
        let mut scores = vec![0.0f32; pieces.len()];
        let score_choices = [0.0, -0.0, -1.0, -1.0, -2.0, 1.0, f32::NEG_INFINITY];
        for l in letters {
            pieces.push(l.as_bytes().to_vec());
            scores.push(0.0);
        }
        for _ in 0..25 {
            let len = 2 + rng.below(4);
            let p: String = (0..len).map(|_| letters[rng.below(4)]).collect();
            pieces.push(p.into_bytes());
            scores.push(score_choices[rng.below(score_choices.len())]);
        }
        let t = Tokenizer::from_pieces(pieces, scores, 8);
        for _ in 0..10 {
            let len = 1 + rng.below(40);
            let s = varied_text(&mut rng, &letters, len);
            assert_eq!(
                t.encode(&s, true, false)[1..],
                reference_encode(&t, &s),
                "round {round}: {s:?}"
            );
        }
    }
}

/// Issue 14 row 6: a 24,000-token prompt took 132 s in the quadratic merge loop.
#[test]
fn long_text_encodes_in_subquadratic_time() {
    let (_, t) = real();
    let mut rng = Rng(7);
    let text = varied_text(&mut rng, ALPHABET, 40_000);
    let started = std::time::Instant::now();
    let ids = t.encode(&text, true, false);
    let took = started.elapsed();
    assert!(ids.len() > 20_000, "{} tokens", ids.len());
    assert!(
        took < std::time::Duration::from_secs(5),
        "encoding {} bytes took {took:?}",
        text.len()
    );
    assert_eq!(t.decode(&ids), text.as_bytes());
    assert!(t.min_tokens(&text) < ids.len());
}

#[test]
fn nan_scores_are_refused() {
    let mut b = 4i32.to_le_bytes().to_vec();
    b.extend(f32::NAN.to_le_bytes());
    b.extend(1i32.to_le_bytes());
    b.push(b'a');
    let e = Tokenizer::from_bytes(&b, 1, "nan.bin").unwrap_err();
    assert_eq!(
        e.to_string(),
        "nan.bin: bad tokenizer entry 0: the score is NaN"
    );
}

/// Found by the `tokenizer` fuzz target: when byte-fallback pieces are empty, a merge covers
/// more text than its piece holds, so no byte-length bound may be claimed.
#[test]
fn min_tokens_is_a_true_lower_bound_with_empty_pieces() {
    let mut pieces: Vec<Vec<u8>> = vec![b"<unk>".to_vec(), b"<s>".to_vec(), b"</s>".to_vec()];
    pieces.extend((0..256).map(|_| Vec::new()));
    pieces.push(b" ".to_vec());
    let t = Tokenizer::from_pieces(pieces.clone(), vec![0.0; pieces.len()], 5);
    let text = "aaaaaaaaaa";
    let ids = t.encode(text, false, false);
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert!(t.min_tokens(text) <= ids.len());
}

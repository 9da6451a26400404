//! Tiny GGUF files of each model family htpkv runs, laid out as llama.cpp reads them (metadata
//! keys, tensor names and shapes, vocabularies), with seeded weights scaled so the logits are far
//! from flat. llama.cpp's logits on these files are recorded under
//! `model/tests/fixtures/llamacpp/` (see the README there); the fixtures store each file's
//! SHA-256, so a change here that alters a file fails the fixture tests instead of silently
//! invalidating the recorded values.
//!
//! What each family is, as llama.cpp reads it:
//! - `llama`: rotary pairs adjacent (llama.cpp's "norm" rope), separate classifier.
//! - `llama3`: `llama` with Llama 3.x's `rope_freqs.weight` (one divisor per rotary pair, as the
//!   converter computes from `rope_scaling` type `llama3`), base 500000, tied classifier.
//! - `mistral`: the `llama` architecture (llama.cpp's converter writes Mistral as `llama`), 4:1
//!   grouped-query attention, base 1e6.
//! - `qwen2`: q/k/v biases, rotary halves (llama.cpp's "neox" rope), tied classifier, GPT-2 BPE.
//! - `qwen3`: per-head q/k RMSNorm before the rotation, key/value length 32 while dim/heads is 16.
//! - `gemma3`: embedding times sqrt(dim), four norms per layer, q/k norm, head size 32 while
//!   dim/heads is 16, GELU-tanh gated FFN, sliding window 8 on every layer but each sixth (no
//!   `sliding_window_pattern` key: llama.cpp's gemma3 default of 6, as in the real files), global
//!   base 1e6 and local base 10000 (llama.cpp's default; no `rope.freq_base_swa` key, as in the
//!   real files), tied classifier, norm weights stored already folded (`1 + w`).
//! - `phi3`: fused `attn_qkv` (q, then k, then v rows), fused `ffn_up` (gate rows, then up rows; no
//!   `ffn_gate`), partial rotary (`rope.dimension_count` 24 of head size 32, like Phi-4-mini's
//!   0.75).
//! - `phi3-long` and `phi3-short`: `phi3` with LongRoPE as the converter writes Phi-3-mini-128k
//!   and Phi-4-mini (`rope_factors_short.weight`, `rope_factors_long.weight`,
//!   `rope.scaling.original_context_length`, `rope.scaling.attn_factor` from the converter's
//!   rule); llama.cpp runs the toys with a context of 256, past `phi3-long`'s original context of
//!   64 (the long factors apply) and within `phi3-short`'s 256 (the short ones).

use crate::gguf::GgufWriter;

/// Every family [`toy_gguf`] makes.
pub const FAMILIES: [&str; 9] = [
    "llama",
    "llama3",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma3",
    "phi3",
    "phi3-long",
    "phi3-short",
];

/// Which vocabulary a toy carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VocabKind {
    /// SentencePiece (`tokenizer.ggml.model = llama`): `<unk>` 0, `<s>` 1, `</s>` 2, 256 byte tokens.
    Spm,
    /// Gemma's SentencePiece layout: `<pad>` 0, `<eos>` 1, `<bos>` 2, `<unk>` 3, turn markers.
    Gemma,
    /// Phi-3's: [`VocabKind::Spm`] then its chat markers, `<|endoftext|>` (the EOS) first.
    Phi3,
    /// GPT-2 byte-level BPE (`tokenizer.ggml.model = gpt2`, pre-tokenizer `qwen2`) with merges.
    Gpt2,
}

/// One toy's hyperparameters and layout switches.
#[derive(Debug, Clone, Copy)]
pub struct ToySpec {
    pub family: &'static str,
    /// `general.architecture`.
    pub arch: &'static str,
    pub n_layer: u32,
    pub dim: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
    /// Key and value length per head (written as `attention.key_length`/`value_length`).
    pub head_dim: u32,
    pub n_ff: u32,
    /// Rotated dimensions per head (`rope.dimension_count`).
    pub n_rot: u32,
    pub rope_base: f32,
    pub rms_eps: f32,
    pub context: u32,
    pub vocab: VocabKind,
    /// No `output.weight`: the classifier is `token_embd.weight`.
    pub tied: bool,
    pub qkv_bias: bool,
    pub qk_norm: bool,
    /// Gemma's `post_attention_norm` and `post_ffw_norm`.
    pub post_norms: bool,
    /// Fused `attn_qkv` and `ffn_up` holding gate and up (phi3).
    pub fused: bool,
    pub sliding_window: Option<u32>,
    /// Write `rope_freqs.weight` from Llama 3's frequency rule with these (factor, low-frequency
    /// factor, high-frequency factor, original context).
    pub llama3_rope: Option<(f32, f32, f32, f32)>,
    /// Write LongRoPE's two factor sets ([`long_rope_factors`]) with this original context.
    pub long_rope: Option<u32>,
}

const BASE: ToySpec = ToySpec {
    family: "llama",
    arch: "llama",
    n_layer: 3,
    dim: 64,
    n_head: 4,
    n_head_kv: 2,
    head_dim: 16,
    n_ff: 160,
    n_rot: 16,
    rope_base: 10000.0,
    rms_eps: 1e-5,
    context: 256,
    vocab: VocabKind::Spm,
    tied: false,
    qkv_bias: false,
    qk_norm: false,
    post_norms: false,
    fused: false,
    sliding_window: None,
    llama3_rope: None,
    long_rope: None,
};

const PHI3: ToySpec = ToySpec {
    family: "phi3",
    arch: "phi3",
    n_layer: 2,
    n_head: 2,
    n_head_kv: 1,
    head_dim: 32,
    n_rot: 24,
    n_ff: 128,
    vocab: VocabKind::Phi3,
    fused: true,
    ..BASE
};

/// The spec of `family`, or `None` for a family this module does not make.
pub fn toy_spec(family: &str) -> Option<ToySpec> {
    let spec = match family {
        "llama" => BASE,
        "llama3" => ToySpec {
            family: "llama3",
            n_head: 2,
            n_head_kv: 1,
            head_dim: 32,
            n_rot: 32,
            rope_base: 500000.0,
            tied: true,
            // Llama 3.2's factor 32, low 1, high 4; the original context shrunk from 8192 to 64 so
            // that the toy's 32 rotary pairs fall in all three bands of the rule.
            llama3_rope: Some((32.0, 1.0, 4.0, 64.0)),
            ..BASE
        },
        "mistral" => ToySpec {
            family: "mistral",
            n_layer: 2,
            n_head: 4,
            n_head_kv: 1,
            n_ff: 192,
            rope_base: 1e6,
            ..BASE
        },
        "qwen2" => ToySpec {
            family: "qwen2",
            arch: "qwen2",
            n_head_kv: 1,
            n_ff: 128,
            rope_base: 1e6,
            rms_eps: 1e-6,
            vocab: VocabKind::Gpt2,
            tied: true,
            qkv_bias: true,
            ..BASE
        },
        "qwen3" => ToySpec {
            family: "qwen3",
            arch: "qwen3",
            head_dim: 32,
            n_rot: 32,
            n_ff: 128,
            rope_base: 1e6,
            rms_eps: 1e-6,
            vocab: VocabKind::Gpt2,
            qk_norm: true,
            ..BASE
        },
        "gemma3" => ToySpec {
            family: "gemma3",
            arch: "gemma3",
            n_layer: 6,
            n_head_kv: 1,
            head_dim: 32,
            n_rot: 32,
            n_ff: 128,
            rope_base: 1e6,
            rms_eps: 1e-6,
            vocab: VocabKind::Gemma,
            tied: true,
            qk_norm: true,
            post_norms: true,
            sliding_window: Some(8),
            ..BASE
        },
        "phi3" => PHI3,
        "phi3-long" => ToySpec {
            family: "phi3-long",
            long_rope: Some(64),
            ..PHI3
        },
        "phi3-short" => ToySpec {
            family: "phi3-short",
            long_rope: Some(256),
            ..PHI3
        },
        _ => return None,
    };
    Some(spec)
}

/// The toy GGUF file of `family` (one of [`FAMILIES`]), or `None` for another name.
pub fn toy_gguf(family: &str) -> Option<Vec<u8>> {
    toy_spec(family).map(|s| toy_writer(&s).to_bytes())
}

/// The toy GGUF of `family` ([`toy_gguf`]) loaded: its description and weights, read from a
/// scratch file that is removed again.
pub fn toy_model(family: &str) -> Option<model::gguf::GgufModel> {
    let dir = crate::files::ScratchDir::new(&format!("toy-{family}"));
    let path = dir.join(format!("{family}.gguf"));
    std::fs::write(&path, toy_gguf(family)?).expect("a scratch file");
    Some(model::gguf::GgufModel::load(&path).expect("a toy GGUF loads"))
}

/// The toy of `spec` as a writer, for tests that add or change entries before writing.
pub fn toy_writer(spec: &ToySpec) -> GgufWriter {
    let mut w = GgufWriter::new();
    let vocab = vocabulary(spec.vocab);
    write_hparams(&mut w, spec);
    write_vocab(&mut w, spec, &vocab);
    let mut rng = Rng::new(spec.family);
    write_tensors(&mut w, spec, vocab.tokens.len() as u64, &mut rng);
    w
}

fn write_hparams(w: &mut GgufWriter, s: &ToySpec) {
    let a = s.arch;
    w.kv("general.architecture", a)
        .kv("general.name", format!("htpkv toy {}", s.family))
        .kv("general.file_type", 0u32)
        .kv(&format!("{a}.context_length"), s.context)
        .kv(&format!("{a}.embedding_length"), s.dim)
        .kv(&format!("{a}.block_count"), s.n_layer)
        .kv(&format!("{a}.feed_forward_length"), s.n_ff)
        .kv(&format!("{a}.attention.head_count"), s.n_head)
        .kv(&format!("{a}.attention.head_count_kv"), s.n_head_kv)
        .kv(&format!("{a}.attention.layer_norm_rms_epsilon"), s.rms_eps)
        .kv(&format!("{a}.rope.freq_base"), s.rope_base)
        .kv(&format!("{a}.rope.dimension_count"), s.n_rot);
    if s.head_dim != s.dim / s.n_head {
        w.kv(&format!("{a}.attention.key_length"), s.head_dim)
            .kv(&format!("{a}.attention.value_length"), s.head_dim);
    }
    if let Some(window) = s.sliding_window {
        w.kv(&format!("{a}.attention.sliding_window"), window);
    }
    if let Some(original) = s.long_rope {
        w.kv(
            &format!("{a}.rope.scaling.original_context_length"),
            original,
        )
        .kv(
            &format!("{a}.rope.scaling.attn_factor"),
            long_rope_attn_factor(s.context, original),
        );
    }
}

/// LongRoPE's attention factor by the converter's rule: `sqrt(1 + ln(s) / ln(original))` for
/// `s = context / original` above 1, else 1.
pub fn long_rope_attn_factor(context: u32, original: u32) -> f32 {
    let s = f64::from(context) / f64::from(original);
    if s > 1.0 {
        (1.0 + s.ln() / f64::from(original).ln()).sqrt() as f32
    } else {
        1.0
    }
}

/// LongRoPE's (short, long) divisors of a toy, one per rotated pair: short ones near 1, long ones
/// growing with the pair's wavelength as Phi-3's do (1 to about 1 + pairs / 2).
pub fn long_rope_factors(n_rot: u32) -> (Vec<f32>, Vec<f32>) {
    let pairs = n_rot / 2;
    let short = (0..pairs).map(|i| 1.0 + 0.05 * i as f32).collect();
    let long = (0..pairs).map(|i| 1.0 + 0.5 * i as f32).collect();
    (short, long)
}

/// A vocabulary as GGUF stores it.
struct Vocab {
    model: &'static str,
    tokens: Vec<String>,
    scores: Vec<f32>,
    types: Vec<i32>,
    merges: Vec<String>,
    bos: u32,
    eos: u32,
    specials: Vec<(&'static str, u32)>,
}

// llama.cpp's token types.
const NORMAL: i32 = 1;
const UNKNOWN: i32 = 2;
const CONTROL: i32 = 3;
const BYTE: i32 = 6;

/// Word pieces every toy vocabulary has (after its specials and byte tokens).
const WORDS: [&str; 40] = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "that",
    "it",
    "for",
    "on",
    "with",
    "as",
    "at",
    "capital",
    "France",
    "Paris",
    "Once",
    "upon",
    "time",
    "there",
    "def",
    "return",
    "fibonacci",
    "The",
    "a",
    "an",
    "he",
    "she",
    "they",
    "one",
    "two",
    "if",
    "else",
    "n",
    "not",
    "be",
    "by",
    "from",
    "this",
];

fn vocabulary(kind: VocabKind) -> Vocab {
    match kind {
        VocabKind::Spm | VocabKind::Gemma => spm_vocab(kind == VocabKind::Gemma),
        VocabKind::Phi3 => phi3_vocab(),
        VocabKind::Gpt2 => gpt2_vocab(),
    }
}

fn spm_vocab(gemma: bool) -> Vocab {
    let head: &[(&str, i32)] = if gemma {
        &[
            ("<pad>", CONTROL),
            ("<eos>", CONTROL),
            ("<bos>", CONTROL),
            ("<unk>", UNKNOWN),
            ("<start_of_turn>", CONTROL),
            ("<end_of_turn>", CONTROL),
        ]
    } else {
        &[("<unk>", UNKNOWN), ("<s>", CONTROL), ("</s>", CONTROL)]
    };
    let mut v = Vocab {
        model: "llama",
        tokens: Vec::new(),
        scores: Vec::new(),
        types: Vec::new(),
        merges: Vec::new(),
        bos: if gemma { 2 } else { 1 },
        eos: if gemma { 1 } else { 2 },
        specials: if gemma {
            vec![("unknown", 3), ("padding", 0)]
        } else {
            vec![("unknown", 0)]
        },
    };
    let mut push = |t: String, score: f32, ty: i32| {
        v.tokens.push(t);
        v.scores.push(score);
        v.types.push(ty);
    };
    head.iter().for_each(|(t, ty)| push((*t).into(), 0.0, *ty));
    (0..=255u8).for_each(|b| push(format!("<0x{b:02X}>"), 0.0, BYTE));
    // Single characters, then whole words with and without the word-start mark `▁`; longer
    // pieces score higher so the tokenizer prefers them.
    let chars = ('a'..='z')
        .chain('A'..='Z')
        .chain('0'..='9')
        .chain(" .,:;!?()'\"-=+*/".chars());
    let mut pieces: Vec<String> = chars.map(|c| c.to_string()).collect();
    pieces.push("\u{2581}".into());
    pieces.extend(WORDS.iter().map(|w| format!("\u{2581}{w}")));
    pieces.extend(WORDS.iter().filter(|w| w.len() > 2).map(|w| w.to_string()));
    pieces.sort();
    pieces.dedup();
    for p in pieces {
        let score = p.chars().count() as f32 - 10.0;
        push(p, score, NORMAL);
    }
    v
}

/// llama.cpp requires `<|endoftext|>` in a vocabulary whose model is named like Phi-3.
fn phi3_vocab() -> Vocab {
    let mut v = spm_vocab(false);
    v.eos = v.tokens.len() as u32;
    for t in [
        "<|endoftext|>",
        "<|assistant|>",
        "<|end|>",
        "<|system|>",
        "<|user|>",
    ] {
        v.tokens.push(t.into());
        v.scores.push(0.0);
        v.types.push(CONTROL);
    }
    v
}

/// GPT-2's byte-to-character map: printable bytes stand for themselves, the others for the code
/// points from 256 up, in byte order.
fn gpt2_byte_char(b: u8) -> char {
    let printable = |b: u8| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|x| !printable(*x)).count() as u32;
    char::from_u32(256 + rank).expect("a code point below 512")
}

fn gpt2_vocab() -> Vocab {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| gpt2_byte_char(b).to_string()).collect();
    let mut merges = Vec::new();
    // Each word with its leading space (`Ġ`) is built left to right, one merge per character.
    for w in WORDS {
        let chars: Vec<String> = format!("\u{120}{w}").chars().map(String::from).collect();
        let mut acc = chars[0].clone();
        for c in &chars[1..] {
            let merged = format!("{acc}{c}");
            if !tokens.contains(&merged) {
                merges.push(format!("{acc} {c}"));
                tokens.push(merged.clone());
            }
            acc = merged;
        }
    }
    let n_normal = tokens.len();
    tokens.extend(["<|endoftext|>", "<|im_start|>", "<|im_end|>"].map(String::from));
    let mut types = vec![NORMAL; n_normal];
    types.extend([CONTROL; 3]);
    let end = n_normal as u32;
    Vocab {
        model: "gpt2",
        scores: Vec::new(),
        types,
        merges,
        bos: end,
        eos: end + 2,
        specials: vec![("padding", end)],
        tokens,
    }
}

fn write_vocab(w: &mut GgufWriter, s: &ToySpec, v: &Vocab) {
    w.kv("tokenizer.ggml.model", v.model);
    if v.model == "gpt2" {
        w.kv("tokenizer.ggml.pre", "qwen2");
    }
    w.str_array("tokenizer.ggml.tokens", &v.tokens);
    if !v.scores.is_empty() {
        w.kv("tokenizer.ggml.scores", v.scores.clone());
    }
    w.kv("tokenizer.ggml.token_type", v.types.clone());
    if !v.merges.is_empty() {
        w.str_array("tokenizer.ggml.merges", &v.merges);
    }
    w.kv("tokenizer.ggml.bos_token_id", v.bos)
        .kv("tokenizer.ggml.eos_token_id", v.eos);
    for (name, id) in &v.specials {
        w.kv(&format!("tokenizer.ggml.{name}_token_id"), *id);
    }
    w.kv("tokenizer.ggml.add_bos_token", v.model != "gpt2");
    if s.vocab == VocabKind::Gemma {
        w.kv("tokenizer.ggml.add_space_prefix", false);
        w.kv("tokenizer.chat_template", GEMMA_TEMPLATE);
    }
    if v.model == "gpt2" {
        w.kv("tokenizer.chat_template", CHATML_TEMPLATE);
    }
}

/// Gemma's turn format (written for htpkv): each message as `<start_of_turn>ROLE\n…<end_of_turn>\n`
/// with the assistant's role named `model` and a system message prefixed to the first user turn.
const GEMMA_TEMPLATE: &str = "{{ bos_token }}\
{% set sys = messages[0]['content'] + '\\n\\n' if messages[0]['role'] == 'system' else '' %}\
{% for m in messages if m['role'] != 'system' %}\
{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\\n' \
+ (sys if loop.first else '') + (m['content'] | trim) + '<end_of_turn>\\n' }}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}";

/// ChatML (written for htpkv): `<|im_start|>ROLE\n…<|im_end|>\n` per message.
const CHATML_TEMPLATE: &str = "{% for m in messages %}\
{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// A matrix of `rows` outputs over `cols` inputs: GGUF dims `[cols, rows]`.
fn matrix(w: &mut GgufWriter, rng: &mut Rng, name: &str, rows: u32, cols: u32, gain: f32) {
    let bound = gain * (3.0 / cols as f32).sqrt();
    let data = rng.uniform_vec(rows as usize * cols as usize, bound);
    w.tensor_f32(name, &[u64::from(cols), u64::from(rows)], &data);
}

/// A norm weight near 1 (Gemma's stored weights are already `1 + w`).
fn norm(w: &mut GgufWriter, rng: &mut Rng, name: &str, n: u32) {
    let data: Vec<f32> = rng
        .uniform_vec(n as usize, 0.25)
        .iter()
        .map(|x| 1.0 + x)
        .collect();
    w.tensor_f32(name, &[u64::from(n)], &data);
}

fn bias(w: &mut GgufWriter, rng: &mut Rng, name: &str, n: u32) {
    let data = rng.uniform_vec(n as usize, 0.5);
    w.tensor_f32(name, &[u64::from(n)], &data);
}

/// Query and key gains above 1 make attention peaked rather than uniform; the classifier's gain
/// makes the logits' spread several units.
const QK_GAIN: f32 = 1.5;
const OUT_GAIN: f32 = 4.0;

fn write_tensors(w: &mut GgufWriter, s: &ToySpec, n_vocab: u64, rng: &mut Rng) {
    let emb = rng.uniform_vec(n_vocab as usize * s.dim as usize, 1.0);
    w.tensor_f32("token_embd.weight", &[u64::from(s.dim), n_vocab], &emb);
    norm(w, rng, "output_norm.weight", s.dim);
    if !s.tied {
        matrix(w, rng, "output.weight", n_vocab as u32, s.dim, OUT_GAIN);
    }
    if let Some(rule) = s.llama3_rope {
        let f = llama3_rope_factors(s.rope_base, s.n_rot, rule);
        w.tensor_f32("rope_freqs.weight", &[f.len() as u64], &f);
    }
    if s.long_rope.is_some() {
        let (short, long) = long_rope_factors(s.n_rot);
        w.tensor_f32("rope_factors_long.weight", &[long.len() as u64], &long);
        w.tensor_f32("rope_factors_short.weight", &[short.len() as u64], &short);
    }
    for l in 0..s.n_layer {
        write_layer(w, s, rng, &format!("blk.{l}"));
    }
}

fn write_layer(w: &mut GgufWriter, s: &ToySpec, rng: &mut Rng, p: &str) {
    let (q, kv) = (s.n_head * s.head_dim, s.n_head_kv * s.head_dim);
    norm(w, rng, &format!("{p}.attn_norm.weight"), s.dim);
    if s.fused {
        let bound = QK_GAIN * (3.0 / s.dim as f32).sqrt();
        let data = rng.uniform_vec(((q + 2 * kv) * s.dim) as usize, bound);
        let dims = [u64::from(s.dim), u64::from(q + 2 * kv)];
        w.tensor_f32(&format!("{p}.attn_qkv.weight"), &dims, &data);
    } else {
        matrix(w, rng, &format!("{p}.attn_q.weight"), q, s.dim, QK_GAIN);
        matrix(w, rng, &format!("{p}.attn_k.weight"), kv, s.dim, QK_GAIN);
        matrix(w, rng, &format!("{p}.attn_v.weight"), kv, s.dim, 1.0);
    }
    if s.qkv_bias {
        bias(w, rng, &format!("{p}.attn_q.bias"), q);
        bias(w, rng, &format!("{p}.attn_k.bias"), kv);
        bias(w, rng, &format!("{p}.attn_v.bias"), kv);
    }
    if s.qk_norm {
        norm(w, rng, &format!("{p}.attn_q_norm.weight"), s.head_dim);
        norm(w, rng, &format!("{p}.attn_k_norm.weight"), s.head_dim);
    }
    matrix(w, rng, &format!("{p}.attn_output.weight"), s.dim, q, 1.0);
    if s.post_norms {
        norm(w, rng, &format!("{p}.post_attention_norm.weight"), s.dim);
    }
    norm(w, rng, &format!("{p}.ffn_norm.weight"), s.dim);
    if s.fused {
        matrix(
            w,
            rng,
            &format!("{p}.ffn_up.weight"),
            2 * s.n_ff,
            s.dim,
            1.0,
        );
    } else {
        matrix(w, rng, &format!("{p}.ffn_gate.weight"), s.n_ff, s.dim, 1.0);
        matrix(w, rng, &format!("{p}.ffn_up.weight"), s.n_ff, s.dim, 1.0);
    }
    matrix(w, rng, &format!("{p}.ffn_down.weight"), s.dim, s.n_ff, 1.0);
    if s.post_norms {
        norm(w, rng, &format!("{p}.post_ffw_norm.weight"), s.dim);
    }
}

/// Llama 3's rotary frequency divisors, one per rotated pair: 1 for wavelengths shorter than
/// `original / high`, `factor` for those longer than `original / low`, and a smooth blend between.
pub fn llama3_rope_factors(
    base: f32,
    n_rot: u32,
    (factor, low, high, original): (f32, f32, f32, f32),
) -> Vec<f32> {
    let (low_wavelen, high_wavelen) = (original / low, original / high);
    (0..n_rot / 2)
        .map(|i| {
            let freq = 1.0 / base.powf(2.0 * i as f32 / n_rot as f32);
            let wavelen = 2.0 * std::f32::consts::PI / freq;
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (original / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            }
        })
        .collect()
}

/// SplitMix64, seeded by the family's name, so every toy is reproducible bit for bit.
struct Rng(u64);

impl Rng {
    fn new(seed: &str) -> Self {
        // FNV-1a of the name.
        let h = seed.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        Rng(h)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[-bound, bound)`.
    fn uniform_vec(&mut self, n: usize, bound: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let u = (self.next() >> 40) as f32 / (1u64 << 24) as f32;
                (2.0 * u - 1.0) * bound
            })
            .collect()
    }
}

/// llama.cpp's recorded outputs on one toy (`model/tests/fixtures/llamacpp/<family>.json`, made
/// by `scripts/llamacpp-reference.py toys`).
#[derive(Debug, Clone, PartialEq)]
pub struct LlamacppFixture {
    pub family: String,
    /// The llama.cpp commit that computed the values.
    pub llama_cpp_commit: String,
    /// SHA-256 (lower-case hex) of the toy GGUF file the values were computed on.
    pub gguf_sha256: String,
    pub n_vocab: usize,
    /// The context llama.cpp ran with (its `n_ctx`, padded by llama.cpp to a multiple of 256):
    /// the context htpkv binds the description to (LongRoPE picks its factors by it).
    pub context: usize,
    /// The token ids fed at positions 0, 1, ... (BOS first).
    pub tokens: Vec<u32>,
    /// The positions whose logits were recorded.
    pub positions: Vec<usize>,
    /// Full-vocabulary f32 logits, one row per entry of `positions`.
    pub logits: Vec<Vec<f32>>,
    /// exp of the mean over i in 0..n-1 of -ln p(tokens[i+1] | tokens[..=i]), from llama.cpp's
    /// logits at every position.
    pub perplexity: f64,
}

/// The directory of the recorded llama.cpp fixtures.
pub fn fixture_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/llamacpp")
}

/// The recorded llama.cpp outputs on `family`'s toy. Panics (a test's failure) with the file's
/// name when it is missing or malformed.
pub fn llamacpp_fixture(family: &str) -> LlamacppFixture {
    let path = fixture_dir().join(format!("{family}.json"));
    let text = model::fsio::read_text_capped(&path, model::fsio::FileKind::HF_JSON)
        .unwrap_or_else(|e| panic!("{e}"));
    let v: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let field = |k: &str| {
        v.get(k)
            .unwrap_or_else(|| panic!("{}: no field {k}", path.display()))
    };
    let string = |k: &str| field(k).as_str().map(str::to_owned);
    let floats = |x: &serde_json::Value| -> Option<Vec<f32>> {
        x.as_array()?
            .iter()
            .map(|f| f.as_f64().map(|f| f as f32))
            .collect()
    };
    let ints =
        |k: &str| -> Option<Vec<u64>> { field(k).as_array()?.iter().map(|x| x.as_u64()).collect() };
    let parsed = (|| {
        Some(LlamacppFixture {
            family: string("family")?,
            llama_cpp_commit: string("llama_cpp_commit")?,
            gguf_sha256: string("gguf_sha256")?,
            n_vocab: field("n_vocab").as_u64()? as usize,
            context: field("context").as_u64()? as usize,
            tokens: ints("tokens")?.into_iter().map(|t| t as u32).collect(),
            positions: ints("positions")?.into_iter().map(|p| p as usize).collect(),
            logits: field("logits")
                .as_array()?
                .iter()
                .map(floats)
                .collect::<Option<_>>()?,
            perplexity: field("perplexity").as_f64()?,
        })
    })();
    parsed.unwrap_or_else(|| panic!("{}: a field has the wrong type", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_made_and_others_are_not() {
        for f in FAMILIES {
            let spec = toy_spec(f).unwrap();
            assert_eq!(spec.family, f);
            assert!(toy_gguf(f).is_some_and(|b| b.starts_with(b"GGUF")));
        }
        assert!(toy_gguf("gpt-j").is_none());
    }

    #[test]
    fn llama3_factors_cover_all_three_bands() {
        let s = toy_spec("llama3").unwrap();
        let f = llama3_rope_factors(s.rope_base, s.n_rot, s.llama3_rope.unwrap());
        assert_eq!(f.len(), 16);
        assert_eq!(f[0], 1.0);
        assert_eq!(f[15], 32.0);
        assert!(f.iter().any(|x| *x > 1.0 && *x < 32.0), "{f:?}");
    }

    #[test]
    fn gpt2_byte_map_is_a_bijection_onto_printable_characters() {
        let chars: std::collections::BTreeSet<char> = (0..=255u8).map(gpt2_byte_char).collect();
        assert_eq!(chars.len(), 256);
        assert_eq!(gpt2_byte_char(b' '), '\u{120}');
        assert_eq!(gpt2_byte_char(b'A'), 'A');
    }
}

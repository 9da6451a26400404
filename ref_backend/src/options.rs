//! Compile options and their stable fingerprint.

use graph_io::LogitRows;
use quant::DataType;

use crate::bytes::{Fnv64, Writer};
use crate::types::{Granularity, KLayout, WeightType};

/// Default calibration prompts (story openings in the style of TinyStories). The CLI and the
/// tests tokenize these (with BOS) when no prompt file is given, so both compile the same model;
/// [`crate::compile`] takes the token sequences.
pub const DEFAULT_CALIBRATION_PROMPTS: &[&str] = &[
    "Once upon a time",
    "One day, a little girl named Lily went to the park",
    "Tom and his dog Max liked to play in the garden",
    "The sun was shining and the birds were singing",
    "Mia had a big red ball",
    "There was a small boat on the lake",
];

/// Default calibration conversations for chat models (user question, assistant answer): what
/// a chat model sees, rendered with the model's chat template by the caller. Varied on purpose
/// (facts, explanation, a list, code, arithmetic, a letter), because the fixed-point KV ranges
/// are fixed by what calibration shows the model: values outside them are clipped.
pub const DEFAULT_CALIBRATION_CHATS: &[(&str, &str)] = &[
    (
        "What is the capital of France, and what is it known for?",
        "The capital of France is Paris. It is known for the Eiffel Tower, the Louvre museum, \
         its cafes and bakeries, and the river Seine, which divides the city into the Left Bank \
         and the Right Bank. About two million people live in the city itself.",
    ),
    (
        "Explain why the sky is blue in two sentences.",
        "Sunlight contains all colors, and when it passes through the atmosphere the short blue \
         wavelengths are scattered by gas molecules much more strongly than red ones. That \
         scattered blue light reaches our eyes from every direction, so the whole sky looks blue.",
    ),
    (
        "Give me a list of five healthy breakfast ideas.",
        "1. Oatmeal with berries and a spoon of peanut butter.\n2. Greek yogurt with honey and \
         walnuts.\n3. Whole-grain toast with avocado and a boiled egg.\n4. A smoothie of banana, \
         spinach and milk.\n5. Scrambled eggs with tomatoes and peppers.",
    ),
    (
        "Write a Python function that returns the sum of the even numbers in a list.",
        "Here is a short solution:\n\n```python\ndef sum_even(numbers):\n    total = 0\n    \
         for n in numbers:\n        if n % 2 == 0:\n            total += n\n    return total\n```\n\n\
         For example, sum_even([1, 2, 3, 4]) returns 6.",
    ),
    (
        "If a train travels 120 kilometers in 1.5 hours, what is its average speed?",
        "Average speed is distance divided by time: 120 km / 1.5 h = 80 km/h. So the train \
         travels at an average speed of 80 kilometers per hour.",
    ),
    (
        "Write a short note thanking my neighbor for watering my plants.",
        "Dear Mrs. Thompson,\n\nThank you so much for watering my plants while I was away last \
         week. They look greener than ever! I really appreciate your kindness, and I would be \
         happy to return the favor anytime.\n\nWarm regards,\nDaniel",
    ),
];

/// Default length (prompt + greedy continuation, in tokens) of one calibration sequence.
pub const DEFAULT_CALIBRATION_TOKENS: usize = 128;

/// Largest [`CompileOptions::calibration_tokens`] a compiled file holds (2^20).
pub const MAX_CALIBRATION_TOKENS: usize = 1 << 20;

/// Version of the calibration algorithm; part of [`CompileOptions::fingerprint`], so cached
/// compiled files are rebuilt when the calibration changes. 3: i8 builds fold the FFN
/// smoothing ([`crate::FFN_SMOOTHING`]) into `Up`/`Down` and calibrate the down input smoothed.
/// 4: integer weights are rounded by their output error over calibration ([`crate::Rounding`]),
/// and u16 K/V ranges are widened by [`crate::U16_KV_MARGIN`]. 5: `i4` builds keep V and down
/// on the i8 grid ([`crate::I4_KEPT_AT_8_BITS`]).
pub const CALIBRATION_VERSION: u32 = 5;

/// What to compile.
///
/// Invariants checked by [`crate::compile`]: `2 <= context <=` the model's context length,
/// every AR variant `n` satisfies `1 <= n < context` and appears once, `kv_dtype` is `u8`,
/// `u16`, `f16` or `f32`. The calibration sequences are an argument of [`crate::compile`]
/// (needed when KV is `u8`/`u16` or weights are `i8`), not an option: the options say how to
/// compile, not from what.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CompileOptions {
    /// Context length S (past window S-n plus n new tokens).
    pub context: usize,
    /// The AR variants (tokens per step), one graph each returning every row's logits.
    pub ar: Vec<usize>,
    /// Whether each AR variant n > 1 also gets a prefill graph returning only the last row's
    /// logits ([`graph_io::LogitRows::Last`]; [`CompileOptions::graph_set`]). Only under a
    /// naming whose convention allows it ([`graph_io::Convention::last_row_graphs`]).
    pub last_row: bool,
    /// KV cache element type: `u8`/`u16` (asymmetric fixed point, one encoding per
    /// (layer, KV head, K|V)), `f16` or `f32`.
    pub kv_dtype: DataType,
    /// Weight storage type.
    pub weights: WeightType,
    /// Layout of the key tensors.
    pub k_layout: KLayout,
    /// KV tensor granularity.
    pub granularity: Granularity,
    /// Each calibration sequence is continued greedily by the float model until the sequence
    /// holds this many tokens (or the model emits BOS/EOS, or the context is full).
    pub calibration_tokens: usize,
}

impl CompileOptions {
    /// Options with the given context and AR variants and defaults otherwise: KV `u8`,
    /// weights `i8`, keys in rows, per-head tensors, [`DEFAULT_CALIBRATION_TOKENS`].
    pub fn new(context: usize, ar: Vec<usize>) -> Self {
        CompileOptions {
            context,
            ar,
            last_row: false,
            kv_dtype: DataType::U8,
            weights: WeightType::I8,
            k_layout: KLayout::Rows,
            granularity: Granularity::PerHead,
            calibration_tokens: DEFAULT_CALIBRATION_TOKENS,
        }
    }

    /// The graphs compiled, in file order: the one declaration of the graph set, which the
    /// executor, the file and the HTP lowering read ([`graph_io::graph_set`]).
    pub fn graph_set(&self) -> Vec<(usize, LogitRows)> {
        graph_io::graph_set(&self.ar, self.last_row)
    }

    /// True when compiling needs calibration (fixed-point KV or i8 weights).
    pub fn needs_calibration(&self) -> bool {
        self.kv_dtype.is_fixed_point() || self.weights.is_integer()
    }

    /// The canonical byte form (also the options section of the file format).
    pub(crate) fn encode(&self, w: &mut Writer) {
        w.len(self.context);
        w.len(self.ar.len());
        for &n in &self.ar {
            w.len(n);
        }
        w.u8(kv_code(self.kv_dtype));
        w.u8(match self.weights {
            WeightType::I8 => 0,
            WeightType::F16 => 1,
            WeightType::F32 => 2,
            WeightType::I4 => 3,
            WeightType::I8F16 => 4,
        });
        w.u8(match self.k_layout {
            KLayout::Rows => 0,
            KLayout::Transposed => 1,
        });
        w.u8(match self.granularity {
            Granularity::PerHead => 0,
            Granularity::PerLayer => 1,
        });
        w.len(self.calibration_tokens);
        // Only files with last-row graphs ([`crate::LAST_ROW_FORMAT_VERSION`]) carry the flag,
        // so the options of every other file encode (and fingerprint) as before.
        if self.last_row {
            w.u8(1);
        }
    }

    /// A stable 64-bit fingerprint of these options together with the file-format and
    /// calibration versions (FNV-1a over the canonical byte form): equal options give equal
    /// fingerprints on every platform and build, so a runtime can cache compiled files per
    /// settings. It covers neither the model nor the calibration sequences: key the cache on
    /// those too.
    pub fn fingerprint(&self) -> u64 {
        let mut w = Writer::default();
        w.bytes(b"htpkv-ref_backend");
        w.u32(crate::types::FORMAT_VERSION);
        w.u32(CALIBRATION_VERSION);
        self.encode(&mut w);
        let mut h = Fnv64::new();
        h.write(&w.buf);
        h.finish()
    }

    /// [`Self::fingerprint`] as 16 lowercase hex digits.
    pub fn fingerprint_hex(&self) -> String {
        format!("{:016x}", self.fingerprint())
    }
}

pub(crate) fn kv_code(d: DataType) -> u8 {
    match d {
        DataType::U8 => 0,
        DataType::U16 => 1,
        DataType::F16 => 2,
        DataType::F32 => 3,
        DataType::I8 => 4,
        DataType::I16 => 5,
        // Never a KV dtype (`validate_options` rejects it); no code reads back as i32.
        DataType::I32 => 6,
    }
}

pub(crate) fn kv_from_code(c: u8) -> Option<DataType> {
    Some(match c {
        0 => DataType::U8,
        1 => DataType::U16,
        2 => DataType::F16,
        3 => DataType::F32,
        4 => DataType::I8,
        5 => DataType::I16,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_is_stable_and_sensitive() {
        let a = CompileOptions::new(512, vec![1, 32]);
        let mut b = a.clone();
        assert_eq!(a.fingerprint(), b.fingerprint());
        b.kv_dtype = DataType::U16;
        assert_ne!(a.fingerprint(), b.fingerprint());
        let mut c = a.clone();
        c.calibration_tokens += 1;
        assert_ne!(a.fingerprint(), c.fingerprint());
        let mut d = a.clone();
        d.ar = vec![32, 1];
        assert_ne!(a.fingerprint(), d.fingerprint());
        let mut e = a.clone();
        e.last_row = true;
        assert_ne!(a.fingerprint(), e.fingerprint());
        assert_eq!(a.fingerprint_hex().len(), 16);
    }

    /// The fingerprint keys on-disk caches: it must not change between builds unless the
    /// format or calibration version (or the canonical encoding) deliberately changes.
    #[test]
    fn fingerprint_is_pinned() {
        let o = CompileOptions::new(512, vec![1, 32]);
        // Changed deliberately with CALIBRATION_VERSION 5 (i4 builds keep V and down at 8 bits).
        assert_eq!(o.fingerprint_hex(), "ede362b8d7bdf041");
    }
}

//! The model description in a compiled file: key–value metadata (the `DESC` section of format
//! version 6, [`crate::format`]), one entry per property of [`LlamaConfig`], so a property added
//! to the description is a key added here, not a new field layout.
//!
//! Section layout: an entry count (u64), then per entry a key (u64 length + UTF-8), a type byte
//! and the value: 0 an unsigned integer (u64), 1 an f32, 2 a string (u64 length + UTF-8), 3 an
//! f32 list (u64 count + values), 4 an unsigned list (u64 count + u64 values). Optional
//! properties are absent when unset. A key this build does not know, a repeated key, a value of
//! the wrong type or a missing required key make the file corrupt (a newer htpkv's file says
//! so by its key).

use std::collections::BTreeMap;

use model::{
    Activation, Block, Llama3Scaling, LlamaConfig, LongRope, RopeConfig, RopePairing,
    SpecialTokens, limits,
};

use crate::bytes::{Reader, Writer};
use crate::error::FormatError;

/// One value of the metadata.
#[derive(Debug, Clone, PartialEq)]
enum Val {
    Int(u64),
    F32(f32),
    Str(String),
    F32s(Vec<f32>),
    Ints(Vec<u64>),
}

/// The description as key–value entries, in key order.
fn entries(c: &LlamaConfig) -> BTreeMap<&'static str, Val> {
    let int = |v: usize| Val::Int(v as u64);
    let flag = |b: bool| Val::Int(u64::from(b));
    let mut m = BTreeMap::from([
        ("n_layers", int(c.n_layers)),
        ("dim", int(c.dim)),
        ("n_heads", int(c.n_heads)),
        ("n_kv_heads", int(c.n_kv_heads)),
        ("head_dim", int(c.head_dim)),
        ("hidden_dim", int(c.hidden_dim)),
        ("vocab_size", int(c.vocab_size)),
        ("context_length", int(c.context_length)),
        ("rms_eps", Val::F32(c.rms_eps)),
        ("rope.theta", Val::F32(c.rope.theta)),
        (
            "rope.pairing",
            Val::Str(pairing_name(c.rope.pairing).into()),
        ),
        ("tied_output", flag(c.tied_output)),
        ("block.qkv_bias", flag(c.block.qkv_bias)),
        ("block.qk_norm", flag(c.block.qk_norm)),
        (
            "block.post_attention_norm",
            flag(c.block.post_attention_norm),
        ),
        ("block.post_ffn_norm", flag(c.block.post_ffn_norm)),
        (
            "block.activation",
            Val::Str(c.block.activation.name().into()),
        ),
    ]);
    let mut opt = |k: &'static str, v: Option<Val>| {
        if let Some(v) = v {
            m.insert(k, v);
        }
    };
    let r = &c.rope;
    opt("rope.rotated", r.rotated.map(int));
    opt("rope.freq_factors", r.freq_factors.clone().map(Val::F32s));
    opt("rope.window_theta", r.window_theta.map(Val::F32));
    opt("rope.attn_factor", r.attn_factor.map(Val::F32));
    let long = r.long_rope.as_ref();
    opt(
        "rope.long_rope.short",
        long.map(|l| Val::F32s(l.short.clone())),
    );
    opt(
        "rope.long_rope.long",
        long.map(|l| Val::F32s(l.long.clone())),
    );
    opt(
        "rope.long_rope.original_context",
        long.map(|l| int(l.original_context)),
    );
    opt("rope.scaling.factor", r.scaling.map(|s| Val::F32(s.factor)));
    opt(
        "rope.scaling.low_freq_factor",
        r.scaling.map(|s| Val::F32(s.low_freq_factor)),
    );
    opt(
        "rope.scaling.high_freq_factor",
        r.scaling.map(|s| Val::F32(s.high_freq_factor)),
    );
    opt(
        "rope.scaling.original_context",
        r.scaling.map(|s| int(s.original_context)),
    );
    opt(
        "block.attention_scale",
        c.block.attention_scale.map(Val::F32),
    );
    opt("embed_scale", c.embed_scale.map(Val::F32));
    opt("final_softcap", c.final_softcap.map(Val::F32));
    let sp = &c.special;
    for (k, id) in [
        ("special.bos", sp.bos),
        ("special.eos", sp.eos),
        ("special.eot", sp.eot),
        ("special.pad", sp.pad),
    ] {
        opt(k, id.map(|t| Val::Int(t.into())));
    }
    let windows = || {
        c.layer_windows
            .iter()
            .map(|w| w.unwrap_or(0) as u64)
            .collect()
    };
    opt(
        "layer_windows",
        (!c.layer_windows.is_empty()).then(|| Val::Ints(windows())),
    );
    m
}

fn pairing_name(p: RopePairing) -> &'static str {
    match p {
        RopePairing::Adjacent => "adjacent",
        RopePairing::HalfSplit => "half_split",
    }
}

/// Writes the `DESC` section's body.
pub(crate) fn write(w: &mut Writer, c: &LlamaConfig) {
    let m = entries(c);
    w.len(m.len());
    for (k, v) in m {
        w.str(k);
        match v {
            Val::Int(x) => (w.u8(0), w.u64(x)).1,
            Val::F32(x) => (w.u8(1), w.f32(x)).1,
            Val::Str(s) => (w.u8(2), w.str(&s)).1,
            Val::F32s(v) => (w.u8(3), w.f32s(&v)).1,
            Val::Ints(v) => {
                w.u8(4);
                w.len(v.len());
                v.into_iter().for_each(|x| w.u64(x));
            }
        }
    }
}

/// Whether a description needs the `DESC` section: anything beyond what versions 4 and 5 hold
/// (the Llama block, Llama 3 scaling, windows), so that files of Llama-block models stay as they
/// were and their caches stay valid.
pub(crate) fn needs_desc(c: &LlamaConfig) -> bool {
    let plain = LlamaConfig {
        block: Block {
            qkv_bias: c.block.qkv_bias,
            ..Block::default()
        },
        rope: RopeConfig {
            theta: c.rope.theta,
            scaling: c.rope.scaling,
            pairing: c.rope.pairing,
            ..RopeConfig::default()
        },
        embed_scale: None,
        final_softcap: None,
        ..c.clone()
    };
    plain != *c
}

/// Reads the `DESC` section's body into a validated description.
pub(crate) fn read(s: &mut Reader<'_>) -> Result<LlamaConfig, FormatError> {
    let at = s.offset();
    let n = s.count("description entry count", 10)?;
    let mut m = BTreeMap::new();
    for _ in 0..n {
        let key_at = s.offset();
        let key = s.str("description key")?;
        let v = read_val(s, &key)?;
        if m.insert(key.clone(), (key_at, v)).is_some() {
            return Err(s.corrupt_at(key_at, format!("description key {key} repeated")));
        }
    }
    let mut d = Desc { s, m, at };
    let c = d.config()?;
    if let Some((k, (key_at, _))) = d.m.iter().next() {
        let why = format!("description key {k} is unknown to this build (a newer htpkv's file?)");
        return Err(d.s.corrupt_at(*key_at, why));
    }
    c.validate()
        .map_err(|e| d.s.corrupt_at(at, e.to_string()))?;
    Ok(c)
}

fn read_val(s: &mut Reader<'_>, key: &str) -> Result<Val, FormatError> {
    let at = s.offset();
    Ok(match s.u8(key)? {
        0 => Val::Int(s.u64(key)?),
        1 => Val::F32(s.f32(key)?),
        2 => Val::Str(s.str(key)?),
        3 => Val::F32s(s.f32s(key)?),
        4 => {
            let n = s.count(key, 8)?;
            (0..n)
                .map(|_| s.u64(key))
                .collect::<Result<_, _>>()
                .map(Val::Ints)?
        }
        t => return Err(s.corrupt_at(at, format!("description key {key} has type {t}"))),
    })
}

/// The entries being read, taken out one by one.
struct Desc<'r, 'a> {
    s: &'r mut Reader<'a>,
    m: BTreeMap<String, (u64, Val)>,
    at: u64,
}

impl Desc<'_, '_> {
    fn bad(&self, key: &str, why: &str) -> FormatError {
        self.s
            .corrupt_at(self.at, format!("description key {key}: {why}"))
    }

    fn take(&mut self, key: &str) -> Option<Val> {
        self.m.remove(key).map(|(_, v)| v)
    }

    fn int(&mut self, key: &str) -> Result<Option<usize>, FormatError> {
        match self.take(key) {
            None => Ok(None),
            Some(Val::Int(v)) if v <= limits::MAX_CONTEXT as u64 * 64 => Ok(Some(v as usize)),
            Some(_) => Err(self.bad(key, "not a count in range")),
        }
    }

    fn size(&mut self, key: &str) -> Result<usize, FormatError> {
        self.int(key)?.ok_or_else(|| self.bad(key, "missing"))
    }

    fn flag(&mut self, key: &str) -> Result<bool, FormatError> {
        match self.int(key)? {
            Some(0) | None => Ok(false),
            Some(1) => Ok(true),
            Some(_) => Err(self.bad(key, "a flag must be 0 or 1")),
        }
    }

    fn f32(&mut self, key: &str) -> Result<Option<f32>, FormatError> {
        match self.take(key) {
            None => Ok(None),
            Some(Val::F32(v)) => Ok(Some(v)),
            Some(_) => Err(self.bad(key, "not an f32")),
        }
    }

    fn string(&mut self, key: &str) -> Result<String, FormatError> {
        match self.take(key) {
            Some(Val::Str(v)) => Ok(v),
            _ => Err(self.bad(key, "missing or not a string")),
        }
    }

    fn token(&mut self, key: &str) -> Result<Option<u32>, FormatError> {
        self.int(key)?
            .map(|v| u32::try_from(v).map_err(|_| self.bad(key, "not a token id")))
            .transpose()
    }

    fn config(&mut self) -> Result<LlamaConfig, FormatError> {
        Ok(LlamaConfig {
            n_layers: self.size("n_layers")?,
            dim: self.size("dim")?,
            n_heads: self.size("n_heads")?,
            n_kv_heads: self.size("n_kv_heads")?,
            head_dim: self.size("head_dim")?,
            hidden_dim: self.size("hidden_dim")?,
            vocab_size: self.size("vocab_size")?,
            context_length: self.size("context_length")?,
            rms_eps: self
                .f32("rms_eps")?
                .ok_or_else(|| self.bad("rms_eps", "missing"))?,
            rope: self.rope()?,
            tied_output: self.flag("tied_output")?,
            block: self.block()?,
            embed_scale: self.f32("embed_scale")?,
            final_softcap: self.f32("final_softcap")?,
            special: SpecialTokens {
                bos: self.token("special.bos")?,
                eos: self.token("special.eos")?,
                eot: self.token("special.eot")?,
                pad: self.token("special.pad")?,
            },
            layer_windows: self.windows()?,
        })
    }

    fn rope(&mut self) -> Result<RopeConfig, FormatError> {
        let pairing = match self.string("rope.pairing")?.as_str() {
            "adjacent" => RopePairing::Adjacent,
            "half_split" => RopePairing::HalfSplit,
            other => return Err(self.bad("rope.pairing", &format!("unknown pairing {other}"))),
        };
        let freq_factors = match self.take("rope.freq_factors") {
            None => None,
            Some(Val::F32s(v)) => Some(v),
            Some(_) => return Err(self.bad("rope.freq_factors", "not an f32 list")),
        };
        Ok(RopeConfig {
            theta: self
                .f32("rope.theta")?
                .ok_or_else(|| self.bad("rope.theta", "missing"))?,
            scaling: self.scaling()?,
            pairing,
            rotated: self.int("rope.rotated")?,
            freq_factors,
            long_rope: self.long_rope()?,
            attn_factor: self.f32("rope.attn_factor")?,
            window_theta: self.f32("rope.window_theta")?,
        })
    }

    fn long_rope(&mut self) -> Result<Option<LongRope>, FormatError> {
        let mut list = |k: &str| match self.take(k) {
            None => Ok(None),
            Some(Val::F32s(v)) => Ok(Some(v)),
            Some(_) => Err(self.bad(k, "not an f32 list")),
        };
        let (short, long) = (list("rope.long_rope.short")?, list("rope.long_rope.long")?);
        let (short, long) = match (short, long) {
            (None, None) => return Ok(None),
            (Some(s), Some(l)) => (s, l),
            _ => return Err(self.bad("rope.long_rope", "needs both short and long")),
        };
        Ok(Some(LongRope {
            short,
            long,
            original_context: self.size("rope.long_rope.original_context")?,
        }))
    }

    fn scaling(&mut self) -> Result<Option<Llama3Scaling>, FormatError> {
        let Some(factor) = self.f32("rope.scaling.factor")? else {
            return Ok(None);
        };
        let mut need = |k: &str| self.f32(k)?.ok_or_else(|| self.bad(k, "missing"));
        Ok(Some(Llama3Scaling {
            factor,
            low_freq_factor: need("rope.scaling.low_freq_factor")?,
            high_freq_factor: need("rope.scaling.high_freq_factor")?,
            original_context: self.size("rope.scaling.original_context")?,
        }))
    }

    fn block(&mut self) -> Result<Block, FormatError> {
        let act = self.string("block.activation")?;
        let activation = Activation::from_name(&act)
            .ok_or_else(|| self.bad("block.activation", &format!("unknown activation {act}")))?;
        Ok(Block {
            qkv_bias: self.flag("block.qkv_bias")?,
            qk_norm: self.flag("block.qk_norm")?,
            post_attention_norm: self.flag("block.post_attention_norm")?,
            post_ffn_norm: self.flag("block.post_ffn_norm")?,
            activation,
            attention_scale: self.f32("block.attention_scale")?,
        })
    }

    fn windows(&mut self) -> Result<Vec<Option<usize>>, FormatError> {
        match self.take("layer_windows") {
            None => Ok(Vec::new()),
            Some(Val::Ints(v)) => Ok(v
                .into_iter()
                .map(|w| (w != 0).then_some(w as usize))
                .collect()),
            Some(_) => Err(self.bad("layer_windows", "not a list of counts")),
        }
    }
}

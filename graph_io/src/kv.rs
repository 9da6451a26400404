//! K/V graph tensors: htpkv's names for them, their position among a graph's K/V tensors (the
//! buffer-index rule) and the names of the attention masks.
//!
//! This is the home of these rules: `kv_manager` re-exports them, and its
//! `Geometry::buffer_index` / `buffer_coords` call [`buffer_index`] / [`buffer_coords`].

/// Key or value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TensorKind {
    Key,
    Value,
}

impl std::fmt::Display for TensorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TensorKind::Key => "K",
            TensorKind::Value => "V",
        })
    }
}

/// Which side of a step a K/V graph tensor is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvIo {
    /// The past window (a graph input): `past_key_*`, `past_value_*`.
    Past,
    /// The step's new rows (a graph output): `new_key_*`, `new_value_*`.
    New,
    /// A static cross-attention buffer (a read-only graph input of every decoder step, an output
    /// of the encoder graph): `cross_key_*`, `cross_value_*`.
    Cross,
}

/// One K/V graph tensor: the one rule that maps cache buffers to graph tensors, by name and by
/// position.
///
/// Names: `{past|new|cross}_{key|value}_{layer}_{head}` per head, `{past|new|cross}_{key|value}_{layer}`
/// per layer (`head == None`, the tensor holds every KV head). Positions: the K/V tensors of one
/// side of a graph come K then V per unit, units in order — (layer, head) per head, layer per
/// layer — so a per-head tensor's [`KvTensor::position`] is its [`buffer_index`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KvTensor {
    pub io: KvIo,
    pub kind: TensorKind,
    pub layer: usize,
    /// The KV head of a per-head tensor; `None` for a per-layer tensor.
    pub head: Option<usize>,
}

/// htpkv's name of a K/V tensor with the layer and head written as given (numbers, or the
/// `{layer}` / `{head}` fields of a convention pattern): the one place the rule is written.
pub(crate) fn htpkv_kv_name(io: KvIo, kind: TensorKind, layer: &str, head: Option<&str>) -> String {
    let io = match io {
        KvIo::Past => "past",
        KvIo::New => "new",
        KvIo::Cross => "cross",
    };
    let kind = match kind {
        TensorKind::Key => "key",
        TensorKind::Value => "value",
    };
    match head {
        Some(h) => format!("{io}_{kind}_{layer}_{h}"),
        None => format!("{io}_{kind}_{layer}"),
    }
}

impl KvTensor {
    /// The tensor's name in htpkv's graphs.
    pub fn name(&self) -> String {
        let head = self.head.map(|h| h.to_string());
        htpkv_kv_name(self.io, self.kind, &self.layer.to_string(), head.as_deref())
    }

    /// The K/V tensor a name denotes ([`KvTensor::name`]'s inverse); `None` for any other name.
    pub fn parse(name: &str) -> Option<KvTensor> {
        let (io, rest) = match name.split_once('_')? {
            ("past", rest) => (KvIo::Past, rest),
            ("new", rest) => (KvIo::New, rest),
            ("cross", rest) => (KvIo::Cross, rest),
            _ => return None,
        };
        let (kind, rest) = match rest.split_once('_')? {
            ("key", rest) => (TensorKind::Key, rest),
            ("value", rest) => (TensorKind::Value, rest),
            _ => return None,
        };
        let index = |s: &str| {
            s.bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| s.parse::<usize>().ok())
                .flatten()
        };
        let (layer, head) = match rest.split_once('_') {
            Some((l, h)) => (index(l)?, Some(index(h)?)),
            None => (index(rest)?, None),
        };
        Some(KvTensor {
            io,
            kind,
            layer,
            head,
        })
    }

    /// Position among the K/V tensors of one side of a graph with `kv_heads` KV heads per layer.
    pub fn position(&self, kv_heads: usize) -> usize {
        let unit = match self.head {
            Some(h) => self.layer * kv_heads + h,
            None => self.layer,
        };
        unit * 2 + usize::from(self.kind == TensorKind::Value)
    }
}

/// Index of the K/V buffer of (layer, head, kind) in a cache of `kv_heads` KV heads per layer:
/// `(layer * kv_heads + head) * 2 + (K=0 | V=1)`, the position of its per-head tensor
/// ([`KvTensor::position`]).
pub fn buffer_index(layer: usize, head: usize, kind: TensorKind, kv_heads: usize) -> usize {
    KvTensor {
        io: KvIo::Past,
        kind,
        layer,
        head: Some(head),
    }
    .position(kv_heads)
}

/// (layer, head, kind) of a buffer index ([`buffer_index`]'s inverse).
pub fn buffer_coords(buffer: usize, kv_heads: usize) -> (usize, usize, TensorKind) {
    let kind = if buffer.is_multiple_of(2) {
        TensorKind::Key
    } else {
        TensorKind::Value
    };
    let unit = buffer / 2;
    (unit / kv_heads, unit % kv_heads, kind)
}

/// The buffer indices of layer `layer`'s K and V, every head: consecutive, K then V per head.
pub fn layer_buffers(layer: usize, kv_heads: usize) -> std::ops::Range<usize> {
    buffer_index(layer, 0, TensorKind::Key, kv_heads)
        ..buffer_index(layer + 1, 0, TensorKind::Key, kv_heads)
}

/// The name of the attention mask input for layers of attention window `window`:
/// `attention_mask` for global layers (`None`, the `[n, S]` mask) and `attention_mask_w{W}` for
/// the sliding layers of window W (the `[n, W - 1 + n]` mask over their `W - 1` past rows and the
/// n new ones). A graph takes one mask per distinct window of its layers.
pub fn mask_name(window: Option<usize>) -> String {
    match window {
        None => "attention_mask".to_owned(),
        Some(w) => format!("attention_mask_w{w}"),
    }
}

/// The attention window a mask name denotes ([`mask_name`]'s inverse): `Some(None)` for the
/// global mask, `Some(Some(W))` for a window, `None` for any other name.
pub fn parse_mask_name(name: &str) -> Option<Option<usize>> {
    match name.strip_prefix("attention_mask") {
        Some("") => Some(None),
        Some(rest) => {
            let digits = rest.strip_prefix("_w")?;
            let ok = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
            ok.then(|| digits.parse().ok().map(Some)).flatten()
        }
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_positions_are_buffer_indices() {
        for head in [None, Some(3)] {
            let t = KvTensor {
                io: KvIo::Cross,
                kind: TensorKind::Value,
                layer: 12,
                head,
            };
            assert_eq!(KvTensor::parse(&t.name()), Some(t));
        }
        assert_eq!(KvTensor::parse("past_key_1_x"), None);
        assert_eq!(
            buffer_index(2, 1, TensorKind::Value, 4),
            (2 * 4 + 1) * 2 + 1
        );
        for b in 0..2 * 3 * 4 {
            let (l, h, kind) = buffer_coords(b, 4);
            assert_eq!(buffer_index(l, h, kind, 4), b);
            assert!(layer_buffers(l, 4).contains(&b));
        }
        assert_eq!(layer_buffers(2, 4), 16..24);
        assert_eq!(parse_mask_name(&mask_name(Some(7))), Some(Some(7)));
        assert_eq!(parse_mask_name("attention_mask_w"), None);
    }
}

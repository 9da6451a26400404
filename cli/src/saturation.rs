//! KV saturation in `--stats`, `--json` and a warning: the committed K/V codes at their encoding's
//! extremes (`kv_manager::saturation`), the first sign that a fixed-point cache clips the text.

use htpkv::backend::Backend;
use htpkv::session::Session;
use kv_manager::saturation::Worst;
use kv_manager::{KvCache, TensorKind};

/// Makes `session`'s cache count saturated codes. A cache counts only when asked; the commands
/// that read the counts (`generate` and `chat` for the warning, `--stats` and `--json`, `eval`)
/// ask for it when they open their session.
pub fn count_in(session: &mut Session<Box<dyn Backend>>) {
    session.set_kv_saturation_counting(true);
}

/// Above this saturated fraction in one buffer (and [`WARN_MIN_CODES`] codes), a warning names it.
pub const WARN_RATE: f64 = 0.01;
/// The fewest saturated codes in one buffer that can warn (a short text's few clipped values do not).
pub const WARN_MIN_CODES: u64 = 16;

fn kind(k: TensorKind) -> &'static str {
    match k {
        TensorKind::Key => "K",
        TensorKind::Value => "V",
    }
}

fn worst(cache: &KvCache) -> Option<Worst> {
    cache.saturation().worst(&cache.spec().geometry)
}

/// `kv_saturation` of `--json`: the totals and the worst buffer.
pub fn json(cache: &KvCache) -> serde_json::Value {
    let total = cache.saturation().total();
    serde_json::json!({
        "saturated_codes": total.saturated,
        "codes": total.values,
        "rate": total.rate(),
        "worst": worst(cache).map(|w| serde_json::json!({
            "layer": w.layer,
            "head": w.head,
            "kind": kind(w.kind),
            "saturated_codes": w.counts.saturated,
            "codes": w.counts.values,
            "rate": w.counts.rate(),
        })),
    })
}

/// The `--stats` line (fixed-point caches only).
pub fn stats_line(cache: &KvCache) -> Option<String> {
    let total = cache.saturation().total();
    if total.values == 0 {
        return None;
    }
    let mut line = format!(
        "kv saturation: {} of {} committed K/V codes at their encoding's extremes ({:.4}%)",
        total.saturated,
        total.values,
        100.0 * total.rate()
    );
    if let Some(w) = worst(cache) {
        line.push_str(&format!(
            "; worst: layer {} head {} {} ({:.4}%)",
            w.layer,
            w.head,
            kind(w.kind),
            100.0 * w.counts.rate()
        ));
    }
    Some(line)
}

/// The warning, when the worst buffer passes the threshold.
pub fn warning(cache: &KvCache) -> Option<String> {
    let w = worst(cache).filter(|w| w.counts.rate() > WARN_RATE)?;
    (w.counts.saturated >= WARN_MIN_CODES).then(|| {
        format!(
            "warning: {:.2}% of the {} codes of layer {} head {} ({} of {}) are at their encoding's \
             extremes: this text leaves the K/V encodings' calibrated range, and the output may \
             degrade (a wider --kv-dtype, or a calibration closer to this text, avoids it)",
            100.0 * w.counts.rate(),
            kind(w.kind),
            w.layer,
            w.head,
            w.counts.saturated,
            w.counts.values
        )
    })
}

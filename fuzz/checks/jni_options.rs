//! Fuzz check of the JNI option strings (`kv_jni::options`): the data is split at 0xFF bytes
//! into the fields Java passes. Checking them must never panic, and accepted options must be
//! the ones asked for.

use kv_jni::options::{OpenArgs, SamplerArgs, generate_options};

pub fn check(data: &[u8]) {
    let mut fields = data.split(|&b| b == 0xFF);
    let mut text = || {
        fields
            .next()
            .map(|f| String::from_utf8_lossy(f).into_owned())
    };
    let (model_dir, compiled, backend) = (text(), text(), text());
    let (backend_lib, system_lib, strategy) = (text(), text(), text());
    let (kv_dtype, weights, cache_dir) = (text(), text(), text());
    let numbers: Vec<i32> = text()
        .unwrap_or_default()
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    let (speculate, chat_template) = (text(), text());
    let args = OpenArgs {
        model_dir,
        compiled,
        backend,
        backend_lib,
        system_lib,
        strategy,
        kv_dtype,
        weights,
        context: numbers.first().copied().unwrap_or(0),
        ar: numbers.iter().skip(1).copied().collect(),
        cache_dir,
        speculate,
        chat_template,
    };
    if let Ok(options) = args.to_engine_options() {
        if let Some(c) = options.context {
            assert_eq!(i32::try_from(c).ok(), Some(args.context));
        }
        assert!(options.ar.iter().all(|&n| n > 0));
        let given = args.chat_template.as_deref().filter(|t| !t.is_empty());
        assert_eq!(
            options.chat_template.as_deref(),
            given.map(std::path::Path::new)
        );
    }
    let f = |i: usize| numbers.get(i).copied().unwrap_or(0);
    let sampler = SamplerArgs {
        temperature: f(1) as f32 / 7.0,
        top_p: f(2) as f32 / 5.0,
        top_k: f(4),
        min_p: f(5) as f32 / 11.0,
        penalty_last_n: f(6),
        seed: i64::from(f(3)),
        ..SamplerArgs::default()
    };
    let stop = stops_from(&numbers);
    if let Ok(o) = generate_options(f(0), &sampler, stop) {
        assert_eq!(i32::try_from(o.max_tokens).ok(), Some(f(0)));
        assert!(o.sampler.top_k as i64 == i64::from(f(4)));
    }
}

/// Stop strings from the numbers (some empty), for `generate_options` to carry or refuse later.
fn stops_from(numbers: &[i32]) -> Vec<String> {
    numbers
        .iter()
        .take(3)
        .map(|n| "x".repeat((n.unsigned_abs() % 4) as usize))
        .collect()
}

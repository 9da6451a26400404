//! Fuzz check of the JNI option strings (`kv_jni::options`): the data is split at 0xFF bytes
//! into the fields Java passes. Checking them must never panic, and accepted options must be
//! the ones asked for.

use kv_jni::options::{OpenArgs, generate_options};

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
    let speculate = text();
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
    };
    if let Ok(options) = args.to_engine_options() {
        if let Some(c) = options.context {
            assert_eq!(i32::try_from(c).ok(), Some(args.context));
        }
        assert!(options.ar.iter().all(|&n| n > 0));
    }
    let f = |i: usize| numbers.get(i).copied().unwrap_or(0);
    let _ = generate_options(f(0), f(1) as f32 / 7.0, f(2) as f32 / 5.0, i64::from(f(3)));
}

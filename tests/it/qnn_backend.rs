//! The full FFI path: the reference backend built as a QNN library, loaded through `qnn_ffi`, runs the
//! same story as the in-process reference backend, bit for bit, with every KV strategy (memory handles
//! at moving offsets for `shift` and `conveyor`).

use htpkv::backend::Backend;
use htpkv::engine::{BackendChoice, Engine, EngineOptions};
use htpkv::qnn::QnnBackend;
use htpkv::qnn_memory::{DEFAULT_MAX_HANDLES, QnnMemory};
use htpkv::reference::ReferenceBackend;
use htpkv::session::{GenerateOptions, Session};
use kv_manager::{HostAllocator, Strategy};
use std::sync::Arc;
use test_support::files::ScratchDir;

fn options(update: Strategy, backend: BackendChoice, cache: &std::path::Path) -> EngineOptions {
    EngineOptions {
        strategy: update,
        backend,
        kv_dtype: quant::DataType::U8,
        context: Some(160),
        cache_dir: Some(cache.to_path_buf()),
        ..EngineOptions::default()
    }
}

#[test]
fn generation_through_the_qnn_library_is_bit_identical() {
    let cache = ScratchDir::new("qnn-test");
    let lib = test_support::files::ref_qnn_library();
    let generate = GenerateOptions {
        max_tokens: 150,
        sampler: Default::default(),
        ..GenerateOptions::default()
    };
    for update in [
        Strategy::SHIFT_2X,
        Strategy::Conveyor,
        Strategy::SmartMask,
        Strategy::Naive,
    ] {
        let local = options(update, BackendChoice::Reference, &cache);
        let qnn = EngineOptions {
            backend: BackendChoice::Qnn {
                backend_lib: lib.clone(),
                system_lib: None,
                memory: htpkv::qnn_memory::QnnMemory::Auto,
                max_handles: htpkv::qnn_memory::DEFAULT_MAX_HANDLES,
            },
            ..local.clone()
        };
        let mut a = Engine::open(&local, &mut |_| {}).unwrap();
        let mut b = Engine::open(&qnn, &mut |_| {}).unwrap();
        let ga = a
            .generate("Once upon a time", &generate, &mut |_| true)
            .unwrap();
        let gb = b
            .generate("Once upon a time", &generate, &mut |_| true)
            .unwrap();
        assert_eq!(ga.tokens, gb.tokens, "{update:?}");
        assert_eq!(ga.text, gb.text);
        assert!(ga.text.len() > 100);
        assert_eq!(b.session().backend().name(), "qnn");
    }
}

#[test]
fn qnn_logits_equal_in_process_logits_and_handles_are_cached() {
    let cache = ScratchDir::new("qnn-test2");
    let opts = options(Strategy::Conveyor, BackendChoice::Reference, &cache);
    let engine = Engine::open(&opts, &mut |_| {}).unwrap();
    let path = engine.compiled_path().to_path_buf();
    let compiled = Arc::new(ref_backend::CompiledModel::read(&path).unwrap());
    let lib = test_support::files::ref_qnn_library();
    let memories = [QnnMemory::Host, QnnMemory::Client, QnnMemory::SharedBuffer];
    for (strategy, memory) in [
        Strategy::SHIFT_2X,
        Strategy::Conveyor,
        Strategy::SmartMask,
        Strategy::Naive,
    ]
    .into_iter()
    .flat_map(|s| memories.map(|m| (s, m)))
    {
        let qnn = QnnBackend::open(&lib, None, &path, memory, DEFAULT_MAX_HANDLES).unwrap();
        let allocator = qnn.region_allocator();
        // The binary info describes the same graphs as the compiled file.
        assert_eq!(
            qnn.graphs(),
            htpkv::reference::graph_descs(&compiled).as_slice()
        );
        let mut remote = Session::new(qnn, strategy, allocator.as_ref()).unwrap();
        let mut local = Session::new(
            ReferenceBackend::new(compiled.clone()),
            strategy,
            &HostAllocator::default(),
        )
        .unwrap();
        let prompt: Vec<u32> = vec![1, 403, 407, 261, 378];
        let a = local.prefill(&prompt).unwrap().to_vec();
        let b = remote.prefill(&prompt).unwrap().to_vec();
        assert_eq!(a, b);
        for _ in 0..40 {
            let t = model::ops::argmax(local.last_logits()) as u32;
            let a = local.decode(t).unwrap().to_vec();
            let b = remote.decode(t).unwrap().to_vec();
            assert!(
                a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{strategy:?} {memory:?}"
            );
        }
        // Handles are registered once per distinct binding and reused: never more than the KV manager's
        // count of distinct bindings.
        let registered = remote.backend().registrations() as usize;
        assert_eq!(registered > 0, memory != QnnMemory::Client, "{memory:?}");
        assert!(
            registered <= remote.cache().counters().handles,
            "{registered} registrations"
        );
    }
}

#[test]
fn bad_qnn_paths_give_typed_errors() {
    let cache = ScratchDir::new("qnn-test3");
    let local = options(Strategy::SHIFT_2X, BackendChoice::Reference, &cache);
    for (lib, needle) in [
        ("/nonexistent/libQnnHtp.so", "/nonexistent/libQnnHtp.so"),
        ("libc.so.6", "QnnInterface_getProviders"),
    ] {
        let opts = EngineOptions {
            backend: BackendChoice::Qnn {
                backend_lib: lib.into(),
                system_lib: None,
                memory: htpkv::qnn_memory::QnnMemory::Auto,
                max_handles: htpkv::qnn_memory::DEFAULT_MAX_HANDLES,
            },
            ..local.clone()
        };
        let err = Engine::open(&opts, &mut |_| {}).unwrap_err();
        assert_eq!(err.kind(), "qnn");
        // The QNN error is the typed source, printed after the message (as the CLI prints it).
        let source = std::error::Error::source(&err).expect("the QNN error is the source");
        assert!(source.is::<qnn_ffi::QnnError>(), "{source:?}");
        let printed = format!("{err}: {source}");
        assert!(printed.contains(needle), "{printed}");
    }
}

/// A model with sliding-window layers (window 16 on layers 0, 2, 4, window 8 on layer 1): the QNN
/// library presents the `attention_mask_w8` and `attention_mask_w16` inputs and the `W - 1`-row past
/// tensors, the convention takes both as masks, the session binds them by name, and the story is the
/// in-process one, token for token.
#[test]
fn windowed_generation_through_the_qnn_library_is_bit_identical() {
    let cache = ScratchDir::new("qnn-windows");
    let lib = test_support::files::ref_qnn_library();
    let generate = GenerateOptions {
        max_tokens: 100,
        sampler: Default::default(),
        ..GenerateOptions::default()
    };
    for update in [Strategy::SHIFT_2X, Strategy::Naive] {
        let local = options(update, BackendChoice::Reference, &cache);
        let local = EngineOptions {
            ar: vec![1, 4],
            layer_windows: vec!["0,2,4:16".parse().unwrap(), "1:8".parse().unwrap()],
            ..local
        };
        let qnn = EngineOptions {
            backend: BackendChoice::Qnn {
                backend_lib: lib.clone(),
                system_lib: None,
                memory: QnnMemory::Auto,
                max_handles: DEFAULT_MAX_HANDLES,
            },
            ..local.clone()
        };
        let mut a = Engine::open(&local, &mut |_| {}).unwrap();
        let mut b = Engine::open(&qnn, &mut |_| {}).unwrap();
        let windows = &b.session().cache().spec().geometry.windows;
        assert_eq!(windows[..], [Some(16), Some(8), Some(16), None, Some(16)]);
        let ga = a
            .generate("Once upon a time", &generate, &mut |_| true)
            .unwrap();
        let gb = b
            .generate("Once upon a time", &generate, &mut |_| true)
            .unwrap();
        assert_eq!(ga.tokens, gb.tokens, "{update:?}");
        assert!(ga.text.len() > 100);
    }
}

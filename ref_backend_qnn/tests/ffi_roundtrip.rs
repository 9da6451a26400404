// Its own binary: .ci/run runs the two FFI test binaries (ffi_roundtrip, bad_inputs) under valgrind, alone and small.
//! The whole QNN FFI path on a desktop: dlopen `libhtpkv_ref_qnn.so`, read the compiled
//! stories260K file's metadata through the system provider, create a context from it, and
//! generate greedily through `graphExecute` — once with client buffers (a left-padded window
//! that slides by copying) and once with registered memory handles at moving offsets of one
//! host region (the output rows written in place right after the window, as ShiftPointer
//! does). Logits must equal the in-process `ref_backend` execution bit for bit at every step.
//!
//! `HTPKV_FFI_STEPS` limits the number of greedy steps (the CI's valgrind run uses few).

use kv_manager::{HostAllocator, Region};
use qnn_ffi::{
    Backend, ClientBuffer, Context, Device, Graph, Log, LogLevel, MemDescriptor, MemHandleCache,
    QnnLibrary, QnnSystemLibrary, SystemContext, TensorData,
};
use ref_backend::{IoRole, IoTensor, mask_value_bytes};

const CONTEXT: usize = 48;

fn steps() -> usize {
    std::env::var("HTPKV_FFI_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40)
        .min(CONTEXT - 1)
}

/// Inputs of one step that do not depend on where the KV windows live.
fn step_inputs(descs: &[IoTensor], token: u32, pos: usize, n_past: usize) -> Vec<Option<Vec<u8>>> {
    descs
        .iter()
        .map(|d| match d.role {
            IoRole::InputIds => Some((token as i32).to_le_bytes().to_vec()),
            IoRole::Positions => Some((pos as i32).to_le_bytes().to_vec()),
            IoRole::Mask => {
                let s = d.shape[3];
                let w = s - 1;
                let mut m = Vec::with_capacity(d.byte_size());
                for j in 0..s {
                    let visible = j == w || j >= w - n_past;
                    m.extend(mask_value_bytes(d.dtype, visible));
                }
                Some(m)
            }
            _ => None,
        })
        .collect()
}

fn argmax(logits: &[u8]) -> u32 {
    let mut best = (f32::NEG_INFINITY, 0u32);
    for (i, c) in logits.chunks_exact(4).enumerate() {
        let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        if v > best.0 {
            best = (v, i as u32);
        }
    }
    best.1
}

/// Index of the output that holds the new rows of KV input `name` (`past_` → `new_`).
fn new_of(outputs: &[IoTensor], name: &str) -> usize {
    let want = name.replacen("past_", "new_", 1);
    outputs
        .iter()
        .position(|d| d.name == want)
        .expect("matching new_ output")
}

enum Exec<'a> {
    InProcess(&'a ref_backend::Graph),
    Ffi(&'a Graph),
}

/// Greedy generation with left-padded windows kept in Vecs (slide by copy). Returns the
/// logits bytes of every step.
fn run_windows(
    exec: Exec<'_>,
    descs_in: &[IoTensor],
    descs_out: &[IoTensor],
    bos: u32,
    steps: usize,
) -> Vec<Vec<u8>> {
    let mut windows: Vec<Vec<u8>> = descs_in.iter().map(|d| vec![0u8; d.byte_size()]).collect();
    let mut outs: Vec<Vec<u8>> = descs_out.iter().map(|d| vec![0u8; d.byte_size()]).collect();
    let mut token = bos;
    let mut all = Vec::new();
    for step in 0..steps {
        let fixed = step_inputs(descs_in, token, step, step);
        let inputs: Vec<&[u8]> = fixed
            .iter()
            .zip(&windows)
            .map(|(f, w)| f.as_deref().unwrap_or(w.as_slice()))
            .collect();
        match &exec {
            Exec::InProcess(g) => {
                let mut o: Vec<&mut [u8]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
                g.execute(&inputs, &mut o).expect("in-process execute");
            }
            Exec::Ffi(g) => {
                let i: Vec<TensorData<'_>> = inputs
                    .iter()
                    .map(|b| TensorData::Client(ClientBuffer::input(b)))
                    .collect();
                let o: Vec<TensorData<'_>> = outs
                    .iter_mut()
                    .map(|b| TensorData::Client(ClientBuffer::output(b)))
                    .collect();
                g.execute(&i, &o).expect("FFI execute");
            }
        }
        // Slide every KV window left by one row and append the new row.
        for (i, d) in descs_in.iter().enumerate() {
            if matches!(d.role, IoRole::PastKey | IoRole::PastValue) {
                let row = outs[new_of(descs_out, &d.name)].len();
                let w = &mut windows[i];
                w.copy_within(row.., 0);
                let at = w.len() - row;
                w[at..].copy_from_slice(&outs[new_of(descs_out, &d.name)]);
            }
        }
        let logits = &outs[descs_out
            .iter()
            .position(|d| d.role == IoRole::Logits)
            .expect("logits")];
        token = argmax(logits);
        all.push(logits.clone());
    }
    all
}

/// Greedy generation with every KV buffer in one host region, bound through memory handles:
/// the past window of buffer b is rows [v1 - W, v1) and the graph writes the new row at v1.
fn run_mem_handles(
    graph: &Graph,
    context: &std::sync::Arc<Context>,
    descs_in: &[IoTensor],
    descs_out: &[IoTensor],
    bos: u32,
    steps: usize,
) -> (Vec<Vec<u8>>, u64, u64) {
    let kv: Vec<usize> = (0..descs_in.len())
        .filter(|&i| matches!(descs_in[i].role, IoRole::PastKey | IoRole::PastValue))
        .collect();
    let w = CONTEXT - 1;
    let row_bytes = descs_in[kv[0]].byte_size() / w;
    let rows = w + steps + 1;
    let buf_bytes = rows * row_bytes;
    let mut region =
        Region::allocate(&HostAllocator::default(), buf_bytes * kv.len()).expect("region");
    let base = region.as_mut_slice().as_mut_ptr();
    let total = region.len();
    let mut cache = MemHandleCache::new(context);
    let mut logits = vec![
        0u8;
        descs_out
            .iter()
            .find(|d| d.role == IoRole::Logits)
            .expect("logits")
            .byte_size()
    ];
    let mut token = bos;
    let mut all = Vec::new();
    let dtype = |d: &IoTensor| d.dtype;
    for step in 0..steps {
        let v1 = w + step;
        let fixed = step_inputs(descs_in, token, step, step);
        // Register (or reuse) the handles of this step first.
        let mut in_desc = Vec::new();
        let mut out_desc = vec![None; descs_out.len()];
        for (b, &i) in kv.iter().enumerate() {
            let d = &descs_in[i];
            let start = b * buf_bytes;
            // SAFETY: `base` points to the region's `total` bytes, alive until the cache and
            // handles are dropped below; no Rust reference touches the region meanwhile.
            let past = unsafe {
                MemDescriptor::host(
                    d.shape.iter().map(|&x| x as u32).collect(),
                    dtype(d),
                    base,
                    total,
                    start + (v1 - w) * row_bytes,
                )
            };
            let o = new_of(descs_out, &d.name);
            let od = &descs_out[o];
            // SAFETY: as above.
            let new = unsafe {
                MemDescriptor::host(
                    od.shape.iter().map(|&x| x as u32).collect(),
                    dtype(od),
                    base,
                    total,
                    start + v1 * row_bytes,
                )
            };
            in_desc.push((i, past));
            out_desc[o] = Some(new);
        }
        for (_, d) in &in_desc {
            cache.get(d).expect("register past window");
        }
        for d in out_desc.iter().flatten() {
            cache.get(d).expect("register new rows");
        }
        let handles_in: Vec<(usize, &qnn_ffi::MemHandle)> = in_desc
            .iter()
            .map(|(i, d)| (*i, cache.get_existing(d).expect("cached")))
            .collect();
        let mut inputs: Vec<Option<TensorData<'_>>> = (0..descs_in.len()).map(|_| None).collect();
        for (i, f) in fixed.iter().enumerate() {
            if let Some(bytes) = f {
                inputs[i] = Some(TensorData::Client(ClientBuffer::input(bytes)));
            }
        }
        for (i, h) in handles_in {
            inputs[i] = Some(TensorData::Mem(h));
        }
        let inputs: Vec<TensorData<'_>> = inputs
            .into_iter()
            .map(|x| x.expect("every input bound"))
            .collect();
        let logits_at = descs_out
            .iter()
            .position(|d| d.role == IoRole::Logits)
            .expect("logits");
        let mut outputs = Vec::new();
        let mut logits_buf = Some(ClientBuffer::output(&mut logits));
        for (o, d) in out_desc.iter().enumerate() {
            if o == logits_at {
                outputs.push(TensorData::Client(logits_buf.take().expect("one logits")));
            } else {
                outputs.push(TensorData::Mem(
                    cache
                        .get_existing(d.as_ref().expect("kv output"))
                        .expect("cached"),
                ));
            }
        }
        graph
            .execute(&inputs, &outputs)
            .expect("FFI execute with memory handles");
        drop(outputs);
        token = argmax(&logits);
        all.push(logits.clone());
    }
    // Asking again for a descriptor already registered reuses its handle.
    let (regs, hits_before) = (cache.registrations(), cache.hits());
    let d = &descs_in[kv[0]];
    // SAFETY: as above; the region is alive.
    let again = unsafe {
        MemDescriptor::host(
            d.shape.iter().map(|&x| x as u32).collect(),
            dtype(d),
            base,
            total,
            0,
        )
    };
    cache.get(&again).expect("reuse");
    assert_eq!(
        cache.registrations(),
        regs,
        "a cached descriptor must not register again"
    );
    assert_eq!(cache.hits(), hits_before + 1);
    let hits = cache.hits();
    drop(cache);
    drop(region);
    (all, regs, hits)
}

#[test]
fn ffi_generation_is_bit_identical_to_in_process() {
    let (ckpt, tok) = test_support::stories::stories260k_loaded();
    let (model, bytes) = test_support::compile::compiled_ar1(&ckpt, &tok, CONTEXT);
    let reference = model.graph_for_ar(1).expect("AR-1 graph");
    let steps = steps();

    // Metadata through the system provider.
    let system = QnnSystemLibrary::load(test_support::files::ref_qnn_library())
        .expect("load system provider");
    let info = SystemContext::new(&system)
        .expect("system context")
        .binary_info(&bytes)
        .expect("binary info");
    let g = info.graph(reference.name()).expect("graph listed");
    assert_eq!(g.inputs.len(), reference.inputs().len());
    for (t, d) in g
        .inputs
        .iter()
        .zip(reference.inputs())
        .chain(g.outputs.iter().zip(reference.outputs()))
    {
        assert_eq!(t.name, d.name);
        assert_eq!(
            t.shape.iter().map(|&x| x as usize).collect::<Vec<_>>(),
            d.shape
        );
        assert_eq!(t.byte_size(), Some(d.byte_size()));
    }

    // The backend.
    let lib = QnnLibrary::load(test_support::files::ref_qnn_library()).expect("load backend");
    assert_eq!(lib.provider().name.as_deref(), Some("htpkv_ref"));
    let log = Log::new(&lib, LogLevel::Warn).expect("log");
    let backend = Backend::new(&lib, Some(&log)).expect("backend");
    assert!(backend.build_id().is_some_and(|id| id.starts_with("htpkv")));
    let device = Device::new(&backend).expect("device");
    let context = Context::from_binary(&backend, device.as_ref(), &bytes).expect("context");
    let graph = context
        .graph(&g.name, g.inputs.clone(), g.outputs.clone())
        .expect("graph");

    let expected = run_windows(
        Exec::InProcess(reference),
        reference.inputs(),
        reference.outputs(),
        1,
        steps,
    );
    let client = run_windows(
        Exec::Ffi(&graph),
        reference.inputs(),
        reference.outputs(),
        1,
        steps,
    );
    let (handles, registrations, hits) = run_mem_handles(
        &graph,
        &context,
        reference.inputs(),
        reference.outputs(),
        1,
        steps,
    );
    for step in 0..steps {
        assert!(
            expected[step] == client[step],
            "client-buffer logits differ at step {step}"
        );
        assert!(
            expected[step] == handles[step],
            "memory-handle logits differ at step {step}"
        );
    }
    // Every step binds each KV buffer's window and new rows at fresh offsets.
    let kv_buffers = reference
        .inputs()
        .iter()
        .filter(|d| matches!(d.role, IoRole::PastKey | IoRole::PastValue))
        .count() as u64;
    assert_eq!(registrations, 2 * kv_buffers * steps as u64);
    // Only the final repeated request was served from the cache.
    assert_eq!(hits, 1);
    let tokens: Vec<u32> = expected.iter().map(|l| argmax(l)).collect();
    assert!(
        tokens.iter().any(|&t| t != tokens[0]),
        "greedy generation should not be constant: {tokens:?}"
    );
    eprintln!(
        "{steps} greedy steps identical (client buffers and {registrations} memory handles): {:?}",
        String::from_utf8_lossy(&tok.decode(&tokens))
    );
}

//! Graph execution: input validation errors, the raw-pointer form with outputs bound inside
//! the same region as the past windows, and descriptions.

use quant::{DataType, Encoding};
use ref_backend::{
    CompileOptions, CompiledModel, ExecError, Granularity, Graph, IoRole, WeightType,
};

fn model(kv: DataType, gran: Granularity) -> CompiledModel {
    let ckpt = test_support::stories::synthetic(true);
    let mut o = CompileOptions::new(32, vec![1, 4]);
    o.kv_dtype = kv;
    o.weights = WeightType::I8;
    o.granularity = gran;
    o.calibration_tokens = 16;
    test_support::compile::compile_ckpt(&ckpt, &test_support::stories::synthetic_prompts(64), &o)
        .expect("compile")
}

fn buffers(g: &Graph) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let mut ins: Vec<Vec<u8>> = g
        .inputs()
        .iter()
        .map(|d| vec![0u8; d.byte_size()])
        .collect();
    // Positions 0..n, a fully visible causal mask over the new tokens only.
    let n = g.ar();
    let s = g.context();
    for i in 0..n {
        ins[1][i * 4..i * 4 + 4].copy_from_slice(&(i as i32).to_le_bytes());
    }
    let md = g.inputs()[2].dtype;
    let es = md.size_bytes();
    for i in 0..n {
        for j in 0..s {
            let vis = j >= s - n && j - (s - n) <= i;
            let at = (i * s + j) * es;
            ins[2][at..at + es].copy_from_slice(&ref_backend::mask_value_bytes(md, vis));
        }
    }
    let outs = g
        .outputs()
        .iter()
        .map(|d| vec![0u8; d.byte_size()])
        .collect();
    (ins, outs)
}

fn run(g: &Graph, ins: &[Vec<u8>], outs: &mut [Vec<u8>]) -> Result<(), ExecError> {
    let i: Vec<&[u8]> = ins.iter().map(|v| v.as_slice()).collect();
    let mut o: Vec<&mut [u8]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
    g.execute(&i, &mut o)
}

#[test]
fn descriptions() {
    let m = model(DataType::U8, Granularity::PerHead);
    let c = m.config().clone();
    let g = m.graph_for_ar(4).unwrap();
    assert_eq!(g.name(), "ar4_cl32");
    let ins = g.inputs();
    assert_eq!(ins.len(), 3 + 2 * c.n_layers * c.n_kv_heads);
    assert_eq!(ins[0].name, "input_ids");
    assert_eq!(ins[0].shape, vec![1, 4]);
    assert_eq!(ins[0].dtype, DataType::I32);
    assert_eq!(ins[2].role, IoRole::Mask);
    assert_eq!(ins[2].dtype, DataType::U16);
    assert_eq!(ins[3].name, "past_key_0_0");
    assert_eq!(ins[3].shape, vec![1, 1, 28, c.head_dim]);
    assert_eq!(ins[4].name, "past_value_0_0");
    let outs = g.outputs();
    assert_eq!(outs[0].name, "logits");
    assert_eq!(outs[0].shape, vec![1, 4, c.vocab_size]);
    assert_eq!(outs[1].name, "new_key_0_0");
    // Past and new K of one head share one encoding, as the spec in the model says.
    for l in 0..c.n_layers {
        for h in 0..c.n_kv_heads {
            let past = ins
                .iter()
                .find(|d| d.name == format!("past_key_{l}_{h}"))
                .unwrap();
            let new = outs
                .iter()
                .find(|d| d.name == format!("new_key_{l}_{h}"))
                .unwrap();
            assert_eq!(past.encoding(), new.encoding());
            assert_eq!(past.quant.as_ref(), m.kv_spec(l, h, false));
            assert!(matches!(past.encoding(), Encoding::PerTensor(_)));
        }
    }
    let pl = model(DataType::U16, Granularity::PerLayer);
    let g = pl.graph_for_ar(1).unwrap();
    assert_eq!(g.inputs()[3].name, "past_key_0");
    assert_eq!(g.inputs()[3].shape, vec![c.n_kv_heads, 1, 31, c.head_dim]);
    assert!(
        matches!(&g.inputs()[3].encoding(), Encoding::PerAxis { axis: 0, params } if params.len() == c.n_kv_heads)
    );
}

#[test]
fn invalid_inputs_are_errors_naming_the_tensor() {
    let m = model(DataType::U8, Granularity::PerHead);
    let g = m.graph_for_ar(4).unwrap();
    let (ins, mut outs) = buffers(g);
    run(g, &ins, &mut outs).expect("valid inputs run");

    let e = run(g, &ins[..ins.len() - 1], &mut outs).unwrap_err();
    assert!(matches!(e, ExecError::InputCount { expected, found, .. } if found + 1 == expected));
    let e = run(g, &ins, &mut outs[..2]).unwrap_err();
    assert!(matches!(e, ExecError::OutputCount { found: 2, .. }));

    let mut bad = ins.clone();
    bad[5].pop();
    let e = run(g, &bad, &mut outs).unwrap_err();
    assert!(
        matches!(&e, ExecError::InputSize { tensor, index: 5, .. } if tensor == &g.inputs()[5].name),
        "{e:?}"
    );
    assert!(e.to_string().contains(&g.inputs()[5].name));

    let mut bad_outs = outs.clone();
    bad_outs[3].push(0);
    let e = run(g, &ins, &mut bad_outs).unwrap_err();
    assert!(matches!(&e, ExecError::OutputSize { tensor, .. } if tensor == &g.outputs()[3].name));

    let mut bad = ins.clone();
    bad[0][4..8].copy_from_slice(&64i32.to_le_bytes());
    let e = run(g, &bad, &mut outs).unwrap_err();
    assert!(
        matches!(
            e,
            ExecError::TokenOutOfRange {
                index: 1,
                value: 64,
                ..
            }
        ),
        "{e:?}"
    );
    let mut bad = ins.clone();
    bad[1][0..4].copy_from_slice(&(-3i32).to_le_bytes());
    let e = run(g, &bad, &mut outs).unwrap_err();
    assert!(
        matches!(e, ExecError::NegativePosition { value: -3, .. }),
        "{e:?}"
    );

    let raw_in: Vec<(*const u8, usize)> = ins.iter().map(|v| (v.as_ptr(), v.len())).collect();
    let mut raw_out: Vec<(*mut u8, usize)> =
        outs.iter_mut().map(|v| (v.as_mut_ptr(), v.len())).collect();
    raw_out[1].0 = std::ptr::null_mut();
    // SAFETY: all non-null pointers come from live Vecs of the stated lengths that do not
    // overlap; the null one is rejected before any access.
    let e = unsafe { g.execute_raw(&raw_in, &raw_out) }.unwrap_err();
    assert!(matches!(e, ExecError::NullPointer { .. }));
}

/// The raw form with every new K/V output bound right after its past window inside one
/// region (what the ShiftPointer strategy does) gives the same bytes as separate buffers.
#[test]
fn execute_raw_with_outputs_inside_the_kv_region() {
    for kv in [DataType::U8, DataType::F32] {
        let m = model(kv, Granularity::PerHead);
        let g = m.graph_for_ar(4).unwrap();
        let (mut ins, mut outs) = buffers(g);
        // Put 3 valid past rows (arbitrary bytes) at the end of every window and show them.
        let w = g.window();
        let es = kv.size_bytes();
        for (k, buf) in ins.iter_mut().enumerate().skip(3) {
            for (b, x) in buf.iter_mut().enumerate() {
                *x = ((b * 31 + k * 7) % 61) as u8; // finite for every dtype
            }
        }
        let s = g.context();
        let md = g.inputs()[2].dtype;
        let mes = md.size_bytes();
        for i in 0..g.ar() {
            for j in w - 3..w {
                let at = (i * s + j) * mes;
                ins[2][at..at + mes].copy_from_slice(&ref_backend::mask_value_bytes(md, true));
            }
        }
        run(g, &ins, &mut outs).unwrap();

        // One region: per KV tensor, its window followed by room for the new rows.
        let d = m.config().head_dim;
        let per = (w + g.ar()) * d * es;
        let nkv = ins.len() - 3;
        let mut region = vec![0u8; nkv * per];
        for (t, buf) in ins.iter().enumerate().skip(3) {
            let at = (t - 3) * per;
            region[at..at + buf.len()].copy_from_slice(buf);
        }
        let mut logits = vec![0u8; outs[0].len()];
        let base = region.as_mut_ptr();
        let mut raw_in: Vec<(*const u8, usize)> =
            ins[..3].iter().map(|v| (v.as_ptr(), v.len())).collect();
        let mut raw_out: Vec<(*mut u8, usize)> = vec![(logits.as_mut_ptr(), logits.len())];
        for t in 0..nkv {
            let win = w * d * es;
            // SAFETY: `t * per + per <= region.len()`, so both offsets stay in the allocation.
            let (p_in, p_out) = unsafe { (base.add(t * per), base.add(t * per + win)) };
            raw_in.push((p_in as *const u8, win));
            raw_out.push((p_out, g.ar() * d * es));
        }
        // Output order: logits, then new_key/new_value per head — same order as the past
        // inputs, so output t+1 belongs to input t+3.
        // SAFETY: every range lies inside `region` or a live Vec; output ranges [t*per+win,
        // (t+1)*per) are disjoint from each other and from every input range.
        unsafe { g.execute_raw(&raw_in, &raw_out) }.unwrap();
        assert_eq!(logits, outs[0], "{kv}: logits");
        for t in 0..nkv {
            let at = t * per + w * d * es;
            assert_eq!(
                &region[at..at + g.ar() * d * es],
                &outs[t + 1][..],
                "{kv}: KV output {t}"
            );
        }
    }
}

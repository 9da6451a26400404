//! Part graphs ([`CompiledModel::part_graphs`]): a model cut into parts, run in order with the
//! hidden state between them, computes exactly what the whole graph computes.

mod common;

use model::ops::Rope;
use quant::DataType;
use ref_backend::{
    CompileOptions, CompiledModel, Granularity, Graph, KLayout, TensorDesc, TensorRole, WeightType,
};

fn model() -> CompiledModel {
    let ckpt = common::synthetic(true);
    let mut o = CompileOptions::new(32, vec![1, 4]);
    o.kv_dtype = DataType::U8;
    o.weights = WeightType::I8;
    o.granularity = Granularity::PerLayer;
    o.k_layout = KLayout::Transposed;
    o.calibration_tokens = 16;
    common::compile_ckpt(&ckpt, &common::synthetic_prompts(64), &o).expect("compile")
}

/// Deterministic bytes for the past K/V windows and a mask showing the first `past` rows and
/// the new tokens causally; token ids and positions for a step at position `past`.
struct Step {
    n: usize,
    s: usize,
    past: usize,
    tokens: Vec<u32>,
}

impl Step {
    fn input(&self, d: &TensorDesc, rope: &Rope) -> Vec<u8> {
        let (n, s, past) = (self.n, self.s, self.past);
        match d.role {
            TensorRole::InputIds => self
                .tokens
                .iter()
                .flat_map(|&t| (t as i32).to_le_bytes())
                .collect(),
            TensorRole::Positions => (0..n)
                .flat_map(|i| ((past + i) as i32).to_le_bytes())
                .collect(),
            TensorRole::RopeCos | TensorRole::RopeSin => {
                let half = d.shape[3];
                let (mut cos, mut sin) = (vec![0.0f32; half], vec![0.0f32; half]);
                let mut out = Vec::new();
                for i in 0..n {
                    rope.cos_sin(past + i, &mut cos, &mut sin);
                    let t = if d.role == TensorRole::RopeCos {
                        &cos
                    } else {
                        &sin
                    };
                    out.extend(t.iter().flat_map(|v| v.to_le_bytes()));
                }
                out
            }
            TensorRole::Mask => {
                let md = d.dtype;
                let w = s - n;
                (0..n * s)
                    .flat_map(|at| {
                        let (i, j) = (at / s, at % s);
                        let vis = if j < w { j < past } else { j - w <= i };
                        ref_backend::mask_value_bytes(md, vis)
                    })
                    .collect()
            }
            _ => (0..d.byte_size()).map(|b| (b * 37 + 11) as u8).collect(),
        }
    }
}

fn execute(g: &Graph, ins: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut outs: Vec<Vec<u8>> = g.outputs().iter().map(|d| vec![0; d.byte_size()]).collect();
    let i: Vec<&[u8]> = ins.iter().map(Vec::as_slice).collect();
    let mut o: Vec<&mut [u8]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
    g.execute(&i, &mut o).expect("execute");
    outs
}

/// Runs the parts in order (hidden state from each to the next); returns every output by name.
fn run_parts(parts: &[&Graph], step: &Step, rope: &Rope) -> Vec<(String, Vec<u8>)> {
    let mut hidden = Vec::new();
    let mut all = Vec::new();
    for g in parts {
        let ins: Vec<Vec<u8>> = g
            .inputs()
            .iter()
            .map(|d| match d.role {
                TensorRole::HiddenIn => hidden.clone(),
                _ => step.input(d, rope),
            })
            .collect();
        for (d, bytes) in g.outputs().iter().zip(execute(g, &ins)) {
            if d.role == TensorRole::HiddenOut {
                hidden = bytes.clone();
            }
            all.push((d.name.clone(), bytes));
        }
    }
    all
}

#[test]
fn parts_give_the_whole_graphs_logits_and_kv_bit_for_bit() {
    let m = model();
    let c = m.config().clone();
    let rope = Rope::new(c.head_dim, &c.rope);
    for tables in [false, true] {
        let parts = m.part_graphs(2, tables).expect("parts");
        assert_eq!(parts.len(), 4);
        for n in [1, 4] {
            let whole = m.graph_for_ar(n).unwrap();
            let mine: Vec<&Graph> = parts.iter().filter(|g| g.ar() == n).collect();
            let phase = if n > 1 { "prompt" } else { "token" };
            assert_eq!(mine[1].name(), format!("{phase}_ar{n}_cl32_2_of_2"));
            let step = Step {
                n,
                s: 32,
                past: 9,
                tokens: (0..n as u32).map(|i| (5 + 11 * i) % 64).collect(),
            };
            let ins: Vec<Vec<u8>> = whole
                .inputs()
                .iter()
                .map(|d| step.input(d, &rope))
                .collect();
            let expected = execute(whole, &ins);
            let got = run_parts(&mine, &step, &rope);
            for (d, bytes) in whole.outputs().iter().zip(&expected) {
                let (_, b) = got
                    .iter()
                    .find(|(name, _)| *name == d.name)
                    .expect("output in a part");
                assert_eq!(b, bytes, "{} (tables {tables}, ar {n})", d.name);
            }
            assert_eq!(
                got.len(),
                expected.len() + 1,
                "one hidden state between two parts"
            );
        }
    }
}

#[test]
fn part_descriptions() {
    let m = model();
    let parts = m.part_graphs(2, true).unwrap();
    let (p1, p2) = (&parts[0], &parts[1]);
    let roles = |g: &Graph, ins: bool| -> Vec<TensorRole> {
        let ds = if ins { g.inputs() } else { g.outputs() };
        ds.iter().take(4).map(|d| d.role).collect()
    };
    use TensorRole::*;
    assert_eq!(roles(p1, true), [InputIds, RopeCos, RopeSin, Mask]);
    assert_eq!(roles(p2, true), [HiddenIn, RopeCos, RopeSin, Mask]);
    assert_eq!(p1.outputs()[0].role, HiddenOut);
    assert_eq!(p1.outputs()[0].shape, [1, 1, 32]);
    assert_eq!(p2.outputs()[0].role, Logits);
    assert_eq!(p1.inputs()[1].shape, [1, 1, 1, 4]);
    // Each part holds its own layer's K/V, named by the absolute layer.
    assert_eq!(p1.inputs()[4].name, "past_key_0");
    assert_eq!(p2.inputs()[4].name, "past_key_1");
    assert_eq!(p2.inputs().len(), 6);
    assert!(m.part_graphs(3, false).is_err(), "more parts than layers");
    assert!(m.part_graphs(0, false).is_err());
}

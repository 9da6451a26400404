//! Part graphs ([`CompiledModel::split`]): a model cut into parts, run in order with the
//! hidden state between them, computes exactly what the whole graph computes.

use model::ops::Rope;
use quant::DataType;
use ref_backend::{
    CompileOptions, CompiledModel, Granularity, Graph, IoRole, IoTensor, KLayout, WeightType,
};

fn model() -> CompiledModel {
    let ckpt = test_support::stories::synthetic(true);
    let mut o = CompileOptions::new(32, vec![1, 4]);
    o.kv_dtype = DataType::U8;
    o.weights = WeightType::I8;
    o.granularity = Granularity::PerLayer;
    o.k_layout = KLayout::Transposed;
    o.calibration_tokens = 16;
    test_support::compile::compile_ckpt(&ckpt, &test_support::stories::synthetic_prompts(64), &o)
        .expect("compile")
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
    fn input(&self, d: &IoTensor, rope: &Rope) -> Vec<u8> {
        let (n, s, past) = (self.n, self.s, self.past);
        match d.role {
            IoRole::InputIds => self
                .tokens
                .iter()
                .flat_map(|&t| (t as i32).to_le_bytes())
                .collect(),
            IoRole::Positions => (0..n)
                .flat_map(|i| ((past + i) as i32).to_le_bytes())
                .collect(),
            IoRole::RopeCos | IoRole::RopeSin => {
                let half = d.shape[3];
                let (mut cos, mut sin) = (vec![0.0f32; half], vec![0.0f32; half]);
                let mut out = Vec::new();
                for i in 0..n {
                    rope.cos_sin(past + i, &mut cos, &mut sin);
                    let t = if d.role == IoRole::RopeCos {
                        &cos
                    } else {
                        &sin
                    };
                    out.extend(t.iter().flat_map(|v| v.to_le_bytes()));
                }
                out
            }
            IoRole::Mask => {
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

/// Runs the parts in order (hidden state from each to the next); returns every output with
/// its description.
fn run_parts(parts: &[&Graph], step: &Step, rope: &Rope) -> Vec<(IoTensor, Vec<u8>)> {
    let mut hidden = Vec::new();
    let mut all = Vec::new();
    for g in parts {
        let ins: Vec<Vec<u8>> = g
            .inputs()
            .iter()
            .map(|d| match d.role {
                IoRole::HiddenIn => hidden.clone(),
                _ => step.input(d, rope),
            })
            .collect();
        for (d, bytes) in g.outputs().iter().zip(execute(g, &ins)) {
            if d.role == IoRole::HiddenOut {
                hidden = bytes.clone();
            }
            all.push((d.clone(), bytes));
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
        let models = m.split(2, tables).expect("parts");
        let parts: Vec<&Graph> = models.iter().flat_map(|p| p.graphs()).collect();
        assert_eq!(parts.len(), 4);
        for n in [1, 4] {
            let whole = m.graph_for_ar(n).unwrap();
            let mine: Vec<&Graph> = parts.iter().copied().filter(|g| g.ar() == n).collect();
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
                // The same tensor, under AI Hub's name, in one of the parts.
                let (_, b) = got
                    .iter()
                    .find(|(g, _)| (g.role, g.layer) == (d.role, d.layer))
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
    let parts = m.split(2, true).unwrap();
    let (p1, p2) = (&parts[0].graphs()[0], &parts[1].graphs()[0]);
    assert_eq!(p1.name(), "token_ar1_cl32_1_of_2");
    let roles = |g: &Graph, ins: bool| -> Vec<IoRole> {
        let ds = if ins { g.inputs() } else { g.outputs() };
        ds.iter().take(4).map(|d| d.role).collect()
    };
    use IoRole::*;
    assert_eq!(roles(p1, true), [InputIds, RopeCos, RopeSin, Mask]);
    assert_eq!(roles(p2, true), [HiddenIn, RopeCos, RopeSin, Mask]);
    assert_eq!(p1.outputs()[0].role, HiddenOut);
    assert_eq!(p1.outputs()[0].shape, [1, 1, 32]);
    assert_eq!(p2.outputs()[0].role, Logits);
    assert_eq!(p1.inputs()[1].shape, [1, 1, 1, 4]);
    // Each part holds its own layer's K/V, named by the absolute layer, AI Hub style.
    assert_eq!(p1.inputs()[4].name, "past_key_0_in");
    assert_eq!(p2.inputs()[4].name, "past_key_1_in");
    assert_eq!(p2.inputs()[5].name, "past_value_1_in");
    assert_eq!(p2.outputs()[1].name, "past_key_1_out");
    assert_eq!(
        p2.inputs()[4].shape,
        [2, 1, 8, 31],
        "per layer, K transposed"
    );
    assert_eq!(p2.inputs().len(), 6);
    assert!(m.split(3, false).is_err(), "more parts than layers");
    assert!(m.split(0, false).is_err());
}

#[test]
fn a_part_file_round_trips_and_a_bad_part_section_is_refused() {
    let m = model();
    let parts = m.split(2, true).unwrap();
    let bytes = parts[1].to_bytes();
    let back = CompiledModel::from_bytes(&bytes, "part").expect("read back");
    assert!(back == parts[1]);
    assert_eq!(back.part().index, 1);
    assert_eq!(back.graphs()[1].name(), "prompt_ar4_cl32_2_of_2");
    assert!(
        CompiledModel::from_bytes(&m.to_bytes(), "whole")
            .unwrap()
            .part()
            .count
            == 1
    );
    // Part index 1 of 2 -> 5 of 2, with the checksum fixed up: refused, naming the part.
    let at = find(&bytes, b"PART") + 4 + 8;
    let mut bad = bytes.clone();
    bad[at] = 5;
    let err = CompiledModel::from_bytes(&test_support::harness::reseal(bad), "part").unwrap_err();
    assert!(err.to_string().contains("part index 5 of 2"), "{err}");
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .expect("section present")
}

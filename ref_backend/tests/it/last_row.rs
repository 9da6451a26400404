//! Last-row prefill graphs (issue 37): beside each AR-n graph (n > 1), a graph returning only the
//! last row's logits. Run over the same steps, its logits are the all-row graph's last row bit
//! for bit and the K/V it writes are the same (the steps after it agree too), on stories260K and
//! the toy gemma3 GGUF (its window layers, tied classifier, soft-cap); the compiled file records
//! the graph set (format version 7), and conventions that declare their graphs refuse them.

use graph_io::{LogitRows, Preset};
use quant::DataType;
use ref_backend::format::{DESC_FORMAT_VERSION, HEADER_LEN, LAST_ROW_FORMAT_VERSION};
use ref_backend::{CompileOptions, CompiledModel, FormatError, WeightType};
use test_support::harness::{Harness, reseal};

const AR: usize = 4;

fn options(context: usize, kv: DataType, weights: WeightType, last_row: bool) -> CompileOptions {
    let mut o = CompileOptions::new(context, vec![1, AR]);
    (o.kv_dtype, o.weights, o.calibration_tokens) = (kv, weights, 24);
    o.last_row = last_row;
    o
}

fn stories(kv: DataType, weights: WeightType, last_row: bool) -> CompiledModel {
    let (ckpt, tok) = test_support::stories::stories260k_loaded();
    let o = options(64, kv, weights, last_row);
    let prompts = test_support::stories::default_prompts(&tok);
    test_support::compile::compile_ckpt(&ckpt, &prompts, &o).unwrap()
}

fn gemma3(kv: DataType, weights: WeightType) -> CompiledModel {
    let m = test_support::families::toy_model("gemma3").unwrap();
    let o = options(48, kv, weights, true);
    let prompts = test_support::stories::synthetic_prompts(m.config.vocab_size.min(200));
    let w = &*m.weights;
    ref_backend::compile(&m.config, w, &prompts, &o, [3; 32], &mut |_| {}).unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Steps `tokens` in AR-4 chunks through the all-row and the last-row graph, each on its own
/// K/V history: every chunk's last row agrees bit for bit (a chunk after the first also checks
/// the K/V the last-row graph wrote before it).
fn check_last_row_equals_all_rows(model: &CompiledModel, tokens: &[u32], what: &str) {
    let all = model.graph_for(AR, LogitRows::All).unwrap();
    let last = model.graph_for(AR, LogitRows::Last).unwrap();
    let v = model.config().vocab_size;
    let logits = last
        .outputs()
        .iter()
        .find(|t| t.role == ref_backend::IoRole::Logits);
    assert_eq!(logits.unwrap().shape, [1, 1, v], "{what}");
    assert_eq!(last.logit_rows(), LogitRows::Last);
    assert!(
        model.graph_for(1, LogitRows::Last).is_none(),
        "AR-1's one row is its last"
    );
    let (mut ha, mut hl) = (Harness::for_model(model), Harness::for_model(model));
    for (i, chunk) in tokens.chunks_exact(AR).enumerate() {
        let rows = ha.step(all, chunk);
        let one = hl.step(last, chunk);
        assert_eq!(rows.len(), AR * v);
        assert_eq!(one.len(), v);
        assert!(
            bits(&rows[(AR - 1) * v..]) == bits(&one),
            "{what}: chunk {i}: the last-row graph's logits differ from the all-row graph's last row"
        );
    }
}

fn prompt(vocab: usize) -> Vec<u32> {
    (0..24u32)
        .map(|i| 1 + (i * 37 + 5) % (vocab as u32 - 1))
        .collect()
}

#[test]
fn last_row_logits_equal_the_all_row_graphs_last_row_on_stories260k() {
    for (kv, weights) in [
        (DataType::U8, WeightType::I8),
        (DataType::U16, WeightType::I4),
        (DataType::F32, WeightType::F32),
    ] {
        let model = stories(kv, weights, true);
        let what = format!("stories260K {kv}/{}", weights.name());
        check_last_row_equals_all_rows(&model, &prompt(model.config().vocab_size), &what);
    }
}

#[test]
fn last_row_logits_equal_the_all_row_graphs_last_row_on_the_gemma3_toy() {
    for (kv, weights) in [
        (DataType::U16, WeightType::I8),
        (DataType::F16, WeightType::F16),
    ] {
        let model = gemma3(kv, weights);
        assert!(model.config().layer_windows.iter().any(Option::is_some));
        let what = format!("gemma3 toy {kv}/{}", weights.name());
        check_last_row_equals_all_rows(&model, &prompt(model.config().vocab_size), &what);
    }
}

/// The graph set is the options' declaration: all-row graphs in `ar`'s order, then one last-row
/// graph per variant above 1; without `last_row`, the all-row graphs only.
#[test]
fn the_graph_set_is_read_from_the_options() {
    let model = stories(DataType::U8, WeightType::I8, true);
    let set: Vec<_> = (model.graphs().iter())
        .map(|g| (g.name().to_string(), g.ar(), g.logit_rows()))
        .collect();
    assert_eq!(
        set,
        [
            ("ar1_cl64".into(), 1, LogitRows::All),
            ("ar4_cl64".into(), 4, LogitRows::All),
            ("ar4_cl64_last".into(), 4, LogitRows::Last),
        ]
    );
    assert_eq!(model.options().graph_set().len(), 3);
    let plain = stories(DataType::U8, WeightType::I8, false);
    assert_eq!(plain.graphs().len(), 2);
    assert!(plain.graph_for(AR, LogitRows::Last).is_none());
}

/// The offset of the last byte of the `OPTS` section (the last-row flag in version 7).
fn opts_last_byte(bytes: &[u8]) -> usize {
    let len = u64::from_le_bytes(bytes[HEADER_LEN + 4..HEADER_LEN + 12].try_into().unwrap());
    HEADER_LEN + 12 + len as usize - 1
}

#[test]
fn the_file_records_the_graph_set_by_its_version() {
    let model = stories(DataType::U8, WeightType::I8, true);
    let bytes = model.to_bytes();
    let version = u32::from_le_bytes(bytes[8..12].try_into().unwrap());
    assert_eq!(version, LAST_ROW_FORMAT_VERSION);
    let back = CompiledModel::from_bytes(&bytes, "last.bin").unwrap();
    assert!(back == model);
    assert!(back.options().last_row);
    assert!(back.graph_for(AR, LogitRows::Last).is_some());
    // Without last-row graphs the file keeps the version older builds read.
    let plain = stories(DataType::U8, WeightType::I8, false).to_bytes();
    let old = u32::from_le_bytes(plain[8..12].try_into().unwrap());
    assert!(old < DESC_FORMAT_VERSION + 1, "version {old}");
    assert!(
        !CompiledModel::from_bytes(&plain, "plain.bin")
            .unwrap()
            .options()
            .last_row
    );

    // A damaged flag is named.
    let mut bad = bytes.clone();
    let flag = opts_last_byte(&bad);
    assert_eq!(bad[flag], 1);
    bad[flag] = 2;
    let e = CompiledModel::from_bytes(&reseal(bad), "bad.bin").unwrap_err();
    assert!(e.to_string().contains("last-row graphs flag is 2"), "{e}");
    // A version-7 file read as version 6 leaves the flag unread; a later version is refused
    // by its version, saying which this build reads.
    let mut as6 = bytes.clone();
    as6[8..12].copy_from_slice(&DESC_FORMAT_VERSION.to_le_bytes());
    let e = CompiledModel::from_bytes(&reseal(as6), "as6.bin").unwrap_err();
    assert!(e.to_string().contains("unread byte"), "{e}");
    let mut newer = bytes;
    newer[8..12].copy_from_slice(&(LAST_ROW_FORMAT_VERSION + 1).to_le_bytes());
    let e = CompiledModel::from_bytes(&reseal(newer), "newer.bin").unwrap_err();
    assert!(
        matches!(e, FormatError::UnsupportedVersion { found: 8, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("versions 3 to 7"), "{e}");
}

/// AI Hub's and ExecuTorch's conventions declare their graphs, each returning every row: a
/// model with last-row graphs is not renamed to them, and its parts (AI Hub's names) keep the
/// all-row graphs only.
#[test]
fn conventions_that_declare_their_graphs_keep_them() {
    let model = stories(DataType::U8, WeightType::I8, true);
    for preset in [Preset::AiHub, Preset::ExecuTorch] {
        let e = model.with_naming(preset).unwrap_err();
        assert!(
            e.to_string().contains("compile without last-row"),
            "{preset}: {e}"
        );
    }
    let parts = model.split(2, true).unwrap();
    for p in &parts {
        assert!(!p.options().last_row);
        assert!(p.graphs().iter().all(|g| g.logit_rows() == LogitRows::All));
    }
    assert!(Preset::Htpkv.convention().last_row_graphs);
}

//! Files of the GGUF writer, read back by `model::gguf` (a reader written separately).

use std::io::Cursor;

use model::gguf::{Array, GgufFile, Value};
use test_support::families::{FAMILIES, toy_gguf, toy_spec};
use test_support::gguf::{GgufWriter, MetaArray};

fn parse(bytes: &[u8]) -> GgufFile {
    GgufFile::read(Cursor::new(bytes), bytes.len() as u64).unwrap()
}

#[test]
fn every_value_type_reads_back() {
    let mut w = GgufWriter::with_alignment(64);
    w.kv("u8", 200u8)
        .kv("i8", -5i8)
        .kv("u16", 60000u16)
        .kv("i16", -300i16)
        .kv("u32", 4_000_000_000u32)
        .kv("i32", -7i32)
        .kv("f32", 1.5f32)
        .kv("bool", true)
        .kv("str", "héllo")
        .kv("u64", u64::MAX)
        .kv("i64", i64::MIN)
        .kv("f64", 0.25f64)
        .str_array("strs", &["a", "", "ĠHello"])
        .kv("ints", vec![-1i32, 2, -3])
        .kv("floats", vec![0.5f32, -2.0])
        .kv("u64s", vec![1u64, 2])
        .kv("bools", vec![true, false])
        .kv(
            "nested",
            MetaArray::Array(vec![MetaArray::U8(vec![1, 2]), MetaArray::U8(vec![3])]),
        );
    let f = parse(&w.to_bytes());
    let get = |k: &str| f.get(k).cloned().unwrap();
    assert_eq!(f.alignment, 64);
    assert_eq!(get("general.alignment"), Value::U32(64));
    assert_eq!(get("u8"), Value::U8(200));
    assert_eq!(get("i8"), Value::I8(-5));
    assert_eq!(get("u16"), Value::U16(60000));
    assert_eq!(get("i16"), Value::I16(-300));
    assert_eq!(get("u32"), Value::U32(4_000_000_000));
    assert_eq!(get("i32"), Value::I32(-7));
    assert_eq!(get("f32"), Value::F32(1.5));
    assert_eq!(get("bool"), Value::Bool(true));
    assert_eq!(get("str"), Value::String("héllo".into()));
    assert_eq!(get("u64"), Value::U64(u64::MAX));
    assert_eq!(get("i64"), Value::I64(i64::MIN));
    assert_eq!(get("f64"), Value::F64(0.25));
    let strs = ["a", "", "ĠHello"].map(String::from).to_vec();
    assert_eq!(get("strs"), Value::Array(Array::String(strs)));
    assert_eq!(get("ints"), Value::Array(Array::Signed(vec![-1, 2, -3])));
    assert_eq!(get("floats"), Value::Array(Array::Float(vec![0.5, -2.0])));
    assert_eq!(get("u64s"), Value::Array(Array::Unsigned(vec![1, 2])));
    assert_eq!(get("bools"), Value::Array(Array::Bool(vec![true, false])));
    let nested = vec![Array::Unsigned(vec![1, 2]), Array::Unsigned(vec![3])];
    assert_eq!(get("nested"), Value::Array(Array::Array(nested)));
}

#[test]
fn f32_and_f16_tensors_read_back_at_their_shapes() {
    let mut w = GgufWriter::new();
    let m: Vec<f32> = (0..6).map(|i| i as f32 - 2.5).collect();
    w.tensor_f32("m.weight", &[3, 2], &m);
    w.tensor_f16("h.weight", &[5], &[0.5, -1.0, 2.0, 65504.0, 1e-3]);
    let bytes = w.to_bytes();
    let f = parse(&bytes);
    let mut r = Cursor::new(&bytes);
    let t = f.tensor("m.weight").unwrap();
    assert_eq!(t.shape(), [2, 3]);
    assert_eq!(f.read_f32(&mut r, t).unwrap(), m);
    let h = f.read_f32(&mut r, f.tensor("h.weight").unwrap()).unwrap();
    assert_eq!(h[..4], [0.5, -1.0, 2.0, 65504.0]);
    assert!((h[4] - 1e-3).abs() < 1e-6, "{}", h[4]);
}

#[test]
fn every_toy_reads_back_with_its_vocabulary_and_classifier() {
    for family in FAMILIES {
        let spec = toy_spec(family).unwrap();
        let bytes = toy_gguf(family).unwrap();
        let f = parse(&bytes);
        let arch = f.get("general.architecture").and_then(Value::as_str);
        assert_eq!(arch, Some(spec.arch), "{family}");
        let key = |k: &str| f.get(&format!("{}.{k}", spec.arch)).and_then(Value::as_u64);
        assert_eq!(
            key("block_count"),
            Some(u64::from(spec.n_layer)),
            "{family}"
        );
        let Some(Array::String(tokens)) = f.get("tokenizer.ggml.tokens").and_then(Value::as_array)
        else {
            panic!("{family}: no token list");
        };
        let emb = f.tensor("token_embd.weight").unwrap();
        assert_eq!(
            emb.dims,
            [u64::from(spec.dim), tokens.len() as u64],
            "{family}"
        );
        assert_eq!(f.tensor("output.weight").is_none(), spec.tied, "{family}");
        let blk = |n: &str| {
            f.tensor(&format!("blk.{}.{n}.weight", spec.n_layer - 1))
                .is_some()
        };
        assert_eq!(blk("attn_qkv"), spec.fused, "{family}");
        assert_eq!(blk("attn_q_norm"), spec.qk_norm, "{family}");
        assert_eq!(blk("post_ffw_norm"), spec.post_norms, "{family}");
        assert_eq!(
            f.tensor("rope_freqs.weight").is_some(),
            spec.llama3_rope.is_some()
        );
    }
}

#[test]
fn toy_chat_templates_render_the_families_turn_formats() {
    use model::{ChatTemplate, Message};
    let chat = [
        Message::new("system", "Be brief."),
        Message::new("user", "Hi"),
        Message::new("assistant", "Hello"),
        Message::new("user", "Bye"),
    ];
    let render = |family: &str| {
        let f = parse(&toy_gguf(family).unwrap());
        ChatTemplate::from_gguf(&f)
            .unwrap()
            .render_chat(&chat, true)
            .unwrap()
    };
    let gemma = "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n\
                 <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n";
    assert_eq!(render("gemma3"), gemma);
    // The template file given to Gemma 3 base models (`--chat-template`) renders the same turns.
    let file = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../configs/chat-templates/gemma3.jinja"
    );
    let source = std::fs::read_to_string(file).unwrap();
    let given = ChatTemplate::new(&source, "<bos>", "<eos>").unwrap();
    assert_eq!(given.render_chat(&chat, true).unwrap(), gemma);
    assert_eq!(
        render("qwen3"),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
    );
}

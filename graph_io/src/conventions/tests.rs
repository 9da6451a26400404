use crate::*;

fn a(role: IoRole, layer: Option<usize>, head: Option<usize>) -> Assigned {
    Assigned { role, layer, head }
}

fn gn<'a>(name: &'a str, inputs: &[&'a str], outputs: &[&'a str]) -> GraphNames<'a> {
    GraphNames {
        name,
        inputs: inputs.to_vec(),
        outputs: outputs.to_vec(),
    }
}

const AIHUB_IN: &[&str] = &[
    "input_ids",
    "attention_mask",
    "position_ids_cos",
    "position_ids_sin",
    "past_key_0_in",
    "past_value_0_in",
];
const AIHUB_OUT: &[&str] = &[
    "_model_layers_0_Add_1_output_0",
    "past_key_0_out",
    "past_value_0_out",
];

#[test]
fn htpkv_names_give_roles_per_layer_and_per_head() {
    let c = Convention::preset("htpkv").unwrap();
    let (ins, outs) = c
        .assign(
            "ar1_cl64",
            &[
                "input_ids",
                "positions",
                "mask",
                "past_key_3_1",
                "past_value_0",
            ],
            &["logits", "new_key_3_1", "new_value_0"],
        )
        .unwrap();
    assert_eq!(ins[0], a(IoRole::InputIds, None, None));
    assert_eq!(ins[2], a(IoRole::Mask, None, None));
    assert_eq!(ins[3], a(IoRole::PastKey, Some(3), Some(1)));
    assert_eq!(ins[4], a(IoRole::PastValue, Some(0), None));
    assert_eq!(outs[1], a(IoRole::NewKey, Some(3), Some(1)));
    assert_eq!(c.graph_name("ar1_cl64").unwrap().parts, 1);
}

#[test]
fn aihub_names_parts_and_the_hidden_state() {
    let c = Convention::preset("aihub").unwrap();
    let (ins, outs) = c.assign("g", AIHUB_IN, AIHUB_OUT).unwrap();
    assert_eq!(ins[2].role, IoRole::RopeCos);
    assert_eq!(ins[3].role, IoRole::RopeSin);
    assert_eq!(ins[4], a(IoRole::PastKey, Some(0), None));
    assert_eq!(outs[0].role, IoRole::HiddenOut);
    assert_eq!(outs[2], a(IoRole::NewValue, Some(0), None));
    let g = c.graph_name("prompt_ar128_cl4096_2_of_3").unwrap();
    assert_eq!(
        g,
        GraphName {
            part: 1,
            parts: 3,
            ar: Some(128),
            context: Some(4096)
        }
    );
    // Older Llama-2 exports: K/V per head.
    let (ins, _) = c.assign("g", &["past_key_2_h5_in"], &["logits"]).unwrap();
    assert_eq!(ins[0], a(IoRole::PastKey, Some(2), Some(5)));
}

#[test]
fn two_unclaimed_tensors_are_an_error_naming_them() {
    let c = Convention::preset("aihub").unwrap();
    let err = c
        .assign("g", &["input_ids", "foo", "bar"], &["logits"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("foo, bar"), "{err}");
    assert!(err.contains("hidden state"), "{err}");
}

#[test]
fn bad_part_numbers_are_refused() {
    let c = Convention::preset("aihub").unwrap();
    for name in ["token_ar1_cl4096_0_of_3", "token_ar1_cl4096_4_of_3"] {
        let err = c.graph_name(name).unwrap_err().to_string();
        assert!(err.contains("is not a part"), "{name}: {err}");
    }
    assert!(c.graph_name("ar1_cl64").is_err());
}

#[test]
fn executorch_io_is_found_by_index() {
    let c = Convention::preset("executorch").unwrap();
    let ins = ["t", "m", "p", "k0", "k1", "v0", "v1"];
    let outs = ["l", "k0", "k1", "v0", "v1"];
    let (i, o) = c.assign("kv_forward", &ins, &outs).unwrap();
    assert_eq!(i[0].role, IoRole::InputIds);
    assert_eq!(i[1].role, IoRole::Mask);
    assert_eq!(i[2].role, IoRole::Positions);
    assert_eq!(i[4], a(IoRole::PastKey, Some(1), None));
    assert_eq!(i[5], a(IoRole::PastValue, Some(0), None));
    assert_eq!(o[4], a(IoRole::NewValue, Some(1), None));
    assert_eq!(c.mask, MaskEncoding::AttendMax);
    // An odd number of K/V inputs does not split into layers.
    let err = c.assign("kv_forward", &ins[..6], &outs).unwrap_err();
    assert!(err.to_string().contains("do not fit"), "{err}");
}

#[test]
fn detection_picks_the_one_fitting_preset() {
    let htpkv = [gn(
        "ar1_cl64",
        &[
            "input_ids",
            "positions",
            "attention_mask",
            "past_key_0",
            "past_value_0",
        ],
        &["logits", "new_key_0", "new_value_0"],
    )];
    assert_eq!(detect(&htpkv).unwrap().name, "htpkv");
    let aihub = [gn("token_ar1_cl4096_1_of_3", AIHUB_IN, AIHUB_OUT)];
    assert_eq!(detect(&aihub).unwrap().name, "aihub");
    let et = [gn(
        "kv_forward",
        &["a", "b", "c", "d", "e"],
        &["l", "d", "e"],
    )];
    assert_eq!(detect(&et).unwrap().name, "executorch");
    let none = [gn("x", &["a", "b"], &["c", "d"])];
    let err = detect(&none).unwrap_err().to_string();
    assert!(err.contains("no preset"), "{err}");
}

#[test]
fn ambiguous_names_are_an_error_naming_the_candidates() {
    // A graph named like ExecuTorch's whose tensors also read as htpkv's.
    let both = [gn(
        "kv_forward",
        &[
            "input_ids",
            "attention_mask",
            "positions",
            "past_key_0",
            "past_value_0",
        ],
        &["logits", "new_key_0", "new_value_0"],
    )];
    let err = detect(&both).unwrap_err().to_string();
    assert!(err.contains("htpkv, executorch"), "{err}");
}

#[test]
fn yaml_conventions_parse_and_reject_unknown_fields() {
    let yaml = "name: mine\ngraphs: ['{phase}_n{ar}_p{part}of{parts}']\nmask: attend_max\nio:\n  by_name:\n    tokens: [ids]\n    mask: [m]\n    positions: [pos]\n    logits: [out]\n    past_key: ['k{layer}']\n    past_value: ['v{layer}']\n    new_key: ['nk{layer}']\n    new_value: ['nv{layer}']\n";
    let c = Convention::from_yaml(yaml, "mine.yaml").unwrap();
    assert_eq!(c.mask, MaskEncoding::AttendMax);
    let g = c.graph_name("decode_n1_p2of2").unwrap();
    assert_eq!((g.part, g.parts, g.ar), (1, 2, Some(1)));
    let (ins, _) = c.assign("decode_n1_p2of2", &["k12"], &["out"]).unwrap();
    assert_eq!(ins[0], a(IoRole::PastKey, Some(12), None));

    let unknown = yaml.replace("mask: attend_max", "mask: attend_max\ncolour: blue");
    let err = Convention::from_yaml(&unknown, "mine.yaml").unwrap_err();
    assert!(err.to_string().contains("mine.yaml"), "{err}");
    let source = std::error::Error::source(&err).unwrap().to_string();
    assert!(source.contains("colour"), "{source}");
}

#[test]
fn malformed_patterns_are_refused() {
    for (pattern, reason) in [
        ("k{layer", "not closed"),
        ("k{layr}", "not a field"),
        ("k{layer}{head}", "separated"),
        ("k{layer}_{layer}", "twice"),
        ("k}", "no `{`"),
    ] {
        let yaml = format!("name: x\nio:\n  by_name:\n    past_key: ['{pattern}']\n");
        let err = Convention::from_yaml(&yaml, "x").unwrap_err().to_string();
        assert!(err.contains(reason), "{pattern}: {err}");
    }
    // A field of graph names is not a field of tensor names.
    let yaml = "name: x\nio:\n  by_name:\n    tokens: ['ids{ar}']\n";
    assert!(Convention::from_yaml(yaml, "x").is_err());
}

#[test]
fn huge_numbers_in_names_do_not_match_or_overflow() {
    let c = Convention::preset("htpkv").unwrap();
    let long = format!("past_key_{}", "9".repeat(40));
    let err = c.assign("g", &[&long, "x"], &["logits"]).unwrap_err();
    assert!(err.to_string().contains("match no role"), "{err}");
}

#[test]
fn labels_name_role_layer_and_head() {
    assert_eq!(
        role_label(&a(IoRole::PastKey, Some(3), Some(1))),
        "past K layer 3 head 1"
    );
    assert_eq!(
        role_label(&a(IoRole::HiddenOut, None, None)),
        "hidden state out"
    );
}

/// AI Hub's own split (quic/ai-hub-models `split_onnx_utils`): part 1 is the embedding alone and
/// the hidden state between parts is named after the ONNX tensor at the cut; by elimination it is
/// the hidden state on both sides.
#[test]
fn aihub_split_names_are_the_hidden_state() {
    let c = Convention::preset("aihub").unwrap();
    let embed = "_model_model_embed_tokens_Gather_output_0";
    let (ins, outs) = c
        .assign("token_ar1_cl4096_1_of_5", &["input_ids"], &[embed])
        .unwrap();
    assert_eq!(ins[0].role, IoRole::InputIds);
    assert_eq!(outs[0].role, IoRole::HiddenOut);
    let after = "_model_model_layers_8_Add_1_output_0";
    let (ins, outs) = c
        .assign(
            "token_ar1_cl4096_2_of_5",
            &[
                embed,
                "attention_mask",
                "position_ids_cos",
                "position_ids_sin",
                "past_key_8_in",
            ],
            &[after, "past_key_8_out"],
        )
        .unwrap();
    assert_eq!(ins[0].role, IoRole::HiddenIn);
    assert_eq!(ins[4], a(IoRole::PastKey, Some(8), None));
    assert_eq!(outs[0].role, IoRole::HiddenOut);
    assert_eq!(outs[1], a(IoRole::NewKey, Some(8), None));
    assert_eq!(c.graph_name("token_ar1_cl4096_1_of_5").unwrap().part, 0);
}

fn part(index: usize, count: usize) -> PartOf {
    PartOf { index, count }
}

/// The compiler's direction: names written from the same patterns the runtime reads.
#[test]
fn presets_write_the_names_they_read() {
    let name = |p: Preset, role, layer, head| {
        p.tensor_names()
            .tensor_name(role, layer, head)
            .unwrap()
            .unwrap()
    };
    assert_eq!(
        name(Preset::Htpkv, IoRole::PastKey, Some(3), Some(1)),
        "past_key_3_1"
    );
    assert_eq!(
        name(Preset::Htpkv, IoRole::NewValue, Some(0), None),
        "new_value_0"
    );
    assert_eq!(
        name(Preset::AiHub, IoRole::NewKey, Some(2), Some(5)),
        "past_key_2_h5_out"
    );
    assert_eq!(
        name(Preset::AiHub, IoRole::PastValue, Some(2), None),
        "past_value_2_in"
    );
    // ExecuTorch files keep htpkv's names inside.
    assert_eq!(
        name(Preset::ExecuTorch, IoRole::PastKey, Some(1), None),
        "past_key_1"
    );
    for p in Preset::ALL {
        let c = p.tensor_names();
        for (role, input) in [(IoRole::PastKey, true), (IoRole::NewValue, false)] {
            for head in [None, Some(4)] {
                let n = c.tensor_name(role, Some(7), head).unwrap().unwrap();
                let back = c.parse_tensor(&n, input).unwrap();
                assert_eq!(back, Some(a(role, Some(7), head)), "{p}: {n}");
            }
        }
    }
    let graph = |p: Preset, n, at| p.convention().name_graph(n, 64, at).unwrap().unwrap();
    assert_eq!(graph(Preset::Htpkv, 1, part(0, 1)), "ar1_cl64");
    assert_eq!(
        graph(Preset::AiHub, 32, part(0, 2)),
        "prompt_ar32_cl64_1_of_2"
    );
    assert_eq!(graph(Preset::AiHub, 1, part(1, 2)), "token_ar1_cl64_2_of_2");
    assert_eq!(graph(Preset::ExecuTorch, 1, part(0, 1)), "kv_forward");
    assert_eq!(graph(Preset::ExecuTorch, 8, part(0, 1)), "prefill_forward");
    // The compiler's entry points: every preset names graphs and K/V tensors; cross K/V, which no
    // preset's table names, keep htpkv's names.
    assert_eq!(
        Preset::AiHub.graph_name(1, 64, part(1, 2)),
        "token_ar1_cl64_2_of_2"
    );
    let t = KvTensor {
        io: KvIo::Past,
        kind: TensorKind::Value,
        layer: 3,
        head: None,
    };
    assert_eq!(Preset::AiHub.kv_name(&t), "past_value_3_in");
    assert_eq!(Preset::ExecuTorch.kv_name(&t), "past_value_3");
    let cross = KvTensor {
        io: KvIo::Cross,
        ..t
    };
    for p in Preset::ALL {
        assert!(!p.graph_name(4, 64, part(0, 1)).is_empty());
        assert_eq!(p.kv_name(&cross), "cross_value_3");
    }
    let g = Preset::AiHub.convention();
    let read = g.graph_name("token_ar1_cl64_2_of_2").unwrap();
    assert_eq!((read.part, read.parts, read.ar), (1, 2, Some(1)));
    assert_eq!("aihub".parse::<Preset>().unwrap(), Preset::AiHub);
    for (i, p) in Preset::ALL.into_iter().enumerate() {
        assert_eq!(p as usize, i, "Preset::ALL is in declaration order");
        assert_eq!(p.name().parse::<Preset>().unwrap(), p);
    }
    assert!("qualcomm".parse::<Preset>().is_err());
}

/// What a new convention is: one `conventions/{name}.rs` building a [`Convention`] (here inline),
/// plus its arm in [`Preset`]. Both directions of its names follow from its patterns alone, and
/// what it declares beyond names (a fixed layout with the heads second, an attend-max mask, one
/// file only, its own split) takes effect through the calls every consumer makes: the compiler's
/// refusals and layout, the parts' naming, the reference library's dims and IO order.
#[test]
fn a_new_convention_is_one_file_and_one_arm() {
    let mine = Convention {
        name: "mine".into(),
        graphs: vec!["step{ar}_of{context}".into()],
        io: IoRules::ByName(Box::new(NameTable {
            tokens: vec!["ids".into()],
            mask: vec!["m".into()],
            logits: vec!["out".into()],
            past_key: vec!["k{layer}".into()],
            new_key: vec!["k{layer}.new".into()],
            ..NameTable::default()
        })),
        mask: MaskEncoding::AttendMax,
        graph_naming: GraphNaming::default(),
        layout: GraphLayout {
            kv: Granularity::PerLayer,
            keys: KLayout::Transposed,
            positions: PositionInput::Ids,
            heads: HeadAxis::Second,
        },
        layout_fixed: true,
        last_row_graphs: false,
        packaging: Packaging::FileOnly,
        split: Split::AiHub,
    };
    let g = mine.name_graph(4, 128, PartOf::default()).unwrap().unwrap();
    assert_eq!(g, "step4_of128");
    let k = mine
        .tensor_name(IoRole::PastKey, Some(2), None)
        .unwrap()
        .unwrap();
    let nk = mine
        .tensor_name(IoRole::NewKey, Some(2), None)
        .unwrap()
        .unwrap();
    let (ins, outs) = mine.assign(&g, &["ids", "m", &k], &["out", &nk]).unwrap();
    assert_eq!(ins[2], a(IoRole::PastKey, Some(2), None));
    assert_eq!(outs[1], a(IoRole::NewKey, Some(2), None));
    assert_eq!(mine.graph_name(&g).unwrap().context, Some(128));
    // No per-head pattern: a per-head name cannot be written.
    assert_eq!(
        mine.tensor_name(IoRole::PastKey, Some(2), Some(0)).unwrap(),
        None
    );

    // What its names carry: AR and context, no part.
    assert!(mine.names_ar() && mine.names_context() && !mine.names_parts());
    let cut = mine.refusal(2, false, &[1]).unwrap();
    assert!(
        cut.contains("mine convention cannot be cut into 2 parts"),
        "{cut}"
    );
    assert_eq!(mine.refusal(1, false, &[1, 8, 16]), None);
    // Its fixed layout: position ids only, and only its own K/V layout.
    let tables = mine.refusal(1, true, &[1]).unwrap();
    assert!(
        tables.contains("takes position ids, not RoPE tables"),
        "{tables}"
    );
    let other = mine
        .layout_refusal(Granularity::PerHead, KLayout::Rows)
        .unwrap();
    assert!(
        other.contains("--k-layout transposed --granularity per_layer"),
        "{other}"
    );
    assert_eq!(
        mine.layout_refusal(Granularity::PerLayer, KLayout::Transposed),
        None
    );
    // Not fixed, the same layout is only a default.
    let loose = Convention {
        layout_fixed: false,
        ..mine.clone()
    };
    assert_eq!(
        loose.layout_refusal(Granularity::PerHead, KLayout::Rows),
        None
    );
    assert_eq!(loose.refusal(1, true, &[1]), None);
    // The heads second in the dims clients see.
    assert_eq!(mine.layout.heads.arrange(&[4, 1, 63, 8]), [1, 4, 63, 8]);
    // One file only: its parts go nowhere; packaged as a file, under the bundle convention.
    let aihub = Preset::AiHub.convention();
    let bundles = [aihub.clone()];
    assert_eq!(mine.parts_convention(&bundles), None);
    let file = Convention {
        packaging: Packaging::File,
        ..mine.clone()
    };
    assert_eq!(file.parts_convention(&bundles), Some(&aihub));
    // By position, its IO is listed in its index order (K/V by layer); by name, as given.
    let positional = Convention {
        io: IoRules::ByIndex(IndexOrder {
            inputs: vec![IoRole::PastKey, IoRole::InputIds, IoRole::Mask],
            outputs: vec![IoRole::NewKey, IoRole::Logits],
        }),
        ..mine.clone()
    };
    let held = [
        (IoRole::InputIds, None, None),
        (IoRole::Mask, None, None),
        (IoRole::PastKey, Some(1), None),
        (IoRole::PastKey, Some(0), None),
    ];
    assert!(positional.io_by_index() && !mine.io_by_index());
    assert_eq!(positional.io_order(&held), [3, 2, 0, 1]);
    assert_eq!(mine.io_order(&held), [0, 1, 2, 3]);
}

/// What each preset declares, as the compiler and the reference library read it: ExecuTorch's
/// layout is its runtime's (`k [1, kv_heads, D, rows]`, fixed, position ids; the one layout the
/// compiler writes for it), AI Hub's its exports' (a Genie bundle cut its own way), htpkv's a
/// default whose parts take AI Hub's names.
#[test]
fn presets_declare_what_callers_read() {
    let et = Preset::ExecuTorch.convention();
    assert_eq!(et.layout, GraphLayout::EXECUTORCH);
    assert!(et.layout_fixed && et.io_by_index() && !et.names_parts() && !et.names_context());
    assert_eq!(et.mask, MaskEncoding::AttendMax);
    assert_eq!(et.packaging, Packaging::FileOnly);
    let ar = et.refusal(1, false, &[1, 8, 16]).unwrap();
    assert!(ar.contains("(prefill_forward, kv_forward)"), "{ar}");
    let aihub = Preset::AiHub.convention();
    assert_eq!(aihub.layout, GraphLayout::AIHUB);
    assert_eq!(
        (aihub.packaging, aihub.split),
        (Packaging::GenieBundle, Split::AiHub)
    );
    let own = Preset::Htpkv.convention();
    assert_eq!(own.layout, GraphLayout::HTPKV);
    assert!(!own.layout_fixed && !own.names_parts());
    assert_eq!(
        (own.packaging, own.split),
        (Packaging::File, Split::Balanced)
    );
    assert_eq!(Preset::default(), Preset::Htpkv);
    assert_eq!(Preset::Htpkv.parts_naming(), Some(Preset::AiHub));
    assert_eq!(Preset::AiHub.parts_naming(), Some(Preset::AiHub));
    assert_eq!(Preset::ExecuTorch.parts_naming(), None);
    assert_eq!(Preset::owning(Split::AiHub), Some(Preset::AiHub));
    assert_eq!(Preset::owning(Split::Balanced), Some(Preset::Htpkv));
    assert_eq!("aihub".parse::<Split>(), Ok(Split::AiHub));
    assert!(
        "even"
            .parse::<Split>()
            .unwrap_err()
            .contains("balanced or aihub")
    );
}

/// Index-order entries in YAML: `hidden` takes its side's role, an unknown entry is refused and an
/// entry of the other side is an error of the graph.
#[test]
fn yaml_index_orders_name_their_entries() {
    let yaml = "name: pos\ngraphs: ['{phase}_forward']\nio:\n  by_index:\n    inputs: [hidden, mask, past_keys]\n    outputs: [hidden, new_keys]\n";
    let c = Convention::from_yaml(yaml, "pos.yaml").unwrap();
    let (ins, outs) = c
        .assign("kv_forward", &["h", "m", "k0", "k1"], &["h", "n0", "n1"])
        .unwrap();
    assert_eq!(ins[0].role, IoRole::HiddenIn);
    assert_eq!(ins[3], a(IoRole::PastKey, Some(1), None));
    assert_eq!(outs[0].role, IoRole::HiddenOut);
    let bad = yaml.replace("[hidden, mask, past_keys]", "[hidden, masks]");
    let err = Convention::from_yaml(&bad, "pos.yaml").unwrap_err();
    let source = std::error::Error::source(&err).unwrap().to_string();
    assert!(source.contains("masks"), "{source}");
    let wrong_side = yaml.replace("[hidden, new_keys]", "[logits, mask]");
    let c = Convention::from_yaml(&wrong_side, "pos.yaml").unwrap();
    let err = c
        .assign("kv_forward", &["h", "m"], &["l", "m"])
        .unwrap_err();
    assert!(
        err.to_string().contains("cannot be one of the outputs"),
        "{err}"
    );
}

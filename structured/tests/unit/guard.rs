//! What llguidance cannot compile safely is refused before it is called (issue 36): integer bounds
//! past 2^53 − 1, deep nesting and `$ref`/`anyOf` chains, long Lark rule chains, `multipleOf`
//! values whose merge overflows; every constrained answer that ends validates against its schema
//! (checked with the independent `jsonschema` crate).

use super::{END, vocab};
use htpkv_runtime::constraint::ConstraintFactory;
use htpkv_structured::guard::{MAX_LARK_RULE_CHAIN, MAX_SCHEMA_DEPTH};
use htpkv_structured::tools;
use htpkv_structured::{ErrorKind, OutputFormat};
use proptest::prelude::*;
use serde_json::{Value, json};

fn refused(format: &OutputFormat) -> String {
    let e = vocab().compile(format, "response_format").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest);
    e.to_string()
}

fn schema(v: Value) -> OutputFormat {
    OutputFormat::JsonSchema(v)
}

/// A chain of `depth` `$defs`, each made by `link` from the next one's `$ref`.
fn chain(depth: usize, link: impl Fn(&str) -> Value) -> Value {
    let mut defs = serde_json::Map::new();
    for i in 0..depth {
        defs.insert(format!("a{i}"), link(&format!("#/$defs/a{}", i + 1)));
    }
    defs.insert(format!("a{depth}"), json!({"type": "integer"}));
    json!({"$ref": "#/$defs/a0", "$defs": defs})
}

#[test]
fn integer_bounds_past_2_pow_53_are_refused_naming_the_keyword_and_its_place() {
    let min = i64::MIN + 1;
    for (s, pointer) in [
        // Both bounds are wrong: either is named first.
        (
            json!({"type": "integer", "minimum": min, "maximum": min}),
            "/m",
        ),
        (
            json!({"type": "integer", "minimum": 1e19, "maximum": 2e19}),
            "/m",
        ),
        (
            json!({"type": "integer", "exclusiveMinimum": -9.3e18}),
            "/exclusiveMinimum",
        ),
        (
            json!({"type": "integer", "maximum": 9007199254740993u64}),
            "/maximum",
        ),
        (json!({"type": "number", "maximum": -1e300}), "/maximum"),
        (
            json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": -9223372036854775807i64}}}),
            "/properties/n/minimum",
        ),
    ] {
        let text = refused(&schema(s.clone()));
        assert!(
            text.contains(&format!("schema at {pointer}")),
            "{s}: {text}"
        );
        assert!(text.contains("2^53"), "{s}: {text}");
    }
    // The same through a tool's parameters, and through a Lark %json.
    let tool = json!([{"type": "function", "function": {"name": "f", "parameters":
        {"type": "object", "properties": {"n": {"type": "integer", "minimum": min}}}}}]);
    let e = tools::parse_tools(&tool).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("tools[0].function.parameters (schema at /properties/n/minimum)"),
        "{e}"
    );
    let lark =
        format!("start: \"x\" inner\ninner: %json {{\"type\": \"integer\", \"minimum\": {min}}}\n");
    let text = refused(&OutputFormat::Lark(lark));
    assert!(
        text.contains("%json at grammar line 2") && text.contains("/minimum"),
        "{text}"
    );
}

#[test]
fn bounds_at_2_pow_53_minus_1_compile_and_answer_within_them() {
    let edge = (1i64 << 53) - 1;
    for s in [
        json!({"type": "integer", "minimum": -edge, "maximum": -edge}),
        json!({"type": "integer", "minimum": edge - 3, "maximum": edge}),
        json!({"type": "integer", "exclusiveMinimum": edge - 1}),
    ] {
        let text = answer(&schema(s.clone()), &order(b"9-0123456789")).unwrap();
        let n: i64 = text.parse().unwrap();
        assert!(jsonschema::is_valid(&s, &json!(n)), "{s}: {text}");
    }
}

#[test]
fn multiple_of_values_whose_merge_overflows_32_bits_are_refused() {
    let s = json!({"type": "integer", "allOf": [{"multipleOf": 65537}, {"multipleOf": 65539}]});
    assert!(refused(&schema(s)).contains("multipleOf"));
    for bad in [json!(0), json!(-2), json!(1e-300)] {
        let text = refused(&schema(json!({"type": "number", "multipleOf": bad})));
        assert!(text.contains("/multipleOf"), "{text}");
    }
    // Even the same value twice: llguidance multiplies before it divides.
    let same = json!({"allOf": [{"multipleOf": 70000}, {"multipleOf": 70000}], "type": "integer"});
    assert!(refused(&schema(same)).contains("multipleOf"));
    // Merged to 12: the one multiple between 13 and 30 is 24.
    let small = json!({"allOf": [{"multipleOf": 6}, {"multipleOf": 4}], "type": "integer", "minimum": 13, "maximum": 30});
    let text = answer(&schema(small.clone()), &order(b"0123456789")).unwrap();
    assert_eq!(text, "24");
    assert!(jsonschema::is_valid(&small, &json!(24)));
}

#[test]
fn ref_and_anyof_chains_and_nesting_past_the_limit_are_refused_and_below_it_compile() {
    type Link = fn(&str) -> Value;
    let links: [(Link, usize); 3] = [
        (|r| json!({"$ref": r}), 1),
        (|r| json!({"anyOf": [{"$ref": r}, {"type": "null"}]}), 3),
        (
            |r| json!({"type": "object", "properties": {"x": {"$ref": r}}, "required": ["x"]}),
            3,
        ),
    ];
    for (link, levels) in links {
        // The chain's last schema sits 3 levels below the root's `$defs`.
        let fits = MAX_SCHEMA_DEPTH / levels - 3;
        vocab().compile(&schema(chain(fits, link)), "x").unwrap();
        // The 400 `$ref`s and 300 `anyOf`s, and far more.
        for depth in [MAX_SCHEMA_DEPTH / levels + 1, 400, 300, 5000] {
            assert!(refused(&schema(chain(depth, link))).contains("deeper than"));
        }
    }
    let mut nested = json!({"type": "integer"});
    for _ in 0..MAX_SCHEMA_DEPTH {
        nested = json!({"type": "array", "items": nested});
    }
    assert!(refused(&schema(nested)).contains("deeper than"));
    // Recursion through `$ref` is a grammar rule, not nesting: it compiles.
    let tree = json!({"$defs": {"t": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/t"}}}}}, "$ref": "#/$defs/t"});
    vocab().compile(&schema(tree), "x").unwrap();
}

#[test]
fn lark_rule_chains_past_the_limit_are_refused() {
    let grammar = |n: usize| {
        let mut g = String::from("start: r0\n");
        for i in 0..n {
            g.push_str(&format!("r{i}: \"a\" r{} | \"b\"\n", i + 1));
        }
        g + &format!("r{n}: \"c\" // a comment naming r0 \"\n")
    };
    vocab()
        .compile(&OutputFormat::Lark(grammar(MAX_LARK_RULE_CHAIN - 2)), "x")
        .unwrap();
    for n in [MAX_LARK_RULE_CHAIN + 1, 5000] {
        assert!(refused(&OutputFormat::Lark(grammar(n))).contains("chain"));
    }
}

#[test]
fn llguidance_s_reason_is_kept_in_the_message() {
    let text = refused(&OutputFormat::Lark("start: nowhere\n".into()));
    assert!(
        text.contains("does not compile: ") && text.contains("nowhere"),
        "{text}"
    );
}

/// The end first (when the grammar allows it), then `bytes` in that order, then any allowed byte.
fn order(bytes: &[u8]) -> Vec<u32> {
    [vec![END], bytes.iter().map(|&b| u32::from(b)).collect()].concat()
}

/// The greedy answer under `order`, `None` when it has not ended within 64 tokens.
fn answer(format: &OutputFormat, order: &[u32]) -> Option<String> {
    let mut c = vocab().compile(format, "x").unwrap().start().unwrap();
    let mut out = Vec::new();
    for _ in 0..64 {
        let mut logits = vec![0.0f32; END as usize + 1];
        c.mask(&mut logits).unwrap();
        let ok = |t: u32| logits[t as usize].is_finite();
        let pick = (order.iter().copied().find(|&t| ok(t)))
            .or_else(|| (0..=END).find(|&t| ok(t)))
            .unwrap();
        c.commit(pick).unwrap();
        if pick == END {
            return Some(String::from_utf8(out).unwrap());
        }
        out.push(pick as u8);
    }
    None
}

/// Greedy answers under several token orders: each that ends must validate (checked by the
/// `jsonschema` crate), and at least one must end.
fn answers_validate(s: &Value) {
    let format = schema(s.clone());
    if vocab().compile(&format, "x").is_err() {
        return;
    }
    let orders = [
        order(b"]}\",9-.e1\"{[: "),
        order(b"1]}0-"),
        order(b"-7]}.\"3"),
    ];
    let mut ended = 0;
    for order in orders {
        let Some(text) = answer(&format, &order) else {
            continue;
        };
        ended += 1;
        let value: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{s}: {text}: {e}"));
        assert!(
            jsonschema::is_valid(s, &value),
            "{s}: {text} does not validate"
        );
    }
    assert!(ended > 0, "{s}: no answer ended");
}

#[test]
fn constrained_answers_validate_with_an_independent_validator() {
    for s in [
        json!({"type": "integer", "minimum": -9007199254740991i64, "maximum": -9007199254740000i64}),
        json!({"type": "integer", "minimum": 5, "exclusiveMaximum": 7}),
        json!({"type": "number", "minimum": -2.5, "maximum": 1e6}),
        json!({"type": "object", "properties": {"a": {"type": "integer", "minimum": 3}, "b": {"enum": ["x", 1]}}, "required": ["a", "b"]}),
        json!({"type": "array", "items": {"type": "integer", "multipleOf": 7}, "minItems": 2, "maxItems": 3}),
    ] {
        answers_validate(&s);
    }
}

/// Random schemas with extreme bounds and nesting: compiling them never panics, never overflows a
/// stack, never answers outside the schema.
fn extreme_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        prop::sample::select(vec![
            i64::MIN as f64,
            -9.3e18,
            1e19,
            1e300,
            -1e300,
            9007199254740992.0,
            -0.5,
            1e-300,
        ])
        .prop_map(|f| json!(f)),
        (-20i64..20).prop_map(|n| json!(n)),
    ]
}

fn random_schema() -> impl Strategy<Value = Value> {
    let leaf = (
        prop::sample::select(vec!["integer", "number"]),
        prop::option::of(extreme_number()),
        prop::option::of(extreme_number()),
        prop::option::of(extreme_number()),
    )
        .prop_map(|(ty, min, max, multiple)| {
            let mut s = json!({"type": ty});
            for (k, v) in [("minimum", min), ("maximum", max), ("multipleOf", multiple)] {
                if let Some(v) = v {
                    s[k] = v;
                }
            }
            s
        });
    leaf.prop_recursive(6, 40, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 1..3).prop_map(|v| json!({"anyOf": v})),
            prop::collection::vec(inner.clone(), 1..3).prop_map(|v| json!({"allOf": v})),
            inner
                .clone()
                .prop_map(|v| json!({"type": "array", "items": v, "maxItems": 2})),
            (inner, 0usize..300).prop_map(|(v, n)| chain_of(v, n)),
        ]
    })
}

/// `v` behind a chain of `n` `$ref`s.
fn chain_of(v: Value, n: usize) -> Value {
    let mut s = chain(n, |r| json!({"$ref": r}));
    s["$defs"][format!("a{n}")] = v;
    s
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn random_extreme_schemas_never_panic_and_answers_validate(s in random_schema()) {
        answers_validate(&s);
    }
}

#[test]
fn tool_parameters_deep_chains_are_refused_naming_the_tool() {
    let params = chain(400, |r| json!({"$ref": r}));
    let tool = json!([{"type": "function", "function": {"name": "f", "parameters": params}}]);
    let e = tools::parse_tools(&tool).unwrap_err();
    assert!(
        e.to_string().starts_with("tools[0].function.parameters"),
        "{e}"
    );
}

#[path = "../../../fuzz/checks/structured.rs"]
mod fuzz_check;
#[path = "../../../fuzz/checks/replay.rs"]
mod replay;

/// The `structured` fuzz target's corpus (the cases among its seeds) through its check.
#[test]
fn structured_fuzz_corpus() {
    replay::replay("structured", fuzz_check::check);
}

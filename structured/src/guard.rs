//! What llguidance cannot compile safely, refused before it is called, and the thread it compiles
//! on.
//!
//! llguidance 1.9 turns integer bounds into a regex by recursion on `i64` (`json/numeric.rs`,
//! `rx_int_range`) after casting the schema's `f64` bound with `as i64`: a bound past ±2^63
//! saturates (a silent clamp: `minimum: 1e19` allowed `9223372036854775807`), and a bound that
//! becomes `i64::MIN` is negated, which wraps in a release build and recurses without end (a
//! stack overflow that aborts the process). Bounds that an `f64` does not hold exactly (past
//! 2^53) are already changed when the schema is read. Its schema compiler, its `$ref` resolution
//! and its Lark parser recurse once per level of nesting, so a deep enough input overflows any
//! stack.
//!
//! So, before compiling ([`check`]):
//! - every `minimum`, `maximum`, `exclusiveMinimum` and `exclusiveMaximum` lies within
//!   ±[`MAX_EXACT_BOUND`] (2^53 − 1, the integers an `f64` and an `i64` both hold exactly, with
//!   room for the `+ 1` of an exclusive bound);
//! - `multipleOf` is above 0 with at most 9 digits, and when a schema has several, they multiply
//!   to less than 2^32, written as integers of their finest decimal place (llguidance merges them
//!   by least common multiple, multiplying two in `u32`);
//! - a schema nests at most [`MAX_SCHEMA_DEPTH`] levels, counting a local `$ref` as the schema it
//!   names written out in its place (so a chain of `$ref`s or `anyOf`s counts whole);
//! - a Lark grammar chains rules at most [`MAX_LARK_RULE_CHAIN`] deep, and each `%json` schema in
//!   it passes the schema checks (llguidance refuses brackets nested past 36 itself).
//!
//! Then [`on_compile_thread`] compiles on a thread with [`COMPILE_STACK_BYTES`] of stack, and a
//! panic there is an error of the request, not of the process.
//!
//! The limits are measured with `examples/stack_probe.rs` (a dev build, whose dependencies are
//! optimized as in a release): on a 2 MiB stack, the most llguidance compiled before overflowing
//! was a chain of 625 `$ref`s (625 levels), 228 objects each holding a `$ref` to the next in a
//! property (684 levels), 256 `anyOf`s each holding a `$ref` (768 levels), 362 objects written
//! out in each other (724 levels) and 600 Lark rules each naming the next: about 3.4 KiB of stack
//! per level. The limits below are a fifth of that on a 2 MiB stack, and the compiling thread has
//! 32 times that stack. `minLength`, `maxItems` and the like up to 10^9 compile in milliseconds
//! (llguidance's lexer is lazy), so they are not limited here.

use crate::{OutputFormat, StructuredError};
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};

/// The largest magnitude of a numeric bound: 2^53 − 1.
pub const MAX_EXACT_BOUND: i64 = (1 << 53) - 1;

/// The deepest a schema may nest (JSON objects and arrays, a local `$ref` counted as its target
/// written out): serde_json's own parsing limit, and a fifth of the 684 levels measured on 2 MiB.
pub const MAX_SCHEMA_DEPTH: usize = 128;

/// The longest chain of Lark rules, each naming the next (600 measured on 2 MiB).
pub const MAX_LARK_RULE_CHAIN: usize = 128;

/// The stack of the compiling thread: 64 MiB, 32 times the 2 MiB on which five times the limits
/// above compiled (reserved, not committed, until used).
pub const COMPILE_STACK_BYTES: usize = 64 << 20;

/// Refuses what llguidance cannot compile safely; errors name `what` and the JSON pointer of the
/// schema's place at fault.
pub fn check(format: &OutputFormat, what: &str) -> Result<(), StructuredError> {
    match format {
        OutputFormat::JsonSchema(schema) => check_schema(schema, what),
        OutputFormat::JsonObject | OutputFormat::Regex(_) => Ok(()),
        OutputFormat::Lark(grammar) => check_lark(grammar, what),
    }
}

/// Runs `compile` on a thread of its own with [`COMPILE_STACK_BYTES`] of stack; a panic in it is
/// an error naming `what`.
pub fn on_compile_thread<T: Send + 'static>(
    what: &str,
    compile: impl FnOnce() -> Result<T, StructuredError> + Send + 'static,
) -> Result<T, StructuredError> {
    let thread = std::thread::Builder::new()
        .name("htpkv-grammar".into())
        .stack_size(COMPILE_STACK_BYTES)
        .spawn(compile)
        .map_err(|e| StructuredError::invalid_from(what, "cannot start the compiling thread", e))?;
    thread.join().unwrap_or_else(|panic| {
        let text = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(StructuredError::invalid(
            what,
            format!("llguidance failed while compiling it: {text}"),
        ))
    })
}

/// Checks a JSON schema (see the module docs).
pub fn check_schema(schema: &Value, what: &str) -> Result<(), StructuredError> {
    let mut walk = Walk {
        root: schema,
        what,
        heights: HashMap::new(),
        active: HashSet::new(),
        multiples: Vec::new(),
    };
    walk.node(schema, "", 0)?;
    walk.check_multiples()
}

/// Keywords whose values are data, not schemas: walked for depth only.
const DATA: [&str; 4] = ["const", "enum", "default", "examples"];

struct Walk<'a> {
    root: &'a Value,
    what: &'a str,
    /// The height of each `$ref` target walked: how deep it nests below itself.
    heights: HashMap<String, usize>,
    /// `$ref`s being walked (a `$ref` back to one of them is recursion, which llguidance compiles
    /// as a grammar rule, not by nesting).
    active: HashSet<String>,
    /// Each `multipleOf`: (its value as an integer of its finest place, that place, pointer).
    multiples: Vec<(u64, u32, String)>,
}

impl Walk<'_> {
    fn error(&self, pointer: &str, message: impl Into<String>) -> StructuredError {
        let at = if pointer.is_empty() { "/" } else { pointer };
        StructuredError::invalid(format!("{} (schema at {at})", self.what), message.into())
    }

    /// Walks `v` at `depth`; returns the deepest level reached below it, `$ref`s written out.
    fn node(&mut self, v: &Value, pointer: &str, depth: usize) -> Result<usize, StructuredError> {
        if depth > MAX_SCHEMA_DEPTH {
            return Err(self.error(
                pointer,
                format!(
                    "the schema nests deeper than {MAX_SCHEMA_DEPTH} levels (counting each $ref as the schema it names)"
                ),
            ));
        }
        match v {
            Value::Array(items) => {
                let mut deepest = depth;
                for (i, item) in items.iter().enumerate() {
                    deepest = deepest.max(self.node(item, &format!("{pointer}/{i}"), depth + 1)?);
                }
                Ok(deepest)
            }
            Value::Object(map) => self.object(map, pointer, depth),
            _ => Ok(depth),
        }
    }

    fn object(
        &mut self,
        map: &Map<String, Value>,
        pointer: &str,
        depth: usize,
    ) -> Result<usize, StructuredError> {
        let mut deepest = depth;
        for (key, value) in map {
            let at = format!("{pointer}/{}", key.replace('~', "~0").replace('/', "~1"));
            if DATA.contains(&key.as_str()) {
                deepest = deepest.max(data_depth(value, depth + 1, &|d| {
                    (d > MAX_SCHEMA_DEPTH).then(|| self.error(&at, "the value nests too deep"))
                })?);
                continue;
            }
            self.keyword(key, value, &at)?;
            deepest = deepest.max(self.node(value, &at, depth + 1)?);
        }
        if let Some(Value::String(target)) = map.get("$ref") {
            deepest = deepest.max(self.reference(target, pointer, depth)?);
        }
        Ok(deepest)
    }

    /// The depth a local `$ref` reaches, its target written out at `depth + 1`.
    fn reference(
        &mut self,
        target: &str,
        pointer: &str,
        depth: usize,
    ) -> Result<usize, StructuredError> {
        let Some(fragment) = target.strip_prefix('#') else {
            return Ok(depth);
        };
        if self.active.contains(target) {
            return Ok(depth);
        }
        let height = match self.heights.get(target) {
            Some(&h) => h,
            None => {
                let Some(resolved) = self.root.pointer(fragment) else {
                    return Ok(depth);
                };
                self.active.insert(target.to_owned());
                let reached = self.node(resolved, fragment, depth + 1)?;
                self.active.remove(target);
                let h = reached - depth;
                self.heights.insert(target.to_owned(), h);
                h
            }
        };
        let reached = depth + height;
        if reached > MAX_SCHEMA_DEPTH {
            return Err(self.error(
                &format!("{pointer}/$ref"),
                format!(
                    "the schema nests deeper than {MAX_SCHEMA_DEPTH} levels through $ref {target}"
                ),
            ));
        }
        Ok(reached)
    }

    /// The numeric keywords: bounds and `multipleOf`.
    fn keyword(&mut self, key: &str, value: &Value, at: &str) -> Result<(), StructuredError> {
        let Value::Number(n) = value else {
            return Ok(());
        };
        match key {
            "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum" if !within_exact(n) => {
                return Err(self.error(
                    at,
                    format!(
                        "{key} = {n} is outside ±{MAX_EXACT_BOUND} (2^53 − 1), the bounds the \
                         constraint engine holds exactly"
                    ),
                ));
            }
            "multipleOf" => {
                let decimal = n.as_f64().filter(|&f| f > 0.0).and_then(decimal);
                let Some((coef, exp)) = decimal else {
                    return Err(self.error(
                        at,
                        format!("multipleOf = {n} must be above 0 with at most 9 digits"),
                    ));
                };
                self.multiples.push((coef, exp, at.to_owned()));
            }
            _ => {}
        }
        Ok(())
    }

    /// The `multipleOf` values at their common finest place multiply to less than 2^32 (llguidance
    /// multiplies two values before dividing by their greatest common divisor, in `u32`).
    fn check_multiples(&self) -> Result<(), StructuredError> {
        let finest = self.multiples.iter().map(|m| m.1).max().unwrap_or(0);
        let mut product: u64 = 1;
        for (coef, exp, at) in &self.multiples {
            let scaled = 10u64
                .checked_pow(finest - exp)
                .and_then(|p| p.checked_mul(*coef));
            product = scaled.map_or(u64::MAX, |s| product.saturating_mul(s));
            if self.multiples.len() > 1 && product > u64::from(u32::MAX) {
                return Err(self.error(
                    at,
                    "the schema's multipleOf values, written as integers of their finest decimal \
                     place, multiply past 2^32 (the constraint engine merges them in 32 bits)",
                ));
            }
        }
        Ok(())
    }
}

/// True when `n` is within ±[`MAX_EXACT_BOUND`].
fn within_exact(n: &serde_json::Number) -> bool {
    if let Some(i) = n.as_i64() {
        return (-MAX_EXACT_BOUND..=MAX_EXACT_BOUND).contains(&i);
    }
    if n.as_u64().is_some() {
        return false;
    }
    n.as_f64()
        .is_some_and(|f| f.abs() <= MAX_EXACT_BOUND as f64)
}

/// A positive number as `coef · 10^-exp` the way llguidance reads `multipleOf`, when `coef` has
/// at most 9 digits (so that it fits llguidance's `u32`).
fn decimal(mut value: f64) -> Option<(u64, u32)> {
    let mut exp = 0u32;
    while value.fract() != 0.0 {
        value *= 10.0;
        exp += 1;
        if value >= 1e9 {
            return None;
        }
    }
    (value < 1e9).then_some((value as u64, exp))
}

/// The depth `v` reaches from `depth`, refused past the limit by `too_deep`.
fn data_depth(
    v: &Value,
    depth: usize,
    too_deep: &dyn Fn(usize) -> Option<StructuredError>,
) -> Result<usize, StructuredError> {
    if let Some(e) = too_deep(depth) {
        return Err(e);
    }
    let children: Box<dyn Iterator<Item = &Value>> = match v {
        Value::Array(items) => Box::new(items.iter()),
        Value::Object(map) => Box::new(map.values()),
        _ => return Ok(depth),
    };
    let mut deepest = depth;
    for child in children {
        deepest = deepest.max(data_depth(child, depth + 1, too_deep)?);
    }
    Ok(deepest)
}

/// Checks a Lark grammar (see the module docs).
pub fn check_lark(grammar: &str, what: &str) -> Result<(), StructuredError> {
    let mut scan = LarkScan::default();
    let bytes = grammar.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        i = scan.step(grammar, i, what)?;
    }
    check_rule_chain(&scan.rules, what)
}

/// What the Lark scan gathers: each rule's name and the names its body uses.
#[derive(Default)]
struct LarkScan {
    line: usize,
    rules: Vec<(String, Vec<String>)>,
    at_line_start: bool,
}

impl LarkScan {
    /// Scans from `i`: one token (a string, a regex, a comment, `%json {...}`, a name);
    /// returns where the next one starts.
    fn step(&mut self, g: &str, i: usize, what: &str) -> Result<usize, StructuredError> {
        let b = g.as_bytes();
        let c = b[i];
        match c {
            b'\n' => {
                self.line += 1;
                self.at_line_start = true;
                return Ok(i + 1);
            }
            b'"' | b'/' if !(c == b'/' && b.get(i + 1) == Some(&b'/')) => {
                return Ok(skip_quoted(b, i));
            }
            b'/' => return Ok(g[i..].find('\n').map_or(b.len(), |n| i + n)),
            b'%' if g[i..].starts_with("%json") => {
                let start = i + "%json".len();
                let mut values =
                    serde_json::Deserializer::from_str(&g[start..]).into_iter::<Value>();
                let schema = match values.next() {
                    Some(Ok(v)) => v,
                    Some(Err(e)) => {
                        return Err(StructuredError::invalid_from(
                            format!("{what} (grammar line {})", self.line + 1),
                            "the %json schema is not JSON",
                            e,
                        ));
                    }
                    None => return Ok(start),
                };
                let end = start + values.byte_offset();
                let at = format!("{what} (%json at grammar line {})", self.line + 1);
                self.line += g[i..end].matches('\n').count();
                check_schema(&schema, &at)?;
                return Ok(end);
            }
            c if c == b'_' || c.is_ascii_alphabetic() => {
                let end = i + g[i..]
                    .find(|ch: char| !(ch == '_' || ch.is_ascii_alphanumeric()))
                    .unwrap_or(g.len() - i);
                let name = g[i..end].to_owned();
                let defines = self.at_line_start && g[end..].trim_start().starts_with(':');
                if defines {
                    self.rules.push((name, Vec::new()));
                } else if let Some(rule) = self.rules.last_mut() {
                    rule.1.push(name);
                }
                self.at_line_start = false;
                return Ok(end);
            }
            _ => {}
        }
        if !c.is_ascii_whitespace() {
            self.at_line_start = false;
        }
        Ok(i + 1)
    }
}

/// Where the string or regex literal opening at `i` ends (past its closing quote, escapes
/// skipped; the end of the text when it does not close on its line).
fn skip_quoted(b: &[u8], i: usize) -> usize {
    let quote = b[i];
    let mut j = i + 1;
    while j < b.len() && b[j] != quote && b[j] != b'\n' {
        j += if b[j] == b'\\' { 2 } else { 1 };
    }
    (j + 1).min(b.len())
}

/// The longest chain of rules each naming the next, iteratively (a grammar is hostile input:
/// no recursion here), recursion through a rule already on the chain not counted.
fn check_rule_chain(rules: &[(String, Vec<String>)], what: &str) -> Result<(), StructuredError> {
    let index: HashMap<&str, usize> = (rules.iter().enumerate())
        .map(|(i, r)| (r.0.as_str(), i))
        .collect();
    let uses: Vec<Vec<usize>> = rules
        .iter()
        .map(|r| {
            r.1.iter()
                .filter_map(|n| index.get(n.as_str()).copied())
                .collect()
        })
        .collect();
    // Longest path by depth-first search with an explicit stack; heights memoized.
    let mut height: Vec<Option<usize>> = vec![None; rules.len()];
    let mut on_stack = vec![false; rules.len()];
    for root in 0..rules.len() {
        let mut stack: Vec<(usize, usize)> = vec![(root, 0)];
        while let Some(&mut (rule, ref mut next)) = stack.last_mut() {
            if height[rule].is_some() {
                stack.pop();
                continue;
            }
            on_stack[rule] = true;
            if let Some(&child) = uses[rule].get(*next) {
                *next += 1;
                if !on_stack[child] && height[child].is_none() {
                    stack.push((child, 0));
                }
                continue;
            }
            let below = uses[rule]
                .iter()
                .filter_map(|&c| height[c])
                .max()
                .map_or(0, |h| h + 1);
            if below > MAX_LARK_RULE_CHAIN {
                return Err(StructuredError::invalid(
                    what,
                    format!(
                        "rule `{}` starts a chain of more than {MAX_LARK_RULE_CHAIN} rules, each naming the next",
                        rules[rule].0
                    ),
                ));
            }
            height[rule] = Some(below);
            on_stack[rule] = false;
            stack.pop();
        }
    }
    Ok(())
}

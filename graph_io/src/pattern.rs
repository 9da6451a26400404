//! Name patterns: literals and `{field}`s, matched against names (the runtime's direction) and
//! rendered into names (the compiler's direction), so one pattern is one rule both ways.

/// A field of a name pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Field {
    Layer,
    Head,
    Phase,
    Ar,
    Context,
    Part,
    Parts,
}

/// The fields of K/V tensor names.
pub(crate) const KV_FIELDS: &[Field] = &[Field::Layer, Field::Head];
/// The fields of graph names.
pub(crate) const GRAPH_FIELDS: &[Field] = &[
    Field::Phase,
    Field::Ar,
    Field::Context,
    Field::Part,
    Field::Parts,
];

impl Field {
    fn parse(s: &str) -> Option<Field> {
        Some(match s {
            "layer" => Field::Layer,
            "head" => Field::Head,
            "phase" => Field::Phase,
            "ar" => Field::Ar,
            "context" => Field::Context,
            "part" => Field::Part,
            "parts" => Field::Parts,
            _ => return None,
        })
    }

    fn accepts(self, c: u8) -> bool {
        match self {
            Field::Phase => c.is_ascii_alphabetic(),
            _ => c.is_ascii_digit(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Field(Field),
}

/// A parsed name pattern: literals and `{field}`s, no two fields adjacent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pattern(Vec<Segment>);

/// Field values: what a match captured, or what a name is rendered from. `{phase}` is a word; the
/// others are numbers (`part` 1-based).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Captures<'a> {
    pub(crate) layer: Option<usize>,
    pub(crate) head: Option<usize>,
    pub(crate) phase: Option<&'a str>,
    pub(crate) ar: Option<usize>,
    pub(crate) context: Option<usize>,
    pub(crate) part: Option<usize>,
    pub(crate) parts: Option<usize>,
}

impl<'a> Captures<'a> {
    /// Where a numeric field's value goes (`None` for `{phase}`).
    fn slot(&mut self, f: Field) -> Option<&mut Option<usize>> {
        Some(match f {
            Field::Layer => &mut self.layer,
            Field::Head => &mut self.head,
            Field::Ar => &mut self.ar,
            Field::Context => &mut self.context,
            Field::Part => &mut self.part,
            Field::Parts => &mut self.parts,
            Field::Phase => return None,
        })
    }

    /// A field's value as text, `None` when it has none.
    fn text(&self, f: Field) -> Option<String> {
        match f {
            Field::Phase => self.phase.map(str::to_string),
            _ => {
                let mut c = *self;
                c.slot(f).and_then(|v| *v).map(|v| v.to_string())
            }
        }
    }
}

/// Longest digit run a numeric field accepts (keeps every capture far below `usize::MAX`).
const MAX_DIGITS: usize = 9;

impl Pattern {
    /// Parses `text`, accepting only the `allowed` fields; the reason for a refusal.
    pub(crate) fn parse(text: &str, allowed: &[Field]) -> Result<Pattern, String> {
        let mut segs = Vec::new();
        let mut rest = text;
        let mut seen = Vec::new();
        while !rest.is_empty() {
            match rest.find('{') {
                Some(0) => {
                    let end = rest.find('}').ok_or("a `{` is not closed")?;
                    let name = &rest[1..end];
                    let field = Field::parse(name)
                        .filter(|f| allowed.contains(f))
                        .ok_or_else(|| format!("`{{{name}}}` is not a field here"))?;
                    if seen.contains(&field) {
                        return Err(format!("`{{{name}}}` appears twice"));
                    }
                    if matches!(segs.last(), Some(Segment::Field(_))) {
                        return Err("two fields must be separated by text".into());
                    }
                    seen.push(field);
                    segs.push(Segment::Field(field));
                    rest = &rest[end + 1..];
                }
                found => {
                    let end = found.unwrap_or(rest.len());
                    if rest[..end].contains('}') {
                        return Err("a `}` has no `{`".into());
                    }
                    segs.push(Segment::Literal(rest[..end].to_string()));
                    rest = &rest[end..];
                }
            }
        }
        if segs.is_empty() {
            return Err("the pattern is empty".into());
        }
        Ok(Pattern(segs))
    }

    /// The values `name` gives the fields, `None` when it does not match.
    pub(crate) fn matches(&self, name: &str) -> Option<Captures<'static>> {
        let mut c = Captures::default();
        match_from(&self.0, name.as_bytes(), &mut c).then_some(c)
    }

    /// True when the pattern has field `f`.
    pub(crate) fn has(&self, f: Field) -> bool {
        self.0.contains(&Segment::Field(f))
    }

    /// The name with every field replaced by its value; `None` when a field has no value.
    pub(crate) fn render(&self, values: &Captures<'_>) -> Option<String> {
        self.0.iter().try_fold(String::new(), |mut out, s| {
            match s {
                Segment::Literal(l) => out.push_str(l),
                Segment::Field(f) => out.push_str(&values.text(*f)?),
            }
            Some(out)
        })
    }
}

/// Backtracking match of `segs` against all of `s`.
fn match_from(segs: &[Segment], s: &[u8], c: &mut Captures<'static>) -> bool {
    let Some((first, rest)) = segs.split_first() else {
        return s.is_empty();
    };
    match first {
        Segment::Literal(lit) => {
            s.starts_with(lit.as_bytes()) && match_from(rest, &s[lit.len()..], c)
        }
        Segment::Field(f) => {
            let run = s.iter().take_while(|&&b| f.accepts(b)).count();
            let limit = if *f == Field::Phase {
                run
            } else {
                run.min(MAX_DIGITS)
            };
            (1..=limit).rev().any(|len| {
                let saved = *c;
                if let Some(slot) = c.slot(*f) {
                    let value = std::str::from_utf8(&s[..len])
                        .ok()
                        .and_then(|t| t.parse::<usize>().ok());
                    let Some(v) = value else { return false };
                    *slot = Some(v);
                }
                if match_from(rest, &s[len..], c) {
                    return true;
                }
                *c = saved;
                false
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rendered_name_matches_back_to_its_values() {
        let p =
            Pattern::parse("{phase}_ar{ar}_cl{context}_{part}_of_{parts}", GRAPH_FIELDS).unwrap();
        let v = Captures {
            phase: Some("token"),
            ar: Some(1),
            context: Some(4096),
            part: Some(2),
            parts: Some(3),
            ..Captures::default()
        };
        let name = p.render(&v).unwrap();
        assert_eq!(name, "token_ar1_cl4096_2_of_3");
        let back = p.matches(&name).unwrap();
        assert_eq!(
            (back.ar, back.part, back.parts),
            (Some(1), Some(2), Some(3))
        );
        // A field without a value renders nothing.
        assert_eq!(p.render(&Captures::default()), None);
    }
}

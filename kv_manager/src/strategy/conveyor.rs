//! `conveyor`: every buffer's tokens stay where they were written (token t of buffer b at row
//! `base[b] + t`) and every window slides right together, so a step never copies. See the crate
//! docs for the invariant (consecutive buffers' spans tile without overlap) and the sizes of
//! sliding buffers.

use super::{Cx, Layout, Predicted, RowRef, Rule, require_in_place, require_window_layout};
use crate::predict::{Copies, Segment};
use crate::{Geometry, KvError, Plan, Size};

/// The `conveyor` rule: no state but the layout (rows never move).
#[derive(Debug, Clone)]
pub(crate) struct Conveyor {
    layout: Layout,
}

impl Conveyor {
    pub(crate) fn new(g: &Geometry) -> Result<Conveyor, KvError> {
        require_window_layout(g, "conveyor")?;
        require_in_place(g, "conveyor")?;
        let w_max = g.max_window();
        // Token t of buffer b lives at row base[b] + t. The gap before buffer b is what b's past
        // window and kept rows need above the previous buffer's last possible output.
        let first = g.kept_rows(0).map_or(w_max, |_| g.past_rows(0, g.min_ar()));
        let gaps = (1..g.buffers()).map(|buf| {
            let layer = g.buffer_coords(buf).0;
            // A sliding layer keeping nearly every row takes the global gap, which already keeps
            // them all.
            g.kept_rows(layer)
                .map_or(g.context, |k| (k + g.max_ar()).min(g.context))
        });
        let mut base = Vec::with_capacity(g.buffers());
        let mut at = Size::new("region rows", first);
        base.push(first);
        for gap in gaps {
            at = at.plus(gap);
            base.push(at.get()?);
        }
        let region_rows = at.plus(g.capacity()).get()?;
        let rows = base.windows(2).map(|p| p[1] - p[0]).chain([g.capacity()]);
        let layout = Layout {
            region_rows,
            rows: rows.collect(),
            base,
            out_base: 0,
        };
        Ok(Conveyor { layout })
    }
}

impl Rule for Conveyor {
    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn handle_groups(&self, g: &Geometry) -> (usize, usize) {
        (1, g.context)
    }

    fn anchored_at_end(&self) -> bool {
        false
    }

    fn bind(&mut self, cx: &mut Cx<'_>, ar: usize, variant: usize) -> usize {
        let (g, rb, len) = (cx.g, cx.g.row_bytes(), cx.len);
        let plan = &mut *cx.plan;
        for (layer, bases) in self.layout.base.chunks_exact(2 * g.kv_heads).enumerate() {
            let past = g.past_rows(layer, ar);
            for &base in bases {
                let row = base + len;
                plan.past_offsets.push((row - past) * rb);
                plan.new_offsets.push(row * rb);
            }
        }
        if cx.handles.mark(0, len, variant) {
            2 * g.buffers()
        } else {
            0
        }
    }

    fn commit(&mut self, _cx: &mut Cx<'_>, _ar: usize, _accepted: usize) {}

    fn rollback(&mut self, _cx: &mut Cx<'_>, _len: usize) {}

    fn token_row(
        &self,
        g: &Geometry,
        _plan: &Plan,
        _len: usize,
        buffer: usize,
        token: usize,
    ) -> RowRef {
        RowRef {
            start: (self.layout.base[buffer] + token) * g.row_bytes(),
            step: g.dtype.size_bytes(),
        }
    }

    /// No copies, no rebases; every step binds a new offset: handles = 2B x steps.
    fn predict(
        &self,
        g: &Geometry,
        segments: &[Segment],
        _copies: &mut Copies,
    ) -> Result<Predicted, KvError> {
        let steps: usize = segments.iter().map(|s| s.count).sum();
        let handles = Size::new("memory handles", 2 * g.buffers()).times(steps);
        Ok((0, handles, steps))
    }
}

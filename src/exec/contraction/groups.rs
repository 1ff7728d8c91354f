//! The sums of a contraction's output groups. A group is a pair of numbers,
//! the probe row's group and the build row's group; each has one sum per
//! aggregate, and whether a non-NULL product reached it.
//!
//! The groups of one probe group lie side by side (`probe · width + build`,
//! `width` the number of build groups), so a probe row adds its products to
//! consecutive sums, like a row of a dense product — while the places laid
//! out stay within a few times the groups met (a matrix product: all of
//! them). Where the pairs met are sparse in that grid, a hash table gives
//! each pair its place instead.

use datafusion::arrow::array::{Float64Array, UInt32Array};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::common::HashMap;

/// The places the side-by-side layout may lay out beyond four per group
/// met, before the groups move to a hash table.
// pub for the tests in tests/unit/exec_contraction_groups.rs
#[doc(hidden)]
pub const DENSE_SLACK: usize = 1 << 20;

/// The groups met so far; see the [module docs](self).
#[derive(Debug)]
pub struct Groups {
    aggregates: usize,
    layout: Layout,
    /// `aggregates` sums per place.
    sums: Vec<f64>,
    /// Whether a non-NULL product reached each sum.
    seen: Vec<bool>,
}

#[derive(Debug)]
enum Layout {
    /// Place `probe · width + build`; `present[place]`: a joined row
    /// reached the group; `met` groups are present.
    Dense {
        width: usize,
        present: Vec<bool>,
        met: usize,
    },
    /// Each pair's place, and the pair of each place.
    Hashed {
        places: HashMap<u64, u32>,
        pairs: Vec<(u32, u32)>,
    },
}

/// The groups emitted: their probe and build group numbers and sums.
pub struct Emitted {
    /// The probe group of each group.
    pub probe: UInt32Array,
    /// The build group of each group.
    pub build: UInt32Array,
    /// Per aggregate, the sum of each group (NULL where no non-NULL product came).
    pub sums: Vec<Float64Array>,
}

impl Groups {
    /// No groups yet, of pairs whose build numbers are below `width`, with
    /// `aggregates` sums each.
    pub fn new(width: usize, aggregates: usize) -> Self {
        Self {
            aggregates,
            layout: Layout::Dense {
                width: width.max(1),
                present: Vec::new(),
                met: 0,
            },
            sums: Vec::new(),
            seen: Vec::new(),
        }
    }

    /// The bytes held, roughly (for the memory pool).
    pub fn size(&self) -> usize {
        let layout = match &self.layout {
            Layout::Dense { present, .. } => present.capacity(),
            Layout::Hashed { places, pairs } => places.capacity() * 16 + pairs.capacity() * 8,
        };
        layout + self.sums.capacity() * 8 + self.seen.capacity()
    }

    /// Whether no group has been met.
    pub fn is_empty(&self) -> bool {
        match &self.layout {
            Layout::Dense { met, .. } => *met == 0,
            Layout::Hashed { pairs, .. } => pairs.is_empty(),
        }
    }

    /// The place of the group `(probe, build)`, made if it is new; its
    /// sums are at `place · aggregates ..`.
    #[inline]
    pub fn place(&mut self, probe: u32, build: u32) -> usize {
        if let Some(place) = self.dense_place(probe, build) {
            return place;
        }
        let Layout::Hashed { places, pairs } = &mut self.layout else {
            unreachable!("the groups are hashed where they are not side by side")
        };
        let key = (probe as u64) << 32 | build as u64;
        let next = pairs.len() as u32;
        let place = *places.entry(key).or_insert(next);
        if place == next {
            pairs.push((probe, build));
            self.sums.resize(pairs.len() * self.aggregates, 0.0);
            self.seen.resize(pairs.len() * self.aggregates, false);
        }
        place as usize
    }

    /// The sums of every group of `probe` (one per build group, in their
    /// order, `aggregates` each), made if they are new, each now reached
    /// by a non-NULL product; `None` where the groups are (or now go) in
    /// the hash table.
    #[inline]
    pub fn row(&mut self, probe: u32) -> Option<&mut [f64]> {
        let (start, end) = self.row_places(probe)?;
        let Layout::Dense { present, met, .. } = &mut self.layout else {
            unreachable!("rows are laid out side by side")
        };
        for p in &mut present[start..end] {
            if !*p {
                *p = true;
                *met += 1;
            }
        }
        let (start, end) = (start * self.aggregates, end * self.aggregates);
        self.seen[start..end].fill(true);
        Some(&mut self.sums[start..end])
    }

    /// Every sum laid out side by side (`probe · width + build`, one
    /// aggregate), `None` where the groups are in the hash table or there
    /// are several aggregates.
    pub fn dense_sums(&mut self) -> Option<&mut [f64]> {
        match (&self.layout, self.aggregates) {
            (Layout::Dense { .. }, 1) => Some(&mut self.sums),
            _ => None,
        }
    }

    /// The place of `(probe, build)` side by side, `None` where the groups
    /// are (or now go) in the hash table.
    #[inline]
    fn dense_place(&mut self, probe: u32, build: u32) -> Option<usize> {
        let (start, _) = self.row_places(probe)?;
        let Layout::Dense { present, met, .. } = &mut self.layout else {
            unreachable!("rows are laid out side by side")
        };
        let place = start + build as usize;
        if !present[place] {
            present[place] = true;
            *met += 1;
        }
        Some(place)
    }

    /// The places of `probe`'s groups side by side, laid out if they are
    /// not yet; `None` where the groups are in the hash table, or now go
    /// there (laying them out would pass the slack).
    #[inline]
    fn row_places(&mut self, probe: u32) -> Option<(usize, usize)> {
        let Layout::Dense {
            width,
            present,
            met,
        } = &mut self.layout
        else {
            return None;
        };
        let (start, end) = (probe as usize * *width, (probe as usize + 1) * *width);
        if end > present.len() {
            if end > 4 * *met + DENSE_SLACK {
                self.hash();
                return None;
            }
            present.resize(end, false);
            self.sums.resize(end * self.aggregates, 0.0);
            self.seen.resize(end * self.aggregates, false);
        }
        Some((start, end))
    }

    /// The groups met moved to a hash table, their sums with them.
    fn hash(&mut self) {
        let Layout::Dense { width, present, .. } = &self.layout else {
            return;
        };
        let (width, m) = (*width, self.aggregates);
        let mut places = HashMap::default();
        let mut pairs = Vec::new();
        let (mut sums, mut seen) = (Vec::new(), Vec::new());
        for place in (0..present.len()).filter(|&p| present[p]) {
            let pair = ((place / width) as u32, (place % width) as u32);
            places.insert((pair.0 as u64) << 32 | pair.1 as u64, pairs.len() as u32);
            pairs.push(pair);
            sums.extend_from_slice(&self.sums[place * m..(place + 1) * m]);
            seen.extend_from_slice(&self.seen[place * m..(place + 1) * m]);
        }
        self.layout = Layout::Hashed { places, pairs };
        self.sums = sums;
        self.seen = seen;
    }

    /// Adds `product` (not NULL) to the sum of aggregate `aggregate` at
    /// `place`.
    #[inline]
    pub fn add(&mut self, place: usize, aggregate: usize, product: f64) {
        let at = place * self.aggregates + aggregate;
        self.sums[at] += product;
        self.seen[at] = true;
    }

    /// Every group met, in the order of their places, and no groups left.
    pub fn take(&mut self) -> Emitted {
        let m = self.aggregates;
        // The places of the groups met; `None`: every place laid out
        // (a dense product's sums), in order.
        let (probe, build, places): (Vec<u32>, Vec<u32>, Option<Vec<usize>>) =
            match &mut self.layout {
                Layout::Dense {
                    width,
                    present,
                    met,
                } if *met == present.len() => {
                    let (width, rows) = (*width, present.len() / *width);
                    present.clear();
                    *met = 0;
                    let probe = (0..rows as u32)
                        .flat_map(|g| std::iter::repeat_n(g, width))
                        .collect();
                    let build = (0..rows).flat_map(|_| 0..width as u32).collect();
                    (probe, build, None)
                }
                Layout::Dense {
                    width,
                    present,
                    met,
                } => {
                    let width = *width;
                    let places: Vec<usize> = (0..present.len()).filter(|&p| present[p]).collect();
                    present.clear();
                    *met = 0;
                    (
                        places.iter().map(|&p| (p / width) as u32).collect(),
                        places.iter().map(|&p| (p % width) as u32).collect(),
                        Some(places),
                    )
                }
                Layout::Hashed { places, pairs } => {
                    places.clear();
                    let taken = std::mem::take(pairs);
                    (
                        taken.iter().map(|p| p.0).collect(),
                        taken.iter().map(|p| p.1).collect(),
                        None,
                    )
                }
            };
        let sums = match places {
            // Every place a group, in order: the sums as they lie.
            None if m == 1 => {
                let valid =
                    (!self.seen.iter().all(|&s| s)).then(|| NullBuffer::from(&self.seen[..]));
                vec![Float64Array::new(
                    std::mem::take(&mut self.sums).into(),
                    valid,
                )]
            }
            None => (0..m)
                .map(|a| {
                    let values: Vec<f64> = self.sums.iter().skip(a).step_by(m).copied().collect();
                    let seen = self.seen.iter().skip(a).step_by(m);
                    Float64Array::new(values.into(), Some(NullBuffer::from_iter(seen.copied())))
                })
                .collect(),
            Some(places) => (0..m)
                .map(|a| {
                    let at = |p: usize| p * m + a;
                    let values: Vec<f64> = places.iter().map(|&p| self.sums[at(p)]).collect();
                    let valid = NullBuffer::from_iter(places.iter().map(|&p| self.seen[at(p)]));
                    Float64Array::new(values.into(), Some(valid))
                })
                .collect(),
        };
        self.sums.clear();
        self.seen.clear();
        Emitted {
            probe: probe.into(),
            build: build.into(),
            sums,
        }
    }
}

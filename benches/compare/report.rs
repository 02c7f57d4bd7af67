//! Medians, percentiles, markdown tables and the sanity checks each section
//! returns.

use std::fmt::Write as _;

/// The median of `xs` (NaN when empty). Sorts in place.
pub(crate) fn median(xs: &mut [f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

/// The `p`-th percentile (0..=100) of an already sorted slice, nearest rank.
pub(crate) fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Per-round samples of one column, kept beside the baseline's.
#[derive(Debug, Default, Clone)]
pub(crate) struct Samples(pub(crate) Vec<f64>);

impl Samples {
    /// The median of the samples.
    pub(crate) fn median(&self) -> f64 {
        median(&mut self.0.clone())
    }

    /// The median over rounds of `self[r] / base[r]`.
    pub(crate) fn ratio_to(&self, base: &Samples) -> f64 {
        let mut r: Vec<f64> = self.0.iter().zip(&base.0).map(|(a, b)| a / b).collect();
        median(&mut r)
    }

    /// The median over rounds of `self[r] - base[r]`.
    pub(crate) fn minus(&self, base: &Samples) -> f64 {
        let mut r: Vec<f64> = self.0.iter().zip(&base.0).map(|(a, b)| a - b).collect();
        median(&mut r)
    }
}

/// A markdown table printed to stdout.
#[derive(Debug)]
pub(crate) struct Table {
    title: String,
    head: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(crate) fn new(title: impl Into<String>, head: &[&str]) -> Self {
        Table {
            title: title.into(),
            head: head.iter().map(|s| (*s).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub(crate) fn print(&self) {
        let mut width: Vec<usize> = self.head.iter().map(|h| h.len()).collect();
        for row in &self.rows {
            for (w, c) in width.iter_mut().zip(row) {
                *w = (*w).max(c.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let mut s = String::from("|");
            for (i, w) in width.iter().enumerate() {
                let c = cells.get(i).map_or("", String::as_str);
                let pad = w - c.chars().count();
                if i == 0 {
                    let _ = write!(s, " {c}{} |", " ".repeat(pad));
                } else {
                    let _ = write!(s, " {}{c} |", " ".repeat(pad));
                }
            }
            s
        };
        println!("\n### {}\n", self.title);
        println!("{}", line(&self.head));
        let mut sep = String::from("|");
        for (i, w) in width.iter().enumerate() {
            if i == 0 {
                let _ = write!(sep, " {} |", "-".repeat(*w));
            } else {
                let _ = write!(sep, " {}: |", "-".repeat(w - 1));
            }
        }
        println!("{sep}");
        for row in &self.rows {
            println!("{}", line(row));
        }
    }
}

/// Formats with `digits` decimals.
pub(crate) fn f(x: f64, digits: usize) -> String {
    if x.is_nan() {
        "n/a".to_owned()
    } else {
        format!("{x:.digits$}")
    }
}

/// Sanity checks a section makes on counts that do not depend on noise
/// (a retry policy made exactly its attempts, a server saw every request):
/// a failed check means the harness or a column is broken, and the quick
/// mode exits non-zero.
#[derive(Debug, Default)]
pub(crate) struct Checks(Vec<(String, bool)>);

impl Checks {
    pub(crate) fn check(&mut self, what: impl Into<String>, ok: bool) {
        self.0.push((what.into(), ok));
    }

    pub(crate) fn passed(&self) -> usize {
        self.0.iter().filter(|(_, ok)| *ok).count()
    }

    pub(crate) fn failed(&self) -> impl Iterator<Item = &str> {
        self.0.iter().filter(|(_, ok)| !ok).map(|(w, _)| w.as_str())
    }

    pub(crate) fn print(&self) {
        for (what, ok) in &self.0 {
            println!("- check: {what}: {}", if *ok { "ok" } else { "FAILED" });
        }
    }
}

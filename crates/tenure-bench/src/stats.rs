//! Order statistics of a set of samples.

/// The median, the 99th percentile and the extremes of a set of samples.
///
/// Why these: the machine is shared and noisy, so the median is the number to quote; p99 and the
/// maximum are what the goals are about. Percentiles use the nearest-rank definition (the
/// smallest sample with at least p % of the samples at or below it), so with fewer than 100
/// samples p99 is the maximum.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Number of samples.
    pub count: usize,
    /// Smallest sample.
    pub min: f64,
    /// Median (nearest rank: the lower middle sample when the count is even).
    pub p50: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
    /// Largest sample.
    pub max: f64,
}

impl Summary {
    /// The summary of `samples`; `None` when there are none or one is NaN.
    pub fn of(samples: &[f64]) -> Option<Summary> {
        if samples.is_empty() || samples.iter().any(|s| s.is_nan()) {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        Some(Summary {
            count: sorted.len(),
            min: sorted[0],
            p50: nearest_rank(&sorted, 50.0),
            p99: nearest_rank(&sorted, 99.0),
            max: sorted[sorted.len() - 1],
        })
    }
}

/// The nearest-rank percentile of sorted, non-empty samples.
fn nearest_rank(sorted: &[f64], percent: f64) -> f64 {
    let rank = (percent / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let samples: Vec<f64> = (1..=200).rev().map(f64::from).collect();
        let s = Summary::of(&samples).expect("samples");
        assert_eq!((s.count, s.min, s.p50, s.p99, s.max), (200, 1.0, 100.0, 198.0, 200.0));
    }

    #[test]
    fn few_samples_make_p99_the_maximum() {
        let s = Summary::of(&[3.0, 1.0, 2.0, 10.0]).expect("samples");
        assert_eq!((s.p50, s.p99, s.max), (2.0, 10.0, 10.0));
    }

    #[test]
    fn nothing_to_summarise() {
        assert_eq!(Summary::of(&[]), None);
        assert_eq!(Summary::of(&[1.0, f64::NAN]), None);
    }
}

//! The few statistics the side-by-side benchmarks report: a median and its spread, and the
//! mean of paired differences with its 95 % confidence interval (Student's t).

/// The arithmetic mean; NaN when empty.
pub fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.iter().sum::<f64>() / v.len() as f64
}

/// The middle value (the mean of the two middle ones for an even count); NaN when empty.
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The smallest and the largest value; NaNs when empty.
pub fn range(v: &[f64]) -> (f64, f64) {
    let lo = v.iter().copied().fold(f64::NAN, f64::min);
    let hi = v.iter().copied().fold(f64::NAN, f64::max);
    (lo, hi)
}

/// The sample standard deviation; NaN below two values.
pub fn sd(v: &[f64]) -> f64 {
    if v.len() < 2 {
        return f64::NAN;
    }
    let m = mean(v);
    (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
}

/// The two-sided 95 % quantile of Student's t with `df` degrees of freedom (0.975), from the
/// table every statistics book prints; between the table's rows, the row of the smaller
/// `df` (a wider interval, never a narrower one).
pub fn t975(df: usize) -> f64 {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::NAN,
        1..=30 => TABLE[df - 1],
        31..=40 => 2.042,
        41..=60 => 2.021,
        61..=120 => 2.000,
        _ => 1.980,
    }
}

/// The mean of `diffs` (paired differences) and its 95 % confidence interval.
pub fn paired(diffs: &[f64]) -> (f64, f64, f64) {
    let m = mean(diffs);
    let half = t975(diffs.len().saturating_sub(1)) * sd(diffs) / (diffs.len() as f64).sqrt();
    (m, m - half, m + half)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn paired_interval_by_hand() {
        // Mean 2, sd 1 (values 1, 2, 3), n = 3: half-width 4.303 / sqrt(3).
        let (m, lo, hi) = paired(&[1.0, 2.0, 3.0]);
        assert!((m - 2.0).abs() < 1e-12);
        let half = 4.303 / 3f64.sqrt();
        assert!((lo - (2.0 - half)).abs() < 1e-9 && (hi - (2.0 + half)).abs() < 1e-9);
        assert!(paired(&[1.0]).1.is_nan(), "one pair has no interval");
    }

    #[test]
    fn t_between_rows_is_never_narrower() {
        assert_eq!(t975(30), 2.042);
        assert!(t975(31) >= 2.040 && t975(45) >= 2.014 && t975(500) >= 1.965);
        assert!(t975(0).is_nan());
    }

    #[test]
    fn range_and_sd() {
        assert_eq!(range(&[2.0, -1.0, 5.0]), (-1.0, 5.0));
        assert!((sd(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]) - 2.138_089_935).abs() < 1e-6);
    }
}

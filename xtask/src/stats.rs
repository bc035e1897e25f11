//! The few statistics the benchmarks report: a median and its spread, the mean of paired
//! differences with its 95 % confidence interval (Student's t), and a least-squares fit with
//! the intervals of its coefficients and predictions (`bench-fit`).

use anyhow::{ensure, Context, Result};
use nalgebra::{DMatrix, DVector};

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

/// An ordinary least-squares fit `y ≈ X β`.
#[derive(Clone, Debug)]
pub struct Fit {
    /// β, one per column of `X`.
    pub coef: Vec<f64>,
    /// The covariance of β: `s² (XᵀX)⁻¹`.
    cov: DMatrix<f64>,
    /// Residual degrees of freedom: rows − columns.
    pub df: usize,
    /// The residuals' standard deviation `s`.
    pub residual_sd: f64,
    /// The share of `y`'s variance about its mean the fit explains.
    pub r2: f64,
}

impl Fit {
    /// Fits `y` on the rows `x` (each with one value per coefficient; a constant column for
    /// an intercept). Needs more rows than columns and columns that are not collinear.
    pub fn least_squares(x: &[Vec<f64>], y: &[f64]) -> Result<Fit> {
        let (n, k) = (x.len(), x.first().map_or(0, Vec::len));
        ensure!(
            k > 0 && n > k && y.len() == n && x.iter().all(|r| r.len() == k),
            "a fit needs more rows ({n}) than coefficients ({k}), as many values as rows"
        );
        // Each column scaled to its largest magnitude: the columns here differ by orders of
        // magnitude (streams against containers a second), which XᵀX would square.
        let scale: Vec<f64> = (0..k)
            .map(|j| {
                let m = x.iter().map(|r| r[j].abs()).fold(0.0, f64::max);
                if m > 0.0 {
                    m
                } else {
                    1.0
                }
            })
            .collect();
        let xm = DMatrix::from_fn(n, k, |i, j| x[i][j] / scale[j]);
        let yv = DVector::from_column_slice(y);
        let xtx_inv = (xm.transpose() * &xm)
            .try_inverse()
            .context("the fit's columns are collinear: the design does not separate them")?;
        let beta = &xtx_inv * xm.transpose() * &yv;
        let residuals = &yv - &xm * &beta;
        let df = n - k;
        let s2 = residuals.norm_squared() / df as f64;
        let ybar = mean(y);
        let total: f64 = y.iter().map(|v| (v - ybar).powi(2)).sum();
        let unscale = DMatrix::from_fn(k, k, |i, j| if i == j { 1.0 / scale[i] } else { 0.0 });
        Ok(Fit {
            coef: (0..k).map(|j| beta[j] / scale[j]).collect(),
            cov: &unscale * (xtx_inv * s2) * &unscale,
            df,
            residual_sd: s2.sqrt(),
            r2: if total > 0.0 {
                1.0 - residuals.norm_squared() / total
            } else {
                f64::NAN
            },
        })
    }

    /// The fitted value at `x`.
    pub fn fitted(&self, x: &[f64]) -> f64 {
        x.iter().zip(&self.coef).map(|(a, b)| a * b).sum()
    }

    /// How far the model is from the data beyond the runs' own scatter, when the rows
    /// repeat design points (`point[i]` is row `i`'s): the lack-of-fit F statistic (the
    /// misfit of the points' means against the scatter within them) with its degrees of
    /// freedom, and the largest distance of a point's mean from the fit. `None` without
    /// repeats, or without more points than coefficients.
    pub fn lack_of_fit(&self, x: &[Vec<f64>], y: &[f64], point: &[usize]) -> Option<LackOfFit> {
        let n = y.len();
        let mut groups: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
        for (i, p) in point.iter().enumerate().take(n) {
            groups.entry(*p).or_default().push(i);
        }
        let (m, k) = (groups.len(), self.coef.len());
        if m <= k || n <= m {
            return None;
        }
        let (mut pure, mut misfit, mut worst) = (0.0, 0.0, 0.0f64);
        for rows in groups.values() {
            let ys: Vec<f64> = rows.iter().map(|&i| y[i]).collect();
            let mean_y = mean(&ys);
            pure += ys.iter().map(|v| (v - mean_y).powi(2)).sum::<f64>();
            let mean_fit = mean(&rows.iter().map(|&i| self.fitted(&x[i])).collect::<Vec<_>>());
            misfit += rows.len() as f64 * (mean_y - mean_fit).powi(2);
            worst = worst.max((mean_y - mean_fit).abs());
        }
        let (df_misfit, df_pure) = (m - k, n - m);
        Some(LackOfFit {
            f: (misfit / df_misfit as f64) / (pure / df_pure as f64),
            df: (df_misfit, df_pure),
            worst,
        })
    }

    /// Coefficient `j` and its 95 % confidence interval.
    pub fn coefficient(&self, j: usize) -> (f64, f64, f64) {
        let half = t975(self.df) * self.cov[(j, j)].max(0.0).sqrt();
        (self.coef[j], self.coef[j] - half, self.coef[j] + half)
    }

    /// The fitted mean at `x` and its 95 % confidence interval (the model's uncertainty
    /// about the mean, not a single run's scatter, and only as good as the model is far
    /// from the fitted points).
    pub fn predict(&self, x: &[f64]) -> (f64, f64, f64) {
        let xv = DVector::from_column_slice(x);
        let y = self.fitted(x);
        let var = (xv.transpose() * &self.cov * &xv)[(0, 0)];
        let half = t975(self.df) * var.max(0.0).sqrt();
        (y, y - half, y + half)
    }
}

/// [`Fit::lack_of_fit`]'s answer.
#[derive(Clone, Copy, Debug)]
pub struct LackOfFit {
    /// The F statistic: large when the model misses the points by more than their scatter.
    pub f: f64,
    /// Its degrees of freedom: (points − coefficients, rows − points).
    pub df: (usize, usize),
    /// The largest distance of a point's mean from the fit.
    pub worst: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn least_squares_by_hand() -> Result<()> {
        // y = 1 + 2x exactly: no residual, no interval.
        let x: Vec<Vec<f64>> = (0..5).map(|i| vec![1.0, f64::from(i)]).collect();
        let y: Vec<f64> = (0..5).map(|i| 1.0 + 2.0 * f64::from(i)).collect();
        let fit = Fit::least_squares(&x, &y)?;
        assert!((fit.coef[0] - 1.0).abs() < 1e-9 && (fit.coef[1] - 2.0).abs() < 1e-9);
        assert!(fit.residual_sd < 1e-9 && (fit.r2 - 1.0).abs() < 1e-12);
        let (p, lo, hi) = fit.predict(&[1.0, 10.0]);
        assert!((p - 21.0).abs() < 1e-9 && (hi - lo) < 1e-6);
        // x = 0, 1, 2, 3 with y = 0, 1, 1, 3: slope 0.9, intercept −0.1 (the textbook sums:
        // Sxy = 4.5, Sxx = 5), residuals 0.1, 0.2, −0.7, 0.4 → s² = 0.7 / 2, var(slope) =
        // s² / Sxx.
        let x: Vec<Vec<f64>> = (0..4).map(|i| vec![1.0, f64::from(i)]).collect();
        let fit = Fit::least_squares(&x, &[0.0, 1.0, 1.0, 3.0])?;
        assert!((fit.coef[1] - 0.9).abs() < 1e-9 && (fit.coef[0] + 0.1).abs() < 1e-9);
        let (_, lo, hi) = fit.coefficient(1);
        let half = 4.303 * (0.35f64 / 5.0).sqrt();
        assert!((hi - lo - 2.0 * half).abs() < 1e-9);
        // Columns that differ by six orders of magnitude still fit.
        let x: Vec<Vec<f64>> = (0..6)
            .map(|i| vec![1.0, f64::from(i) * 1e6, f64::from(i * i)])
            .collect();
        let y: Vec<f64> = x.iter().map(|r| 3.0 + 2e-6 * r[1] + 0.5 * r[2]).collect();
        let fit = Fit::least_squares(&x, &y)?;
        assert!((fit.coef[1] - 2e-6).abs() < 1e-15 && (fit.coef[2] - 0.5).abs() < 1e-9);
        // A straight line through points on a parabola, each measured twice with ±0.01 of
        // scatter: the line is 3x − 1, its residuals ±1 at every point; misfit 2 · 4 over
        // 2 df against a scatter of 8 · 0.0001 over 4: F = 4 / 0.0002.
        let xs = [0.0, 1.0, 2.0, 3.0];
        let x: Vec<Vec<f64>> = xs
            .iter()
            .flat_map(|&v| [vec![1.0, v], vec![1.0, v]])
            .collect();
        let y: Vec<f64> = xs
            .iter()
            .flat_map(|&v| [v * v + 0.01, v * v - 0.01])
            .collect();
        let point: Vec<usize> = (0..4).flat_map(|p| [p, p]).collect();
        let fit = Fit::least_squares(&x, &y)?;
        let lof = fit.lack_of_fit(&x, &y, &point).context("repeated points")?;
        assert_eq!(lof.df, (2, 4));
        assert!(
            (lof.f - 20_000.0).abs() < 1e-6 && (lof.worst - 1.0).abs() < 1e-9,
            "{lof:?}"
        );
        assert!(fit.lack_of_fit(&x, &y, &[0, 1, 2, 3, 4, 5, 6, 7]).is_none());
        // Collinear columns, and too few rows, are errors.
        let x: Vec<Vec<f64>> = (0..4)
            .map(|i| vec![f64::from(i), 2.0 * f64::from(i)])
            .collect();
        assert!(Fit::least_squares(&x, &[0.0, 1.0, 2.0, 3.0]).is_err());
        assert!(Fit::least_squares(&[vec![1.0, 2.0]], &[1.0]).is_err());
        Ok(())
    }

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

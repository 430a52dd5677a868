//! The plot: prefix-cache hit rate over the run, one line per routing policy.

use std::path::Path;

use plotters::prelude::*;

use crate::fleet::PolicyReport;

/// Writes the hit rate of each window of `window` requests of every report as an SVG at
/// `path`.
pub fn hit_rate(reports: &[PolicyReport], window: usize, path: &Path) -> Result<(), String> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    draw(reports, window, path).map_err(|e| format!("plot {}: {e}", path.display()))
}

fn draw(
    reports: &[PolicyReport],
    window: usize,
    path: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (1000, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let requests = reports
        .iter()
        .map(|r| r.admissions.len())
        .max()
        .unwrap_or(1);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("prefix-cache hit rate per {window} requests"),
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(50)
        .build_cartesian_2d(0usize..requests, 0f64..1f64)?;
    chart
        .configure_mesh()
        .x_desc("requests routed")
        .y_desc("prompt tokens cached")
        .draw()?;
    for (report, color) in reports.iter().zip([&BLUE, &RED, &GREEN]) {
        let points = report
            .hit_rate_series(window)
            .into_iter()
            .enumerate()
            .map(|(index, rate)| ((index + 1) * window, rate));
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(report.policy.name())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

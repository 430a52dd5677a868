//! The pool-occupancy plot: request-owned, cached (evictable and locked) and free pages per
//! step, with retractions marked.

use std::path::Path;

use plotters::prelude::*;

use crate::scheduler::{Occupancy, Stats};

/// Reads one series out of an occupancy sample.
type PagesOf = fn(&Occupancy) -> usize;

/// Writes the occupancy of `stats` as an SVG at `path` for a pool of `pool_pages` pages.
pub fn occupancy(stats: &Stats, pool_pages: usize, path: &Path) -> Result<(), String> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    draw(stats, pool_pages, path).map_err(|e| format!("plot {}: {e}", path.display()))
}

fn draw(stats: &Stats, pool_pages: usize, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (1200, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let steps = stats.occupancy.len().max(1) as u64;
    let mut chart = ChartBuilder::on(&root)
        .caption("kvown pool occupancy (pages)", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(0u64..steps, 0usize..pool_pages)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("pages")
        .draw()?;
    let series: [(&str, RGBColor, PagesOf); 4] = [
        ("request-owned", BLUE, |o| o.request_owned),
        ("cached, evictable", GREEN, |o| o.cached_evictable),
        ("cached, locked", MAGENTA, |o| o.cached_locked),
        ("free", BLACK, |o| o.free),
    ];
    for (label, color, value) in series {
        chart
            .draw_series(LineSeries::new(
                stats
                    .occupancy
                    .iter()
                    .enumerate()
                    .map(|(step, o)| (step as u64 + 1, value(o))),
                &color,
            ))?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color));
    }
    chart
        .draw_series(stats.retraction_steps.iter().map(|&step| {
            PathElement::new([(step, 0), (step, pool_pages / 20)], RED.stroke_width(1))
        }))?
        .label("retraction")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], RED));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

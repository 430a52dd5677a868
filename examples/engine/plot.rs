//! The pool-occupancy plot: request-owned, cached (evictable and locked) and free pages per
//! step, with retractions marked.

use std::path::Path;

use plotters::prelude::*;

use crate::scheduler::{Occupancy, Stats};

/// Reads one series out of an occupancy sample.
type PagesOf = fn(&Occupancy) -> usize;

/// Most points drawn per series, a few per horizontal pixel. A longer run is thinned to the
/// lowest and the highest value of each bucket of steps, so its envelope (peaks included)
/// stays; without this a run of millions of steps (a low `--arrival-rate`) wrote an SVG of
/// hundreds of megabytes.
const MAX_POINTS: usize = 4096;

/// The points `(step, pages)` of `values` (one per step, from step 1), thinned to at most
/// [`MAX_POINTS`].
fn thinned(values: &[usize]) -> Vec<(u64, usize)> {
    if values.len() <= MAX_POINTS {
        return (1..).zip(values.iter().copied()).collect();
    }
    // Up to two points per bucket.
    let bucket = values.len().div_ceil(MAX_POINTS / 2);
    let mut points = Vec::with_capacity(MAX_POINTS);
    for (index, chunk) in values.chunks(bucket).enumerate() {
        let first = index * bucket;
        let low = (0..chunk.len())
            .min_by_key(|&i| chunk[i])
            .expect("chunks are not empty");
        let high = (0..chunk.len())
            .max_by_key(|&i| chunk[i])
            .expect("chunks are not empty");
        let (a, b) = (low.min(high), low.max(high));
        points.push(((first + a) as u64 + 1, chunk[a]));
        if b != a {
            points.push(((first + b) as u64 + 1, chunk[b]));
        }
    }
    points
}

/// The retraction steps to mark: at most one per bucket of steps when there are more steps
/// than [`MAX_POINTS`] (markers closer than that fall on the same pixel).
fn thinned_markers(retraction_steps: &[u64], steps: u64) -> Vec<u64> {
    let bucket = steps.div_ceil(MAX_POINTS as u64).max(1);
    let mut marked: Vec<u64> = Vec::new();
    for &step in retraction_steps {
        if marked
            .last()
            .is_none_or(|&last| last / bucket != step / bucket)
        {
            marked.push(step);
        }
    }
    marked
}

/// Writes the occupancy of `stats` as an SVG at `path` for a pool of `pool_pages` pages.
/// `path`'s directory must exist, unless `create_parent` (the default path, in the workspace's
/// `target`): a path the user gave creates no directories.
pub fn occupancy(
    stats: &Stats,
    pool_pages: usize,
    path: &Path,
    create_parent: bool,
) -> Result<(), String> {
    let not_written =
        |reason: String| format!("the plot {} was not written: {reason}", path.display());
    if let Some(parent) = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    {
        if create_parent {
            std::fs::create_dir_all(parent)
                .map_err(|e| not_written(format!("{}: {e}", parent.display())))?;
        } else if !parent.is_dir() {
            return Err(not_written(format!(
                "its directory {} does not exist; create it or pass another --plot",
                parent.display()
            )));
        }
    }
    draw(stats, pool_pages, path)
        .map_err(|e| not_written(format!("{e}; pass a writable --plot path")))
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
    // A twentieth of the height, but visible in a pool of fewer than 20 pages too.
    let marker = (pool_pages / 20).max(1);
    let series: [(&str, RGBColor, PagesOf); 4] = [
        ("request-owned", BLUE, |o| o.request_owned),
        ("cached, evictable", GREEN, |o| o.cached_evictable),
        ("cached, locked", MAGENTA, |o| o.cached_locked),
        ("free", BLACK, |o| o.free),
    ];
    for (label, color, value) in series {
        let values: Vec<usize> = stats.occupancy.iter().map(value).collect();
        chart
            .draw_series(LineSeries::new(thinned(&values), &color))?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color));
    }
    chart
        .draw_series(
            thinned_markers(&stats.retraction_steps, steps)
                .into_iter()
                .map(|step| PathElement::new([(step, 0), (step, marker)], RED.stroke_width(1))),
        )?
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(step: usize) -> Occupancy {
        let request_owned = step % 97;
        Occupancy {
            request_owned,
            cached_evictable: step % 13,
            cached_locked: 0,
            free: 200 - request_owned - step % 13,
        }
    }

    #[test]
    fn a_run_of_millions_of_steps_plots_a_small_svg_with_its_peaks() {
        let steps = 1_000_000;
        let stats = Stats {
            occupancy: (0..steps).map(sample).collect(),
            retraction_steps: (1..steps as u64).step_by(2).collect(),
            ..Stats::default()
        };
        let path = std::env::temp_dir().join("kvown-engine-plot-long-run.svg");
        occupancy(&stats, 200, &path, false).expect("the plot is written");
        let bytes = std::fs::metadata(&path).expect("the plot exists").len();
        assert!(bytes < 4 << 20, "{bytes} bytes for {steps} steps");
        // The envelope stays: each bucket keeps its lowest and highest value.
        let values: Vec<usize> = stats.occupancy.iter().map(|o| o.request_owned).collect();
        let points = thinned(&values);
        assert!(points.len() <= MAX_POINTS);
        assert_eq!(points.iter().map(|p| p.1).max(), Some(96));
        assert_eq!(points.iter().map(|p| p.1).min(), Some(0));
        assert!(points.windows(2).all(|w| w[0].0 < w[1].0), "steps increase");
    }

    #[test]
    fn a_short_run_is_plotted_step_by_step() {
        let values = [3, 1, 4, 1, 5];
        assert_eq!(thinned(&values), [(1, 3), (2, 1), (3, 4), (4, 1), (5, 5)]);
        assert_eq!(thinned_markers(&[2, 3, 5], 5), [2, 3, 5]);
    }
}

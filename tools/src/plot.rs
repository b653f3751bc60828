//! PNG line charts for rnic-sim, drawn with plotters in-process. Text uses a TrueType font
//! from the system (DejaVu Sans, Debian's fonts-dejavu-core), registered at run time.

use std::path::Path;

use plotters::prelude::*;

/// One line: a name and its points.
pub struct Series {
    /// Legend text.
    pub name: String,
    /// (x, y) points.
    pub points: Vec<(f64, f64)>,
}

/// One panel of a figure.
pub struct Panel {
    /// Title above the panel.
    pub title: String,
    /// X axis label.
    pub x_label: String,
    /// Y axis label.
    pub y_label: String,
    /// Lines.
    pub series: Vec<Series>,
}

const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

fn register_font() -> Result<(), String> {
    static ONCE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        let bytes = FONTS
            .iter()
            .find_map(|p| std::fs::read(p).ok())
            .ok_or_else(|| {
                format!(
                    "no font for the plots (looked for {}): install fonts-dejavu-core",
                    FONTS.join(", ")
                )
            })?;
        let leaked: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, leaked)
            .map_err(|_| "the font could not be loaded".to_string())
    })
    .clone()
}

/// A colour per line, distinguishable for up to a dozen lines and cycling beyond.
fn colour(i: usize) -> RGBColor {
    // matplotlib's "tab10" order, then black and a light orange, as 0xRRGGBB.
    const C: [u32; 12] = [
        0x1f77b4, 0xff7f0e, 0x2ca02c, 0xd62728, 0x9467bd, 0x8c564b, 0xe377c2, 0x7f7f7f, 0xbcbd22,
        0x17becf, 0x000000, 0xffbb78,
    ];
    let c = C[i % C.len()];
    RGBColor((c >> 16) as u8, (c >> 8) as u8, c as u8)
}

/// A tick label: whole numbers without a fraction (2000, not 2000.0), others with as few
/// decimals as their size needs.
pub fn tick(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 * v.abs().max(1.0) {
        format!("{:.0}", v)
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// Draws `panels` stacked vertically into a `width` x (`panel_height` x n) PNG.
pub fn draw(path: &Path, panels: &[Panel], width: u32, panel_height: u32) -> Result<(), String> {
    register_font()?;
    let height = panel_height * panels.len().max(1) as u32;
    let root = BitMapBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let areas = root.split_evenly((panels.len().max(1), 1));
    for (panel, area) in panels.iter().zip(areas.iter()) {
        let xs = panel
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0));
        let ys = panel
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1));
        let (x0, x1) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
        let y1 = ys.fold(0.0f64, f64::max);
        let (x0, x1) = if x0 < x1 { (x0, x1) } else { (0.0, 1.0) };
        let y1 = if y1 > 0.0 { y1 * 1.08 } else { 1.0 };
        // The legend goes beside the plot, never over a line.
        let legend_w = if panel.series.len() > 1 { 130 } else { 0 };
        let (plot_area, legend_area) = area.split_horizontally(width.saturating_sub(legend_w));
        let mut chart = ChartBuilder::on(&plot_area)
            .caption(&panel.title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(x0..x1, 0.0..y1)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc(panel.x_label.as_str())
            .y_desc(panel.y_label.as_str())
            .label_style(("sans-serif", 13))
            .x_label_formatter(&|v| tick(*v))
            .y_label_formatter(&|v| tick(*v))
            .draw()
            .map_err(|e| e.to_string())?;
        for (i, s) in panel.series.iter().enumerate() {
            let c = colour(i);
            chart
                // Width 1: plotters' wide strokes misdraw segments that collapse to one pixel.
                .draw_series(LineSeries::new(s.points.iter().copied(), c.stroke_width(1)))
                .map_err(|e| e.to_string())?;
        }
        if panel.series.len() > 1 {
            for (i, s) in panel.series.iter().enumerate() {
                let y = 40 + 18 * i as i32;
                let c = colour(i);
                legend_area
                    .draw(&PathElement::new(vec![(6, y), (26, y)], c.stroke_width(2)))
                    .map_err(|e| e.to_string())?;
                legend_area
                    .draw(&Text::new(
                        s.name.clone(),
                        (32, y - 7),
                        ("sans-serif", 13).into_font(),
                    ))
                    .map_err(|e| e.to_string())?;
            }
        }
    }
    root.present().map_err(|e| e.to_string())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::tick;

    #[test]
    fn ticks_read_as_numbers_are_written() {
        assert_eq!(tick(2000.0), "2000");
        assert_eq!(tick(0.0), "0");
        assert_eq!(tick(12.5), "12.5");
        assert_eq!(tick(0.25), "0.25");
        assert_eq!(tick(1.0 / 3.0), "0.333");
    }
}

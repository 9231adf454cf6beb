//! `zonal bench --plot DIR`: one SVG per experiment that ran, drawn from the JSON records
//! (the values `--json` writes, the tcmalloc child's included), so a figure and its table
//! always show the same numbers. Each figure shows the median and, as whiskers, the min and
//! max over the repetitions.
//!
//! - single, cross: ns per operation per subject (horizontal bars, a log axis when the
//!   subjects span more than 20×);
//! - parallel, mixed: ns per operation per thread against the thread count, a line per
//!   subject;
//! - bulk: ns per page against N (log axes), a line per subject;
//! - threshold: ns per pair per thread against the threshold, and the change against 125
//!   beside seed 000's;
//! - modes, stats, zlc: bars per setting, grouped by thread count or accounting or cache;
//! - numab: accesses/s and TLB shootdowns per second over time per variant, the medians over
//!   the repetitions of each 100 ms window, the eater's free marked.

use super::CHILD_PROCESS;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Checks before the run that DIR can take the plots: created when missing (its parent must
/// exist), a directory, and writable (a probe file is written and removed).
pub fn prepare(dir: &Path) -> Result<(), String> {
    let shown = dir.display();
    if !dir.is_dir() {
        if dir.exists() {
            return Err(format!("--plot {shown}: not a directory"));
        }
        std::fs::create_dir(dir)
            .map_err(|e| format!("--plot {shown}: cannot create the directory (its parent must exist): {e}"))?;
    }
    let probe = dir.join(format!(".zonal-plot-probe-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(|e| format!("--plot {shown}: cannot write in it: {e}"))?;
    std::fs::remove_file(&probe).map_err(|e| format!("--plot {shown}: cannot remove {}: {e}", probe.display()))
}

/// Writes `DIR/<experiment>.svg` for every experiment with records, in the order they ran;
/// returns the paths written.
pub fn write_all(dir: &Path, records: &[Value]) -> Result<Vec<PathBuf>, String> {
    let recs = parse(records)?;
    let mut experiments: Vec<&str> = Vec::new();
    for r in &recs {
        if !experiments.contains(&r.experiment.as_str()) {
            experiments.push(&r.experiment);
        }
    }
    let mut written = Vec::new();
    for e in experiments {
        let of: Vec<&Rec> = recs.iter().filter(|r| r.experiment == e).collect();
        let svg = render(e, &of).map_err(|err| format!("--plot: drawing {e}: {err}"))?;
        let path = dir.join(format!("{e}.svg"));
        std::fs::write(&path, svg).map_err(|err| format!("--plot: cannot write {}: {err}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

/// The SVG of one experiment's records.
pub fn render(experiment: &str, recs: &[&Rec]) -> Result<String, String> {
    // single's figure is its order-0 table; the larger orders are in the report and records.
    let order0: Vec<&Rec>;
    let recs = if experiment == "single" {
        order0 = recs.iter().copied().filter(|r| r.params["order"].as_u64().unwrap_or(0) == 0).collect();
        &order0[..]
    } else {
        recs
    };
    let (w, h) = size(experiment, recs);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        match experiment {
            "single" => one_bar_each(
                &root,
                recs,
                "single (page_bench01): one thread, order-0 alloc + free pairs",
                "ns per pair",
            )?,
            "cross" => one_bar_each(&root, recs, "cross: allocated on cpu 0, freed on cpu 1", "ns per page")?,
            "parallel" => by_threads(
                &root,
                recs,
                "parallel (page_bench03): T threads each doing order-0 pairs; median, whiskers min–max",
                "ns per pair per thread",
            )?,
            "mixed" => by_threads(
                &root,
                recs,
                "mixed: one zone, each thread freeing half its frames and handing half on; median, whiskers min–max",
                "ns per page per thread",
            )?,
            "bulk" => bulk(&root, recs)?,
            "threshold" => threshold(&root, recs)?,
            "modes" => modes(&root, recs)?,
            "stats" => stats(&root, recs)?,
            "zlc" => zlc(&root, recs)?,
            "numab" => numab(&root, recs)?,
            "scale" => scale(&root, recs)?,
            "tier" => tier(&root, recs)?,
            other => return Err(format!("no plot for experiment `{other}`")),
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

/// One record as the plots read it.
#[derive(Clone, Debug)]
pub struct Rec {
    pub experiment: String,
    /// The subject, marked when it is the tcmalloc child's and the main process has a
    /// subject of the same name (its mimalloc).
    pub label: String,
    pub params: Value,
    /// Median, min, max ns per operation; `None` when the figure could not be measured
    /// (written as null).
    pub ns: Option<Sum>,
    pub ratio: Option<f64>,
}

/// Median, min and max.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sum {
    pub med: f64,
    pub min: f64,
    pub max: f64,
}

impl Sum {
    fn of(v: &Value) -> Option<Sum> {
        let (med, min, max) = (v["median"].as_f64()?, v["min"].as_f64()?, v["max"].as_f64()?);
        [med, min, max].iter().all(|x| x.is_finite()).then_some(Sum { med, min, max })
    }
}

/// Reads the records; the tcmalloc child's subjects that the main process also has are
/// marked `(tcmalloc child)`.
pub fn parse(records: &[Value]) -> Result<Vec<Rec>, String> {
    let mut out = Vec::new();
    for v in records {
        let field = |k: &str| v[k].as_str().ok_or_else(|| format!("--plot: a record without `{k}`: {v}"));
        let (experiment, subject) = (field("experiment")?, field("subject")?);
        let child = v["process"] == CHILD_PROCESS;
        let clash = child
            && records
                .iter()
                .any(|o| o["process"] != CHILD_PROCESS && o["experiment"] == experiment && o["subject"] == subject);
        out.push(Rec {
            experiment: experiment.into(),
            label: if clash { format!("{subject}{CHILD_MARK}") } else { subject.into() },
            params: v["params"].clone(),
            ns: Sum::of(&v["ns_per_op"]),
            ratio: v["ratio_to_reference"].as_f64(),
        });
    }
    Ok(out)
}

/// What marks a subject of the tcmalloc child that the main process has too.
const CHILD_MARK: &str = " (tcmalloc child)";

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// Ten colours that stay apart (Tableau's).
const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Four more, for the tables with more subjects.
const MORE_COLORS: [RGBColor; 4] =
    [RGBColor(0, 0, 0), RGBColor(255, 187, 120), RGBColor(152, 223, 138), RGBColor(197, 176, 213)];

fn color(i: usize) -> RGBColor {
    if i >= COLORS.len() && i < COLORS.len() + MORE_COLORS.len() {
        return MORE_COLORS[i - COLORS.len()];
    }
    COLORS[i % COLORS.len()]
}

const FONT: &str = "sans-serif";

/// Width and height of an experiment's figure.
fn size(experiment: &str, recs: &[&Rec]) -> (u32, u32) {
    let bars = |rows: usize| (140 + rows as u32 * 22).clamp(300, 1400);
    match experiment {
        "single" | "cross" => (960, bars(recs.len())),
        "zlc" => (960, bars(recs.len())),
        "modes" => (960, bars(recs.len()).max(360)),
        "stats" => (960, 2 * bars(recs.len() / 2).max(300)),
        "threshold" => (960, 840),
        "numab" | "tier" => (1000, 760),
        _ => (960, 560),
    }
}

/// Distinct values in first-seen order.
fn distinct<T: PartialEq + Clone>(it: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut out = Vec::new();
    for x in it {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out
}

/// A tick label: a number with the precision it needs.
fn fmt_num(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 100.0 || (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The range of a value axis over `values` (and 0 for a linear one), with some room.
fn value_range(values: impl IntoIterator<Item = f64>, log: bool) -> (f64, f64) {
    let v: Vec<f64> = values.into_iter().filter(|x| x.is_finite() && (!log || *x > 0.0)).collect();
    let (lo, hi) = v.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
    if v.is_empty() {
        return if log { (1.0, 10.0) } else { (0.0, 1.0) };
    }
    if log {
        let (lo, hi) = (lo / 1.5, hi * 1.5);
        (lo, if hi > lo { hi } else { lo * 10.0 })
    } else {
        let lo = lo.min(0.0);
        let hi = hi.max(0.0);
        let pad = (hi - lo).max(hi.abs() * 0.1).max(1e-9) * 0.08;
        (if lo < 0.0 { lo - pad } else { lo }, hi + pad)
    }
}

/// Whether values spread enough that a log axis reads better.
fn wants_log(values: impl IntoIterator<Item = f64>) -> bool {
    let (lo, hi) = value_range(values, true);
    hi / lo > 20.0 * 2.25
}

/// A line per series over a numeric (or categorical) x axis.
struct Lines<'a> {
    title: String,
    x_desc: &'a str,
    y_desc: &'a str,
    series: Vec<(String, Vec<(f64, Sum)>)>,
    /// Labels of x = 0, 1, ...: a categorical axis.
    x_names: Option<Vec<String>>,
    /// Vertical lines: (x, label).
    markers: Vec<(f64, String)>,
    /// Dashed series: those whose names end so.
    dashed_suffix: Option<&'a str>,
}

/// How a legend entry shows its series.
#[derive(Clone, Copy, PartialEq)]
enum Mark {
    Line,
    Dashed,
    Bar,
}

/// The area right of a chart that holds its legend, wide enough for the longest name; the
/// chart keeps the rest. No legend area when there is nothing to tell apart.
fn split_legend<'a>(area: &Area<'a>, names: &[String]) -> (Area<'a>, Option<Area<'a>>) {
    if names.is_empty() {
        return (area.clone(), None);
    }
    let widest = names.iter().map(|n| n.chars().count()).max().unwrap_or(0) as u32;
    let w = area.dim_in_pixel().0;
    let lw = (widest * 7 + 44).clamp(120, w / 3);
    let (chart, legend) = area.split_horizontally(w - lw);
    (chart, Some(legend))
}

/// A legend: a sample of each series' mark and colour, and its name.
fn draw_legend(area: &Area, entries: &[(String, RGBColor, Mark)]) -> Result<(), String> {
    let err = |e: DrawingAreaErrorKind<_>| e.to_string();
    for (i, (name, c, mark)) in entries.iter().enumerate() {
        let y = 52 + i as i32 * 20;
        match mark {
            Mark::Bar => area.draw(&Rectangle::new([(6, y - 5), (20, y + 5)], c.mix(0.85).filled())),
            Mark::Dashed => area
                .draw(&PathElement::new(vec![(2, y), (9, y)], c.stroke_width(2)))
                .and_then(|()| area.draw(&PathElement::new(vec![(14, y), (21, y)], c.stroke_width(2)))),
            Mark::Line => area.draw(&PathElement::new(vec![(2, y), (21, y)], c.stroke_width(2))),
        }
        .map_err(err)?;
        area.draw(&Text::new(name.clone(), (28, y - 7), (FONT, 13))).map_err(err)?;
    }
    Ok(())
}

/// Draws `spec` on axes built from `x` and `y`.
fn draw_lines<X, Y>(area: &Area, spec: &Lines, x: X, y: Y) -> Result<(), String>
where
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let err = |e: DrawingAreaErrorKind<_>| e.to_string();
    let names: Vec<String> = spec.series.iter().map(|(n, _)| n.clone()).collect();
    let (area, legend) = split_legend(area, &names);
    let mut chart = ChartBuilder::on(&area)
        .caption(&spec.title, (FONT, 17))
        .margin(14)
        .x_label_area_size(46)
        .y_label_area_size(64)
        .build_cartesian_2d(x, y)
        .map_err(err)?;
    let names = spec.x_names.clone();
    let fmt_x = move |v: &f64| match &names {
        Some(n) => {
            let i = v.round();
            if (v - i).abs() < 1e-6 && i >= 0.0 {
                n.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        }
        None => fmt_num(*v),
    };
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(spec.x_desc).y_desc(spec.y_desc).x_label_formatter(&fmt_x).y_label_formatter(&|v| fmt_num(*v));
    mesh.light_line_style(RGBColor(238, 238, 238)).max_light_lines(4).label_style((FONT, 13));
    if let Some(n) = &spec.x_names {
        mesh.x_labels(n.len());
    }
    mesh.draw().map_err(err)?;
    let (ylo, yhi) = (chart.y_range().start, chart.y_range().end);
    for (x, label) in &spec.markers {
        let gray = RGBColor(120, 120, 120);
        chart
            .draw_series(std::iter::once(PathElement::new(vec![(*x, ylo), (*x, yhi)], gray.stroke_width(1))))
            .map_err(err)?;
        let at = EmptyElement::at((*x, yhi)) + Text::new(label.clone(), (4, 4), (FONT, 12).into_font().color(&gray));
        chart.draw_series(std::iter::once(at)).map_err(err)?;
    }
    let mut entries = Vec::new();
    for (i, (name, points)) in spec.series.iter().enumerate() {
        let c = color(i);
        // The child's series (its own mimalloc) dashed, as the requested flushes of numab.
        let dashed = spec.dashed_suffix.is_some_and(|s| name.ends_with(s)) || name.ends_with(CHILD_MARK);
        let line: Vec<(f64, f64)> = points.iter().map(|(x, s)| (*x, s.med)).collect();
        let style = c.stroke_width(2);
        if dashed {
            chart.draw_series(DashedLineSeries::new(line.clone(), 6, 4, style)).map_err(err)?;
        } else {
            chart.draw_series(LineSeries::new(line.clone(), style)).map_err(err)?;
        }
        chart.draw_series(line.iter().map(|&p| Circle::new(p, 3, c.filled()))).map_err(err)?;
        let whiskers = points
            .iter()
            .filter(|(_, s)| s.max > s.min)
            .map(|(x, s)| PathElement::new(vec![(*x, s.min), (*x, s.max)], c.stroke_width(1)));
        chart.draw_series(whiskers).map_err(err)?;
        entries.push((name.clone(), c, if dashed { Mark::Dashed } else { Mark::Line }));
    }
    if let Some(l) = legend {
        draw_legend(&l, &entries)?;
    }
    Ok(())
}

/// Draws `spec` with linear or log axes, the x axis at the given key points if any.
fn lines(area: &Area, spec: &Lines, log_x: bool, log_y: bool, x_keys: Option<Vec<f64>>) -> Result<(), String> {
    let xs = spec.series.iter().flat_map(|(_, p)| p.iter().map(|(x, _)| *x));
    let ys = spec.series.iter().flat_map(|(_, p)| p.iter().flat_map(|(_, s)| [s.min, s.max]));
    let (y0, y1) = value_range(ys, log_y);
    let (x0, x1) = match &spec.x_names {
        Some(n) => (-0.5, n.len() as f64 - 0.5),
        None => {
            let v: Vec<f64> = xs.chain(spec.markers.iter().map(|m| m.0)).collect();
            let (lo, hi) = v.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
            if !lo.is_finite() {
                (0.0, 1.0)
            } else if log_x {
                (lo / 1.3, hi * 1.3)
            } else {
                let pad = ((hi - lo) * 0.03).max(hi.abs() * 1e-3).max(1e-9);
                // Times and counts start at 0 rather than below it.
                (if lo >= 0.0 { (lo - pad).max(0.0) } else { lo - pad }, hi + pad)
            }
        }
    };
    // Each series shifted a little sideways, so that whiskers at one x stay apart.
    let k = spec.series.len() as f64;
    let shift = |i: usize, x: f64| {
        let d = i as f64 - (k - 1.0) / 2.0;
        if log_x {
            x * 10f64.powf(0.004 * d)
        } else {
            x + (x1 - x0) * 0.002 * d
        }
    };
    let dodged = Lines {
        series: spec
            .series
            .iter()
            .enumerate()
            .map(|(i, (n, p))| (n.clone(), p.iter().map(|&(x, s)| (shift(i, x), s)).collect()))
            .collect(),
        title: spec.title.clone(),
        x_names: spec.x_names.clone(),
        markers: spec.markers.clone(),
        ..*spec
    };
    let spec = &dodged;
    // Key points only on a log axis (plotters formats a linear one's only at its own ticks).
    match (log_x.then_some(x_keys).flatten(), log_x, log_y) {
        (Some(k), _, true) => draw_lines(area, spec, (x0..x1).log_scale().with_key_points(k), (y0..y1).log_scale()),
        (Some(k), _, false) => draw_lines(area, spec, (x0..x1).log_scale().with_key_points(k), y0..y1),
        (None, true, true) => draw_lines(area, spec, (x0..x1).log_scale(), (y0..y1).log_scale()),
        (None, true, false) => draw_lines(area, spec, (x0..x1).log_scale(), y0..y1),
        (None, false, true) => draw_lines(area, spec, x0..x1, (y0..y1).log_scale()),
        (None, false, false) => draw_lines(area, spec, x0..x1, y0..y1),
    }
}

/// Horizontal bars: a row per setting or subject, a bar per group in each row.
struct Bars<'a> {
    title: String,
    x_desc: &'a str,
    rows: Vec<String>,
    groups: Vec<String>,
    /// `vals[row][group]`.
    vals: Vec<Vec<Option<Sum>>>,
}

fn draw_bars<X>(area: &Area, spec: &Bars, x: X, base: f64) -> Result<(), String>
where
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
{
    let err = |e: DrawingAreaErrorKind<_>| e.to_string();
    let n = spec.rows.len();
    let widest = spec.rows.iter().map(|r| r.chars().count()).max().unwrap_or(0) as u32;
    let (area, legend) = split_legend(area, if spec.groups.len() > 1 { &spec.groups } else { &[] });
    let mut chart = ChartBuilder::on(&area)
        .caption(&spec.title, (FONT, 17))
        .margin(14)
        .x_label_area_size(46)
        .y_label_area_size((widest * 7 + 16).clamp(60, 340))
        .build_cartesian_2d(x, -0.5..n as f64 - 0.5)
        .map_err(err)?;
    // Row i at y = n - 1 - i, so the first row is at the top.
    let rows = spec.rows.clone();
    let fmt_y = move |v: &f64| {
        let i = v.round();
        if (v - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < rows.len() {
            rows[rows.len() - 1 - i as usize].clone()
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .x_desc(spec.x_desc)
        .y_labels(n)
        .y_label_formatter(&fmt_y)
        .x_label_formatter(&|v| fmt_num(*v))
        .disable_y_mesh()
        .light_line_style(RGBColor(238, 238, 238))
        .max_light_lines(4)
        .label_style((FONT, 13))
        .draw()
        .map_err(err)?;
    let k = spec.groups.len().max(1);
    let thick = 0.8 / k as f64;
    for g in 0..spec.groups.len() {
        let c = color(g);
        let at = |i: usize| (n - 1 - i) as f64 + 0.4 - thick * (g as f64 + 0.5);
        let cells: Vec<(f64, Sum)> = spec
            .vals
            .iter()
            .enumerate()
            .filter_map(|(i, row)| row.get(g).copied().flatten().map(|s| (at(i), s)))
            .collect();
        let bars = cells
            .iter()
            .map(|&(y, s)| Rectangle::new([(base, y - thick * 0.42), (s.med, y + thick * 0.42)], c.mix(0.85).filled()));
        chart.draw_series(bars).map_err(err)?;
        let whiskers = cells
            .iter()
            .filter(|(_, s)| s.max > s.min)
            .map(|&(y, s)| PathElement::new(vec![(s.min, y), (s.max, y)], BLACK.stroke_width(1)));
        chart.draw_series(whiskers).map_err(err)?;
        let texts = cells.iter().map(|&(y, s)| {
            EmptyElement::at((s.max.max(s.med), y))
                + Text::new(fmt_num(s.med), (5, -6), (FONT, 11).into_font().color(&RGBColor(60, 60, 60)))
        });
        chart.draw_series(texts).map_err(err)?;
    }
    if let Some(l) = legend {
        let entries: Vec<_> =
            spec.groups.iter().enumerate().map(|(g, name)| (name.clone(), color(g), Mark::Bar)).collect();
        draw_legend(&l, &entries)?;
    }
    Ok(())
}

/// Draws `spec` on a linear axis from 0, or a log one when the values spread widely.
fn bars(area: &Area, spec: &Bars) -> Result<(), String> {
    let all = || spec.vals.iter().flatten().flatten().flat_map(|s| [s.min, s.max]);
    if wants_log(all()) {
        let (lo, hi) = value_range(all(), true);
        draw_bars(area, spec, (lo..hi * 2.0).log_scale(), lo)
    } else {
        let (lo, hi) = value_range(all(), false);
        draw_bars(area, spec, lo..hi * 1.08, 0.0)
    }
}

/// A bar per record (single, cross).
fn one_bar_each(root: &Area, recs: &[&Rec], title: &str, x_desc: &str) -> Result<(), String> {
    let spec = Bars {
        title: format!("{title}; median, whiskers min–max"),
        x_desc,
        rows: recs.iter().map(|r| r.label.clone()).collect(),
        groups: vec![x_desc.to_string()],
        vals: recs.iter().map(|r| vec![r.ns]).collect(),
    };
    bars(root, &spec)
}

/// Series by subject over a numeric parameter.
fn by_subject(recs: &[&Rec], param: &str) -> Vec<(String, Vec<(f64, Sum)>)> {
    distinct(recs.iter().map(|r| r.label.clone()))
        .into_iter()
        .map(|name| {
            let pts = recs
                .iter()
                .filter(|r| r.label == name)
                .filter_map(|r| Some((r.params[param].as_f64()?, r.ns?)))
                .collect();
            (name, pts)
        })
        .collect()
}

/// `scale`: each column's growth against the CPU count on the most nodes swept (its median
/// over the median at the fewest CPUs), a line per column, beside the CPUs' own growth.
fn scale(root: &Area, recs: &[&Rec]) -> Result<(), String> {
    let nodes = recs.iter().filter_map(|r| r.params["nodes"].as_u64()).max().unwrap_or(1);
    let sweep: Vec<&Rec> = recs
        .iter()
        .copied()
        .filter(|r| {
            r.params["nodes"].as_u64() == Some(nodes) && r.params["cpus"].is_number() && r.label != "metadata target"
        })
        .collect();
    let keys = distinct(sweep.iter().filter_map(|r| r.params["cpus"].as_f64()));
    let mut series: Vec<(String, Vec<(f64, Sum)>)> = by_subject(&sweep, "cpus")
        .into_iter()
        .filter_map(|(name, pts)| {
            let base = pts.iter().min_by(|a, b| a.0.total_cmp(&b.0))?.1.med;
            let scaled = pts
                .iter()
                .map(|&(x, s)| (x, Sum { med: s.med / base, min: s.min / base, max: s.max / base }))
                .collect();
            (base > 0.0).then_some((name, scaled))
        })
        .collect();
    if let Some(&lo) = keys.iter().min_by(|a, b| a.total_cmp(b)) {
        let cpus = keys.iter().map(|&x| (x, Sum { med: x / lo, min: x / lo, max: x / lo })).collect();
        series.push(("the CPUs (linear)".into(), cpus));
    }
    let spec = Lines {
        title: format!("scale: growth against the CPUs, {nodes} nodes; median, whiskers min–max"),
        x_desc: "CPUs (log scale, virtual beyond the machine)",
        y_desc: "× the fewest CPUs' (log scale)",
        series,
        x_names: None,
        markers: Vec::new(),
        dashed_suffix: Some("(linear)"),
    };
    lines(root, &spec, true, true, Some(keys))
}

/// ns per operation per thread against the thread count, a line per subject.
fn by_threads(root: &Area, recs: &[&Rec], title: &str, y_desc: &str) -> Result<(), String> {
    let series = by_subject(recs, "threads");
    let keys = distinct(recs.iter().filter_map(|r| r.params["threads"].as_f64()));
    let spec = Lines {
        title: title.into(),
        x_desc: "threads (log scale)",
        y_desc,
        series,
        x_names: None,
        markers: Vec::new(),
        dashed_suffix: None,
    };
    let log_y = wants_log(spec.series.iter().flat_map(|(_, p)| p.iter().map(|(_, s)| s.med)));
    lines(root, &spec, true, log_y, Some(keys))
}

fn bulk(root: &Area, recs: &[&Rec]) -> Result<(), String> {
    let series = by_subject(recs, "batch");
    let keys = distinct(recs.iter().filter_map(|r| r.params["batch"].as_f64()));
    let spec = Lines {
        title: "bulk (page_bench04_bulk): N order-0 pages per call, allocated then freed; median, whiskers min–max"
            .into(),
        x_desc: "N, pages per call (log scale)",
        y_desc: "ns per page",
        series,
        x_names: None,
        markers: Vec::new(),
        dashed_suffix: None,
    };
    lines(root, &spec, true, true, Some(keys))
}

fn threshold(root: &Area, recs: &[&Rec]) -> Result<(), String> {
    let names: Vec<String> =
        distinct(recs.iter().filter_map(|r| r.params["numa_stat_threshold"].as_str().map(String::from)));
    let threads = distinct(recs.iter().filter_map(|r| r.params["threads"].as_u64()));
    let at = |r: &Rec| names.iter().position(|n| r.params["numa_stat_threshold"] == n.as_str()).map(|i| i as f64);
    let mut ns = Vec::new();
    let mut change = Vec::new();
    for t in &threads {
        let of: Vec<&&Rec> = recs.iter().filter(|r| r.params["threads"].as_u64() == Some(*t)).collect();
        ns.push((format!("zonal, {t} threads"), of.iter().filter_map(|r| Some((at(r)?, r.ns?))).collect()));
        let pct = |x: f64| (x - 1.0) * 100.0;
        let pts = of.iter().filter_map(|r| {
            let c = pct(r.ratio?);
            Some((at(r)?, Sum { med: c, min: c, max: c }))
        });
        change.push((format!("zonal, {t} threads"), pts.collect()));
    }
    // Seed 000's cycles against its own figure at 125, from the records of one thread count.
    let seed = |r: &Rec| r.params["seed_000_cycles_88_threads"].as_f64();
    if let Some(t) = threads.first() {
        let of: Vec<&&Rec> = recs.iter().filter(|r| r.params["threads"].as_u64() == Some(*t)).collect();
        if let Some(base) = of.iter().find(|r| r.params["numa_stat_threshold"] == "125").and_then(|r| seed(r)) {
            let pts = of.iter().filter_map(|r| {
                let c = (seed(r)? / base - 1.0) * 100.0;
                Some((at(r)?, Sum { med: c, min: c, max: c }))
            });
            change.push(("seed 000, 88 threads (cycles)".to_string(), pts.collect()));
        }
    }
    let (left, right) = root.split_vertically(root.dim_in_pixel().1 / 2);
    let spec = Lines {
        title: "threshold (seed 000): NUMA counters folded past the threshold, all CPUs on one zone; median, \
                whiskers min–max"
            .into(),
        x_desc: "numa_stat_threshold",
        y_desc: "ns per pair per thread",
        series: ns,
        x_names: Some(names.clone()),
        markers: Vec::new(),
        dashed_suffix: None,
    };
    lines(&left, &spec, false, false, None)?;
    let spec = Lines {
        title: "threshold (seed 000): change against threshold 125, zonal's and the seed's".into(),
        x_desc: "numa_stat_threshold",
        y_desc: "% against 125",
        series: change,
        x_names: Some(names),
        markers: Vec::new(),
        dashed_suffix: None,
    };
    lines(&right, &spec, false, false, None)
}

/// Bars with a row per value of `row_param` and a bar per value of `group_param`.
fn grouped(
    recs: &[&Rec],
    row_param: &str,
    group: impl Fn(&Rec) -> String,
) -> (Vec<String>, Vec<String>, Vec<Vec<Option<Sum>>>) {
    let row_of =
        |r: &Rec| r.params[row_param].as_str().map(String::from).unwrap_or_else(|| r.params[row_param].to_string());
    let rows = distinct(recs.iter().map(|r| row_of(r)));
    let groups = distinct(recs.iter().map(|r| group(r)));
    let vals = rows
        .iter()
        .map(|row| {
            groups
                .iter()
                .map(|g| recs.iter().find(|r| row_of(r) == *row && group(r) == *g).and_then(|r| r.ns))
                .collect()
        })
        .collect();
    (rows, groups, vals)
}

fn threads_label(r: &Rec) -> String {
    match r.params["threads"].as_u64() {
        Some(1) => "1 thread".into(),
        Some(t) => format!("{t} threads"),
        None => "?".into(),
    }
}

fn modes(root: &Area, recs: &[&Rec]) -> Result<(), String> {
    let (rows, groups, vals) = grouped(recs, "numa_stats_mode", threads_label);
    let spec = Bars {
        title: "modes (seed 001): numa_stats_mode, all CPUs on one zone; median, whiskers min–max".into(),
        x_desc: "ns per pair per thread",
        rows,
        groups,
        vals,
    };
    bars(root, &spec)
}

fn stats(root: &Area, recs: &[&Rec]) -> Result<(), String> {
    let (bulk, pairs): (Vec<&Rec>, Vec<&Rec>) =
        recs.iter().copied().partition(|r| !r.params["bulk_accounting"].is_null());
    let (top, bottom) = root.split_vertically(root.dim_in_pixel().1 / 2);
    let (rows, groups, vals) = grouped(&pairs, "numa_stat_strategy", threads_label);
    let spec = Bars {
        title: "stats (seed 002): NUMA counters, shared against per-CPU, all CPUs on one zone".into(),
        x_desc: "ns per pair per thread",
        rows,
        groups,
        vals,
    };
    bars(&top, &spec)?;
    let batch = bulk.first().and_then(|r| r.params["batch"].as_u64()).unwrap_or(0);
    let (rows, groups, vals) = grouped(&bulk, "numa_stat_strategy", |r| {
        format!("bulk_accounting {}", r.params["bulk_accounting"].as_str().unwrap_or("?"))
    });
    let spec = Bars {
        title: format!("stats (seed 002): bulk calls of {batch} pages, accounted per page against once per call"),
        x_desc: "ns per page",
        rows,
        groups,
        vals,
    };
    bars(&bottom, &spec)
}

fn zlc(root: &Area, recs: &[&Rec]) -> Result<(), String> {
    let row = |r: &Rec| {
        let p = &r.params;
        let zones = match p["full_zones_ahead"].as_u64() {
            Some(0) => "local (room)".to_string(),
            Some(n) => format!("{n} full ahead"),
            None => "?".into(),
        };
        format!("{} nodes, {zones}, {}", p["nodes"], threads_label(r))
    };
    let rows = distinct(recs.iter().map(|r| row(r)));
    let groups = distinct(recs.iter().map(|r| r.label.trim_start_matches("zonal ").to_string()));
    let vals = rows
        .iter()
        .map(|x| {
            groups
                .iter()
                .map(|g| {
                    recs.iter().find(|r| row(r) == *x && r.label.trim_start_matches("zonal ") == g).and_then(|r| r.ns)
                })
                .collect()
        })
        .collect();
    let spec = Bars {
        title:
            "zlc (seed 003): order-0 allocations past full nodes, zonelist cache on and off; median, whiskers min–max"
                .into(),
        x_desc: "alloc ns per page",
        rows,
        groups,
        vals,
    };
    bars(root, &spec)
}

/// Per window index, the median over runs of `f(run, window)`; x the median window end.
fn over_time(runs: &[Value], f: impl Fn(&Value, usize) -> Option<f64>) -> Vec<(f64, Sum)> {
    let len = runs.iter().map(|r| r["end_s"].as_array().map_or(0, Vec::len)).min().unwrap_or(0);
    (0..len)
        .filter_map(|i| {
            let ys: Vec<f64> = runs.iter().filter_map(|r| f(r, i)).collect();
            let xs: Vec<f64> = runs.iter().filter_map(|r| r["end_s"][i].as_f64()).collect();
            if ys.is_empty() || xs.is_empty() {
                return None;
            }
            let s = super::Summary::of(&ys);
            Some((super::Summary::of(&xs).median, Sum { med: s.median, min: s.min, max: s.max }))
        })
        .collect()
}

/// A window's length in s: from the end of the one before (or the start).
fn window_s(run: &Value, i: usize) -> Option<f64> {
    let end = run["end_s"][i].as_f64()?;
    let start = if i == 0 { 0.0 } else { run["end_s"][i - 1].as_f64()? };
    (end > start).then_some(end - start)
}

fn numab(root: &Area, recs: &[&Rec]) -> Result<(), String> {
    let mut rates = Vec::new();
    let mut flushes = Vec::new();
    let mut freed = Vec::new();
    for r in recs {
        let Some(runs) = r.params["timeline"]["runs"].as_array() else { continue };
        freed.extend(runs.iter().filter_map(|run| run["eater_freed_s"].as_f64()));
        rates.push((r.label.clone(), over_time(runs, |run, i| Some(run["accesses_per_s"][i].as_f64()? / 1e6))));
        let per_s = |key: &'static str| move |run: &Value, i: usize| Some(run[key][i].as_f64()? / window_s(run, i)?);
        flushes.push((format!("{} received", r.label), over_time(runs, per_s("tlb_shootdowns_received"))));
        let req = over_time(runs, per_s("remote_flushes_requested"));
        if !req.is_empty() {
            flushes.push((format!("{} requested", r.label), req));
        }
    }
    let markers = if freed.is_empty() {
        Vec::new()
    } else {
        vec![(super::Summary::of(&freed).median, "eater freed".to_string())]
    };
    let (top, bottom) = root.split_vertically(root.dim_in_pixel().1 / 2);
    let spec = Lines {
        title: "numab (seed 004): accesses/s per 100 ms window, median over repetitions, whiskers min–max".into(),
        x_desc: "s from the start",
        y_desc: "M accesses/s",
        series: rates,
        x_names: None,
        markers: markers.clone(),
        dashed_suffix: None,
    };
    lines(&top, &spec, false, false, None)?;
    // Received and requested of one variant in its colour: a series each, requested dashed.
    let spec = Lines {
        title: "TLB shootdowns received (/proc/interrupts) and remote flushes requested (tlb:tlb_flush), machine-wide"
            .into(),
        x_desc: "s from the start",
        y_desc: "per second",
        series: flushes,
        x_names: None,
        markers,
        dashed_suffix: Some(" requested"),
    };
    lines(&bottom, &spec, false, false, None)
}

/// `tier`: accesses/s over time per variant, and the hot set's share on the fast node.
fn tier(root: &Area, recs: &[&Rec]) -> Result<(), String> {
    let (mut rates, mut shares) = (Vec::new(), Vec::new());
    for r in recs {
        let Some(runs) = r.params["timeline"]["runs"].as_array() else { continue };
        rates.push((r.label.clone(), over_time(runs, |run, i| Some(run["accesses_per_s"][i].as_f64()? / 1e6))));
        shares.push((r.label.clone(), over_time(runs, |run, i| Some(run["hot_on_fast"][i].as_f64()? * 100.0))));
    }
    let (top, bottom) = root.split_vertically(root.dim_in_pixel().1 / 2);
    let spec = Lines {
        title: "tier (issue 41): accesses/s per 100 ms window, median over repetitions, whiskers min–max".into(),
        x_desc: "s from the start",
        y_desc: "M accesses/s",
        series: rates,
        x_names: None,
        markers: Vec::new(),
        dashed_suffix: None,
    };
    lines(&top, &spec, false, false, None)?;
    let spec = Lines {
        title: "the hot set's share on the fast node".into(),
        x_desc: "s from the start",
        y_desc: "% of the hot set",
        series: shares,
        x_names: None,
        markers: Vec::new(),
        dashed_suffix: None,
    };
    lines(&bottom, &spec, false, false, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rec(experiment: &str, subject: &str, params: Value, med: f64, process: &str) -> Value {
        json!({"experiment": experiment, "subject": subject, "params": params,
               "ns_per_op": {"median": med, "min": med * 0.9, "max": med * 1.2},
               "reference": "mimalloc", "ratio_to_reference": 1.0, "reps": 3, "process": process})
    }

    #[test]
    fn the_childs_mimalloc_is_told_apart() {
        let v = vec![
            rec("single", "mimalloc", json!({}), 10.0, "main"),
            rec("single", "zonal pcp", json!({}), 5.0, "main"),
            rec("single", "mimalloc", json!({}), 11.0, CHILD_PROCESS),
            rec("single", "tcmalloc (rseq per-CPU)", json!({}), 7.0, CHILD_PROCESS),
        ];
        let labels: Vec<String> = parse(&v).unwrap().into_iter().map(|r| r.label).collect();
        assert_eq!(labels, ["mimalloc", "zonal pcp", "mimalloc (tcmalloc child)", "tcmalloc (rseq per-CPU)"]);
        assert!(parse(&[json!({"subject": "x"})]).unwrap_err().contains("without `experiment`"));
    }

    #[test]
    fn every_experiment_draws_its_series() {
        let mut v = Vec::new();
        for (s, base) in [("zonal bulk array", 3.0), ("mimalloc", 9.0)] {
            for n in [1, 2, 4, 128] {
                v.push(rec("bulk", s, json!({"batch": n}), base / n as f64 + 1.0, "main"));
            }
        }
        for t in [1, 2, 4] {
            v.push(rec("parallel", "zonal pcp", json!({"threads": t}), 4.0 * t as f64, "main"));
            v.push(rec("mixed", "zonal pcp one node", json!({"threads": t}), 5.0 * t as f64, "main"));
        }
        for (t, c) in [("32", 799), ("125", 537), ("off", 342)] {
            for threads in [2, 4] {
                v.push(rec(
                    "threshold",
                    "zonal pcp",
                    json!({"threads": threads, "numa_stat_threshold": t, "seed_000_cycles_88_threads": c}),
                    20.0,
                    "main",
                ));
            }
        }
        v.push(rec("modes", "zonal pcp", json!({"threads": 1, "numa_stats_mode": "strict"}), 9.0, "main"));
        v.push(rec("stats", "zonal pcp", json!({"threads": 1, "numa_stat_strategy": "shared"}), 9.0, "main"));
        for a in ["batch", "per_page"] {
            v.push(rec(
                "stats",
                "zonal bulk array",
                json!({"batch": 128, "numa_stat_strategy": "percpu", "bulk_accounting": a}),
                2.0,
                "main",
            ));
        }
        v.push(rec(
            "zlc",
            "zonal zonelist_cache on",
            json!({"nodes": 8, "full_zones_ahead": 7, "threads": 2}),
            90.0,
            "main",
        ));
        for cpus in [2, 1024] {
            for nodes in [1, 8] {
                let p = json!({"cpus": cpus, "nodes": nodes, "node_size": "64M", "unit": "ns"});
                v.push(rec("scale", "housekeeping pass", p, cpus as f64 * 20.0, "main"));
            }
        }
        v.push(rec(
            "numab",
            "userfaultfd delayed",
            json!({"timeline": {"window_ms": 100, "runs": [
            {"eater_freed_s": 0.4, "end_s": [0.1, 0.2, 0.3], "accesses_per_s": [2e7, 1e7, 3e7],
             "tlb_shootdowns_received": [10, 20, 5], "remote_flushes_requested": [null, null, null],
             "pages_migrated": [0, 100, 3]}]}}),
            900.0,
            "main",
        ));
        v.push(rec(
            "tier",
            "mode 2 delayed",
            json!({"timeline": {"window_ms": 100, "runs": [
            {"end_s": [0.1, 0.2, 0.3], "accesses_per_s": [2e6, 2e7, 3e7], "hot_on_fast": [0.0, 0.5, 1.0]}]}}),
            40.0,
            "main",
        ));
        let recs = parse(&v).unwrap();
        for (e, want) in [
            ("bulk", vec!["zonal bulk array", "mimalloc", "N, pages per call (log scale)"]),
            ("parallel", vec!["zonal pcp", "threads (log scale)"]),
            ("mixed", vec!["zonal pcp one node", "ns per page per thread"]),
            ("threshold", vec!["zonal, 2 threads", "seed 000, 88 threads (cycles)", "off"]),
            ("modes", vec!["strict"]),
            ("stats", vec!["shared", "percpu", "bulk_accounting per_page"]),
            ("zlc", vec!["8 nodes, 7 full ahead, 2 threads"]),
            ("numab", vec!["userfaultfd delayed", "userfaultfd delayed received", "eater freed"]),
            ("tier", vec!["mode 2 delayed", "% of the hot set"]),
            ("scale", vec!["housekeeping pass", "the CPUs (linear)", "CPUs (log scale, virtual beyond the machine)"]),
        ] {
            let of: Vec<&Rec> = recs.iter().filter(|r| r.experiment == e).collect();
            let svg = render(e, &of).unwrap();
            assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{e}: {svg}");
            for w in want {
                // plotters writes a text element's content on a line of its own.
                assert!(svg.contains(&format!(">\n{w}\n</text>")), "{e}: `{w}` missing");
            }
            // A series of nulls draws nothing rather than a line at 0.
            assert!(!svg.contains("requested\n</text>"), "{e}");
        }
    }

    #[test]
    fn number_labels_and_ranges() {
        assert_eq!(
            (fmt_num(0.0), fmt_num(2.0), fmt_num(2.5), fmt_num(0.25), fmt_num(25_000.0)),
            ("0".into(), "2".into(), "2.5".into(), "0.25".into(), "25k".into())
        );
        assert_eq!(value_range([], true), (1.0, 10.0));
        let (lo, hi) = value_range([2.0, 8.0], false);
        assert!(lo == 0.0 && hi > 8.0);
        assert!(wants_log([1.0, 1000.0]) && !wants_log([10.0, 30.0]));
    }

    #[test]
    fn a_missing_directory_is_made_once_and_a_file_is_refused() {
        let base = std::env::temp_dir().join(format!("zonal-plot-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        assert!(prepare(&base.join("a/b")).unwrap_err().contains("its parent must exist"));
        prepare(&base).unwrap();
        assert!(base.is_dir() && std::fs::read_dir(&base).unwrap().next().is_none(), "the probe is removed");
        let file = base.join("f");
        std::fs::write(&file, "").unwrap();
        assert!(prepare(&file).unwrap_err().contains("not a directory"));
        std::fs::remove_dir_all(&base).unwrap();
    }
}

//! `bench-report`: turns the reports the whole-system benchmarks wrote under
//! `target/bench-results/` into `bench/report.md`, with each table and an SVG chart of each
//! ratio (`bench/report/<bench>-<id>.svg`). `make bench` runs the benchmarks, then this.

use std::path::{Path, PathBuf};

use bench::{Plot, Report};
use plotters::prelude::*;

/// Draws `p` as grouped bars into `path`.
fn draw(p: &Plot, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let groups = p.categories.len().max(1);
    let k = p.series.len() + 1;
    let slots = (groups * k) as i32;
    let top = p
        .series
        .iter()
        .flat_map(|(_, v)| v.iter().flatten().copied())
        .chain(p.mark.iter().map(|(v, _)| *v))
        .fold(0.0_f64, f64::max)
        * 1.2;
    let root = SVGBackend::new(path, (960, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(&p.title, ("sans-serif", 20))
        .margin(14)
        .x_label_area_size(48)
        .y_label_area_size(90)
        .build_cartesian_2d((0..slots).into_segmented(), 0.0..top.max(1e-9))?;
    let middle = (p.series.len().saturating_sub(1) / 2) as i32;
    let names = p.categories.clone();
    let label = move |v: &SegmentValue<i32>| match v {
        SegmentValue::CenterOf(s) if s % k as i32 == middle => {
            names.get((s / k as i32) as usize).cloned().unwrap_or_default()
        }
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(slots as usize)
        .x_label_formatter(&label)
        .x_desc(&p.x)
        .y_desc(&p.y)
        .draw()?;
    for (j, (name, values)) in p.series.iter().enumerate() {
        let color = Palette99::pick(j).filled();
        chart
            .draw_series(values.iter().enumerate().filter_map(|(i, v)| {
                let s = (i * k + j) as i32;
                v.map(|v| {
                    Rectangle::new([(SegmentValue::Exact(s), 0.0), (SegmentValue::Exact(s + 1), v)], color)
                })
            }))?
            .label(name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], Palette99::pick(j).filled()));
    }
    if let Some((v, name)) = &p.mark {
        chart
            .draw_series(LineSeries::new(
                [(SegmentValue::Exact(0), *v), (SegmentValue::Exact(slots), *v)],
                BLACK.stroke_width(2),
            ))?
            .label(name)
            .legend(|(x, y)| PathElement::new([(x, y), (x + 12, y)], BLACK.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

fn main() -> std::process::ExitCode {
    let results = std::env::args().nth(1).map_or_else(bench::results_dir, PathBuf::from);
    let out = Path::new(env!("CARGO_MANIFEST_DIR"));
    let charts = out.join("report");
    let mut reports: Vec<Report> = match std::fs::read_dir(&results) {
        Ok(rd) => rd
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
            .filter_map(|e| {
                let b = std::fs::read(e.path()).ok()?;
                serde_json::from_slice(&b)
                    .map_err(|err| eprintln!("bench-report: {}: {err}", e.path().display()))
                    .ok()
            })
            .collect(),
        Err(e) => {
            eprintln!("bench-report: {}: {e}: run the benchmarks first (make bench)", results.display());
            return std::process::ExitCode::from(1);
        }
    };
    if reports.is_empty() {
        eprintln!("bench-report: no reports in {}: run the benchmarks first (make bench)", results.display());
        return std::process::ExitCode::from(1);
    }
    let order = ["server_fs", "appends_ctx", "tsh_run", "server_views"];
    reports.sort_by_key(|r| order.iter().position(|o| *o == r.bench).unwrap_or(order.len()));
    let _ = std::fs::create_dir_all(&charts);
    let when = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |c| c.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut md = format!(
        "# Benchmark report\n\nWritten by `make bench` on {when}: {cores} CPUs, Linux {}, load {} at the end. \
         Every ratio compares two things measured in the same run; the machines are shared and noisy, \
         so compare ratios, not absolute numbers, and see [README.md](README.md) for the runs \
         behind each claim.\n",
        kernel.trim(),
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    for r in &reports {
        md.push_str(&format!("\n## {}\n\n{}\n\nCommand: `{}`\n", r.bench, r.about, r.command));
        for p in &r.plots {
            let file = format!("{}-{}.svg", r.bench, p.id);
            match draw(p, &charts.join(&file)) {
                Ok(()) => md.push_str(&format!("\n![{}](report/{file})\n", p.title)),
                Err(e) => eprintln!("bench-report: {file}: {e}"),
            }
        }
        for t in &r.tables {
            md.push_str(&format!("\n{}:\n\n| {} |\n|", t.title, t.header.join(" | ")));
            for i in 0..t.header.len() {
                md.push_str(if i == 0 { "---|" } else { "---:|" });
            }
            md.push('\n');
            for row in &t.rows {
                md.push_str(&format!("| {} |\n", row.join(" | ")));
            }
        }
    }
    let path = out.join("report.md");
    if let Err(e) = std::fs::write(&path, md) {
        eprintln!("bench-report: {}: {e}", path.display());
        return std::process::ExitCode::from(1);
    }
    println!(
        "bench-report: wrote {} and {} chart(s) in {}",
        path.display(),
        reports.iter().map(|r| r.plots.len()).sum::<usize>(),
        charts.display()
    );
    std::process::ExitCode::SUCCESS
}

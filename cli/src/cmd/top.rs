//! `ctx top`: every running agent at a glance, live, sorted by activity.
//!
//! It reads what `ctx agent ps` reads (the daemon's run directories, each run's groups, the end
//! of its session's events), every `--interval`, and reads of each session only what was
//! appended since it last looked; it draws again only when something shown changed, and
//! otherwise waits on the terminal for a key, so that it costs nothing while the fleet is quiet.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ctxterm::launch::{self, Activity, RunInfo};
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Row, Table, TableState};

use crate::exit::{self, Exit};

/// `ctx top`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The control socket of the daemon whose runs these are.
    #[arg(long, default_value = policy::runtime::CONTROL_SOCKET)]
    control: PathBuf,
    /// How often it looks again, in milliseconds (it draws only when something changed).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..=60_000))]
    interval: u64,
    /// Print the table once, as text, and exit (no terminal needed).
    #[arg(long)]
    once: bool,
}

/// One row: what is shown of a running run.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Shown {
    agent: String,
    session: String,
    profile: String,
    started: String,
    cpu: String,
    mem: String,
    tools: u64,
    last: String,
    /// When its last event was (seconds since the epoch), for the order.
    last_at: i64,
}

/// Times are shown as clock times (UTC), not ages: a row changes only when its run does.
const HEADER: [&str; 8] = ["AGENT", "SESSION", "PROFILE", "STARTED", "CPU", "MEM", "TOOLS", "LAST EVENT"];

/// `ctx top`.
pub fn run(a: Args) -> anyhow::Result<()> {
    let mut known = Activity::default();
    if a.once {
        let rows = look(&a.control, &mut known);
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", HEADER.join("\t"))?;
        for r in &rows {
            writeln!(
                out,
                "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
                r.agent, r.session, r.profile, r.started, r.cpu, r.mem, r.tools, r.last
            )?;
        }
        return Ok(());
    }
    if !rustix::termios::isatty(std::io::stdout()) {
        return Err(Exit::new(
            exit::INVALID,
            "ctx top: standard output is not a terminal (ctx top --once, ctx agent ps)",
        )
        .into());
    }
    let mut term = ratatui::try_init()?;
    let shown = watch(&mut term, &a, &mut known);
    ratatui::restore();
    shown
}

fn watch(term: &mut ratatui::DefaultTerminal, a: &Args, known: &mut Activity) -> anyhow::Result<()> {
    let every = Duration::from_millis(a.interval);
    let mut state = TableState::default();
    let (mut rows, mut drawn) = (look(&a.control, known), None::<(Vec<Shown>, Option<usize>, String)>);
    let mut next = Instant::now() + every;
    loop {
        let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
        // Drawn again only when a row, the selection or the size changed (the clock in the
        // title moves with them, not on its own).
        let size = term.size().map(|s| format!("{}x{}", s.width, s.height)).unwrap_or_default();
        let now = (rows.clone(), state.selected(), size);
        if drawn.as_ref() != Some(&now) {
            term.draw(|f| draw(f, &rows, &mut state, &stamp))?;
            drawn = Some(now);
        }
        let wait = next.saturating_duration_since(Instant::now());
        if event::poll(wait)? {
            match event::read()? {
                Event::Key(k) if k.kind == KeyEventKind::Press => match k.code {
                    KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                    KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => return Ok(()),
                    KeyCode::Down | KeyCode::Char('j') => state.select_next(),
                    KeyCode::Up | KeyCode::Char('k') => state.select_previous(),
                    _ => {}
                },
                Event::Resize(..) => drawn = None,
                _ => {}
            }
            continue;
        }
        rows = look(&a.control, known);
        next = Instant::now() + every;
    }
}

fn draw(f: &mut ratatui::Frame<'_>, rows: &[Shown], state: &mut TableState, stamp: &str) {
    let [title, table] = Layout::vertical([Constraint::Length(1), Constraint::Fill(1)]).areas(f.area());
    let busy = rows.iter().filter(|r| r.last_at > 0).count();
    f.render_widget(
        Line::from(format!(
            "ctx top - {} running, {busy} with events, drawn at {stamp}   (q quits, arrows move)",
            rows.len()
        )),
        title,
    );
    let widths = [
        Constraint::Min(12),
        Constraint::Min(10),
        Constraint::Length(8),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(10),
        Constraint::Length(6),
        Constraint::Fill(1),
    ];
    let t = Table::new(
        rows.iter().map(|r| {
            Row::new([
                r.agent.clone(),
                r.session.clone(),
                r.profile.clone(),
                r.started.clone(),
                r.cpu.clone(),
                r.mem.clone(),
                r.tools.to_string(),
                r.last.clone(),
            ])
        }),
        widths,
    )
    .header(Row::new(HEADER).style(Style::new().add_modifier(Modifier::BOLD)))
    .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED));
    f.render_stateful_widget(t, table, state);
}

/// The running runs, the most recently active first.
fn look(control: &Path, known: &mut Activity) -> Vec<Shown> {
    let clock = |t: i64| {
        let at = std::time::UNIX_EPOCH + Duration::from_secs(u64::try_from(t).unwrap_or(0));
        let s = humantime::format_rfc3339_seconds(at).to_string();
        s.get(11..19).unwrap_or("-").to_owned()
    };
    let mut rows: Vec<Shown> = launch::runs_watched(control, known)
        .into_iter()
        .filter(|r| r.pid.is_some())
        .map(|r: RunInfo| {
            let u = r.usage.unwrap_or_default();
            Shown {
                started: r.since.map_or_else(|| "-".into(), clock),
                cpu: u.cpu_ns.map_or_else(|| "-".into(), |n| format!("{:.2}s", n as f64 / 1e9)),
                mem: u
                    .memory
                    .map_or_else(|| "-".into(), |b| format!("{:.1}MiB", b as f64 / f64::from(1u32 << 20))),
                tools: r.tool_calls.unwrap_or(0),
                last: r
                    .last_event
                    .as_ref()
                    .map_or_else(|| "-".into(), |(k, at)| format!("{k} at {}", clock(*at))),
                last_at: r.last_event.as_ref().map_or(0, |(_, at)| *at),
                profile: r.profile.unwrap_or_else(|| "tsh".into()),
                agent: r.agent,
                session: r.session,
            }
        })
        .collect();
    rows.sort_by(|x, y| {
        (y.last_at, y.tools, &x.agent, &x.session).cmp(&(x.last_at, x.tools, &y.agent, &y.session))
    });
    rows
}

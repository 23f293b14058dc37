//! `stats`: the counters of a lock table or a dict file, as text (with rates under
//! `--watch`), JSON or the Prometheus text exposition format.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::Instant;

use shmlock::{DictStats, Histogram, LockStats};

use crate::args::{secs, StatsArgs};
use crate::exit::{stdout_failed, Fail, EX_USAGE};
use crate::inspect::Inspected;

/// What one read of the counters gave.
enum Read {
    Table(LockStats),
    Dict(DictStats),
}

fn read(what: &Inspected) -> Result<Read, Fail> {
    match what {
        Inspected::Table(t, _) => Ok(Read::Table(t.stats())),
        Inspected::Dict(d, _) => Ok(Read::Dict(d.stats())),
        Inspected::Redis(..) => Err(Fail(
            "stats: a Redis handle's counters are kept by the process that uses it \
             (RedisLocks::stats); the server keeps none"
                .into(),
            EX_USAGE,
        )),
    }
}

/// Prints the counters once, or (--watch) again every --interval with the rates since the
/// print before.
pub fn stats(what: &Inspected, file: &Path, a: &StatsArgs) -> Result<u8, Fail> {
    if a.json && a.prometheus {
        return Err(Fail("--json and --prometheus: choose one".into(), EX_USAGE));
    }
    let watch = a.watch || a.interval.is_some();
    let interval = secs(a.interval.unwrap_or(1.0), "--interval")?;
    if watch && interval < crate::inspect::MIN_INTERVAL {
        return Err(Fail(crate::inspect::TOO_SHORT.into(), EX_USAGE));
    }
    let terminal = std::io::stdout().is_terminal();
    let mut before: Option<(Read, Instant)> = None;
    let watched = what.watched();
    loop {
        if let Some(seen) = watched.as_ref().filter(|_| before.is_some()) {
            seen.still_there()?;
        }
        let now = read(what)?;
        let taken = Instant::now();
        let rates = before
            .as_ref()
            .map(|(b, at)| (b, taken.duration_since(*at).as_secs_f64()));
        let mut out = String::new();
        if a.prometheus {
            prometheus(&mut out, file, &now);
        } else if a.json {
            json(&mut out, file, &now, rates);
        } else {
            if watch && terminal {
                out.push_str("\x1b[H\x1b[2J");
            }
            text(&mut out, file, &now, rates);
        }
        if watch && !a.json && !terminal {
            out.push('\n');
        }
        let mut stdout = std::io::stdout().lock();
        match stdout
            .write_all(out.as_bytes())
            .and_then(|()| stdout.flush())
        {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(0),
            Err(e) => return Err(stdout_failed(e)),
        }
        if !watch {
            return Ok(0);
        }
        before = Some((now, taken));
        std::thread::sleep(interval);
    }
}

/// A count, and its rate since the read before (text).
fn count(n: u64, before: Option<u64>, secs: f64) -> String {
    match before {
        Some(b) if secs > 0.0 => format!("{n} ({:.1}/s)", n.saturating_sub(b) as f64 / secs),
        _ => n.to_string(),
    }
}

/// The smallest bucket bound below which a fraction `q` of the values fall: "< 64µs".
fn quantile(h: &Histogram, q: f64) -> String {
    if h.count == 0 {
        return "-".into();
    }
    let want = (h.count as f64 * q).ceil().max(1.0) as u64;
    let mut seen: u64 = 0;
    for &(bound, n) in &h.buckets {
        seen = seen.saturating_add(n);
        if seen >= want {
            return match bound {
                Some(b) => format!("<{b:?}"),
                None => ">=4.2s".into(),
            };
        }
    }
    "-".into()
}

fn histogram_line(out: &mut String, name: &str, h: &Histogram) {
    let mean = if h.count > 0 {
        format!("{:?}", h.sum / h.count.min(u64::from(u32::MAX)) as u32)
    } else {
        "-".into()
    };
    let _ = writeln!(
        out,
        "{name:<27} {}  mean {mean}  p50 {}  p90 {}  p99 {}",
        h.count,
        quantile(h, 0.5),
        quantile(h, 0.9),
        quantile(h, 0.99)
    );
}

fn text(out: &mut String, file: &Path, now: &Read, rates: Option<(&Read, f64)>) {
    let secs = rates.map_or(0.0, |r| r.1);
    match now {
        Read::Table(s) => {
            let b = match rates {
                Some((Read::Table(b), _)) => Some(b),
                _ => None,
            };
            let _ = writeln!(out, "{} (lock table)", file.display());
            let rows: [(&str, u64, Option<u64>); 7] = [
                ("acquisitions", s.acquisitions, b.map(|b| b.acquisitions)),
                ("  after waiting", s.contended, b.map(|b| b.contended)),
                ("timeouts", s.timeouts, b.map(|b| b.timeouts)),
                (
                    "taken from dead holders",
                    s.dead_owner_takeovers,
                    b.map(|b| b.dead_owner_takeovers),
                ),
                (
                    "taken after lease expiry",
                    s.expired_takeovers,
                    b.map(|b| b.expired_takeovers),
                ),
                ("refused: table full", s.table_full, b.map(|b| b.table_full)),
                ("renewals of lost holds", s.lost, b.map(|b| b.lost)),
            ];
            for (name, n, before) in rows {
                let _ = writeln!(out, "{name:<27} {}", count(n, before, secs));
            }
            histogram_line(out, "waits (contended)", &s.wait);
            histogram_line(out, "holds released to waiters", &s.hold);
        }
        Read::Dict(s) => {
            let b = match rates {
                Some((Read::Dict(b), _)) => Some(b),
                _ => None,
            };
            let _ = writeln!(out, "{} (shared dict)", file.display());
            let rows: [(&str, u64, Option<u64>); 4] = [
                ("hits", s.hits, b.map(|b| b.hits)),
                ("misses", s.misses, b.map(|b| b.misses)),
                ("sets", s.sets, b.map(|b| b.sets)),
                (
                    "evictions (forcible sets)",
                    s.evictions,
                    b.map(|b| b.evictions),
                ),
            ];
            for (name, n, before) in rows {
                let _ = writeln!(out, "{name:<27} {}", count(n, before, secs));
            }
            // (bytes_capacity, an upper bound, is no measure of fullness: not shown)
            let _ = writeln!(
                out,
                "{:<27} {} of {} (expired ones included until reused)",
                "entries in use", s.entries, s.capacity
            );
            let _ = writeln!(out, "{:<27} {}", "bytes of keys and values", s.bytes_in_use);
            if s.heap_bytes > 0 {
                let _ = writeln!(
                    out,
                    "{:<27} {} of {}",
                    "heap bytes free", s.heap_free, s.heap_bytes
                );
            }
        }
    }
}

#[derive(serde::Serialize)]
struct JsonHistogram {
    count: u64,
    sum_ns: u64,
    /// `[upper bound in µs (null: none), count]`, not cumulative.
    buckets: Vec<(Option<u64>, u64)>,
}

impl From<&Histogram> for JsonHistogram {
    fn from(h: &Histogram) -> JsonHistogram {
        JsonHistogram {
            count: h.count,
            sum_ns: u64::try_from(h.sum.as_nanos()).unwrap_or(u64::MAX),
            buckets: h
                .buckets
                .iter()
                .map(|&(b, n)| (b.map(|b| b.as_micros() as u64), n))
                .collect(),
        }
    }
}

fn json(out: &mut String, file: &Path, now: &Read, rates: Option<(&Read, f64)>) {
    let per_s = |n: u64, b: u64, secs: f64| n.saturating_sub(b) as f64 / secs.max(1e-9);
    let file = file.to_string_lossy();
    let value = match now {
        Read::Table(s) => {
            let rates = match rates {
                Some((Read::Table(b), secs)) => Some(serde_json::json!({
                    "acquisitions": per_s(s.acquisitions, b.acquisitions, secs),
                    "contended": per_s(s.contended, b.contended, secs),
                    "timeouts": per_s(s.timeouts, b.timeouts, secs),
                    "dead_owner_takeovers":
                        per_s(s.dead_owner_takeovers, b.dead_owner_takeovers, secs),
                    "expired_takeovers": per_s(s.expired_takeovers, b.expired_takeovers, secs),
                    "table_full": per_s(s.table_full, b.table_full, secs),
                    "lost": per_s(s.lost, b.lost, secs),
                })),
                _ => None,
            };
            serde_json::json!({
                "file": file,
                "kind": "lock table",
                "acquisitions": s.acquisitions,
                "contended": s.contended,
                "timeouts": s.timeouts,
                "dead_owner_takeovers": s.dead_owner_takeovers,
                "expired_takeovers": s.expired_takeovers,
                "table_full": s.table_full,
                "lost": s.lost,
                "wait": JsonHistogram::from(&s.wait),
                "hold": JsonHistogram::from(&s.hold),
                "per_second": rates,
            })
        }
        Read::Dict(s) => {
            let rates = match rates {
                Some((Read::Dict(b), secs)) => Some(serde_json::json!({
                    "hits": per_s(s.hits, b.hits, secs),
                    "misses": per_s(s.misses, b.misses, secs),
                    "sets": per_s(s.sets, b.sets, secs),
                    "evictions": per_s(s.evictions, b.evictions, secs),
                    "forcible_sets": per_s(s.forcible_sets, b.forcible_sets, secs),
                })),
                _ => None,
            };
            serde_json::json!({
                "file": file,
                "kind": "dict",
                "hits": s.hits,
                "misses": s.misses,
                "sets": s.sets,
                "evictions": s.evictions,
                "forcible_sets": s.forcible_sets,
                "entries": s.entries,
                "capacity": s.capacity,
                "bytes_in_use": s.bytes_in_use,
                "bytes_capacity": s.bytes_capacity,
                "heap_bytes": s.heap_bytes,
                "heap_free": s.heap_free,
                "per_second": rates,
            })
        }
    };
    let _ = writeln!(out, "{value}");
}

/// A label value as the exposition format writes it: `\`, `"` and newlines escaped.
fn label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn metric(out: &mut String, name: &str, kind: &str, help: &str, file: &str, value: u64) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    let _ = writeln!(out, "{name}{{file=\"{file}\"}} {value}");
}

fn histogram(out: &mut String, name: &str, help: &str, file: &str, h: &Histogram) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} histogram");
    let mut cumulative: u64 = 0;
    for &(bound, n) in &h.buckets {
        cumulative = cumulative.saturating_add(n);
        let le = match bound {
            Some(b) => format!("{}", b.as_secs_f64()),
            None => "+Inf".into(),
        };
        let _ = writeln!(
            out,
            "{name}_bucket{{file=\"{file}\",le=\"{le}\"}} {cumulative}"
        );
    }
    let _ = writeln!(out, "{name}_sum{{file=\"{file}\"}} {}", h.sum.as_secs_f64());
    let _ = writeln!(out, "{name}_count{{file=\"{file}\"}} {}", h.count);
}

fn prometheus(out: &mut String, file: &Path, now: &Read) {
    let f = label(&file.to_string_lossy());
    let f = f.as_str();
    match now {
        Read::Table(s) => {
            let counters = [
                ("acquisitions", "Keys taken.", s.acquisitions),
                (
                    "contended_acquisitions",
                    "Keys taken after waiting for their holder.",
                    s.contended,
                ),
                ("timeouts", "Waits for a key that ran out.", s.timeouts),
                (
                    "dead_owner_takeovers",
                    "Held keys freed because their holder had died.",
                    s.dead_owner_takeovers,
                ),
                (
                    "expired_takeovers",
                    "Held keys freed because their lease had run out.",
                    s.expired_takeovers,
                ),
                (
                    "table_full",
                    "Acquisitions refused because the table was full.",
                    s.table_full,
                ),
                (
                    "lost_renewals",
                    "Renewals that found the hold lost.",
                    s.lost,
                ),
            ];
            for (name, help, n) in counters {
                metric(out, &format!("shmlock_{name}_total"), "counter", help, f, n);
            }
            histogram(
                out,
                "shmlock_wait_seconds",
                "How long contended acquisitions waited.",
                f,
                &s.wait,
            );
            histogram(
                out,
                "shmlock_contended_hold_seconds",
                "How long the holds released to waiters were held.",
                f,
                &s.hold,
            );
        }
        Read::Dict(s) => {
            let counters = [
                (
                    "hits",
                    "Reads that found a live value (get_or_fetch: one read per call).",
                    s.hits,
                ),
                (
                    "misses",
                    "Reads that found none (get_stale's stale values included).",
                    s.misses,
                ),
                (
                    "sets",
                    "Values stored (set, add, replace, incr, list pushes).",
                    s.sets,
                ),
                (
                    "evictions",
                    "Live values evicted to make room (forcible sets).",
                    s.evictions,
                ),
            ];
            for (name, help, n) in counters {
                metric(
                    out,
                    &format!("shmlock_dict_{name}_total"),
                    "counter",
                    help,
                    f,
                    n,
                );
            }
            let gauges = [
                (
                    "entries",
                    "Entries in use, expired ones included until reused or flushed.",
                    s.entries,
                ),
                ("capacity", "Entries the dict has.", s.capacity),
                (
                    "bytes_in_use",
                    "Bytes of keys and values stored.",
                    s.bytes_in_use,
                ),
                (
                    "bytes_capacity",
                    "Upper bound of the bytes the dict holds (every entry's room, and the heap): not a fullness measure.",
                    s.bytes_capacity,
                ),
                (
                    "heap_bytes",
                    "Bytes of the heap for values longer than an entry's room.",
                    s.heap_bytes,
                ),
                ("heap_free", "Bytes of the heap free.", s.heap_free),
            ];
            for (name, help, n) in gauges {
                metric(out, &format!("shmlock_dict_{name}"), "gauge", help, f, n);
            }
        }
    }
}

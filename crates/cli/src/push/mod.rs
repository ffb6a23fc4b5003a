//! `mem-trace push`: the target's heap profile sent to a continuous-profiling server at each
//! interval, read without stopping the process (as `top` reads it).
//!
//! Two servers' ingestion APIs, both JSON over HTTP, both one series whose labels are
//! `__name__="memory"`, `service_name` and the user's, with one sample, the gzipped pprof
//! profile (`mem-trace pprof`'s):
//! - Grafana Pyroscope, `POST /push.v1.PusherService/Push` (Connect): labels a list;
//! - Parca, `POST /profiles/writeraw` (`ProfileStoreService.WriteRaw` through its HTTP
//!   gateway): labels in a label set, and `normalized: false`, because the locations hold
//!   the process's own addresses, each inside its module's mapping, as pprof's files do.
//!
//! As Pyroscope's own Go client does, the allocation values (`alloc_objects`,
//! `alloc_space`) are deltas since the last profile the server accepted, and the in-use
//! values absolute; the same for Parca, so that a sum over a time range counts each
//! allocation once.
//!
//! A failed push is one line on stderr and is retried with doubling waits until the next
//! interval is due; then it is given up and its allocations go into the next profile. Every
//! request has a timeout, so a server that never answers costs the interval, never a stall;
//! the traced process is only read, so nothing the server does reaches it. The loop ends when
//! the process does (or after `--count` profiles, or after one profile of a core).

use crate::cli::{PushArgs, Server};
use crate::error::{Error, Result};
use crate::pprof;
use crate::stacks;
use base64::Engine as _;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The labels every series gets before the user's.
const PROFILE_NAME: &str = "memory";

/// Allocation totals per stack at the last accepted push: the base of the next deltas.
type Totals = HashMap<u32, (u64, u64)>;

/// The request body for `server`: one series with one gzipped pprof profile.
pub fn body(
    server: Server,
    profile: &[u8],
    service: &str,
    labels: &[(String, String)],
    id: &str,
) -> String {
    let mut pairs = vec![
        serde_json::json!({"name": "__name__", "value": PROFILE_NAME}),
        serde_json::json!({"name": "service_name", "value": service}),
    ];
    pairs.extend(
        labels
            .iter()
            .map(|(n, v)| serde_json::json!({"name": n, "value": v})),
    );
    let raw = base64::engine::general_purpose::STANDARD.encode(profile);
    match server {
        Server::Pyroscope => serde_json::json!({
            "series": [{"labels": pairs, "samples": [{"rawProfile": raw, "ID": id}]}]
        }),
        Server::Parca => serde_json::json!({
            "series": [{"labels": {"labels": pairs}, "samples": [{"rawProfile": raw}]}],
            "normalized": false
        }),
    }
    .to_string()
}

/// Replaces each stack's allocation totals by what was allocated since `base`; the new
/// totals.
fn deltas(profile: &mut stacks::Profile, base: &Totals) -> Totals {
    let mut now = Totals::new();
    for s in &mut profile.stacks {
        let c = &mut s.counts;
        now.insert(s.id, (c.total_blocks, c.total_bytes));
        let (blocks, bytes) = base.get(&s.id).copied().unwrap_or_default();
        c.total_blocks = c.total_blocks.saturating_sub(blocks);
        c.total_bytes = c.total_bytes.saturating_sub(bytes);
    }
    now
}

/// Sends `body`, retrying with doubling waits until `deadline`; whether it was accepted.
fn send(agent: &ureq::Agent, url: &str, body: &str, deadline: Instant) -> bool {
    let mut wait = Duration::from_secs(1);
    loop {
        let outcome = agent
            .post(url)
            .set("Content-Type", "application/json")
            .send_string(body);
        let why = match outcome {
            Ok(_) => return true,
            Err(ureq::Error::Status(code, response)) => {
                let text = response.into_string().unwrap_or_default();
                let text = text.lines().next().unwrap_or("").chars().take(200);
                format!("HTTP {code}: {}", text.collect::<String>())
            }
            Err(ureq::Error::Transport(t)) => transport_text(&t),
        };
        let now = Instant::now();
        if now + wait >= deadline {
            eprintln!("mem-trace: push to {url} failed ({why}); giving this profile up, its allocations go into the next");
            return false;
        }
        eprintln!(
            "mem-trace: push to {url} failed ({why}); retrying in {} s",
            wait.as_secs()
        );
        std::thread::sleep(wait);
        wait *= 2;
    }
}

/// A transport failure in one line: its kind, message and cause, without the URL (said
/// already).
fn transport_text(t: &ureq::Transport) -> String {
    let mut text = t.kind().to_string();
    if let Some(m) = t.message() {
        text = format!("{text}: {m}");
    }
    if let Some(cause) = std::error::Error::source(t) {
        text = format!("{text}: {cause}");
    }
    text.replace('\n', " ")
}

/// The process behind a pid target is gone.
fn gone(args: &PushArgs) -> bool {
    match args.target.source() {
        mem_trace_read::target::Source::Pid(pid) => {
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
        }
        mem_trace_read::target::Source::Core { .. } => false,
    }
}

/// `mem-trace push TARGET --url URL`: the number of profiles the server accepted decides
/// the exit status (1 when none was).
pub fn command(args: &PushArgs) -> Result<u8> {
    let (made, accepted) = pushes(args, &Control::default(), Duration::ZERO)?;
    let url = endpoint(args.server, &args.url);
    eprintln!("mem-trace: push: {accepted} of {made} profiles accepted by {url}");
    if accepted == 0 {
        return Err(Error::new(format!("no profile reached {url}")));
    }
    Ok(0)
}

/// The ingestion endpoint of `server` under its base URL.
fn endpoint(server: Server, base: &str) -> String {
    let path = match server {
        Server::Pyroscope => "push.v1.PusherService/Push",
        Server::Parca => "profiles/writeraw",
    };
    format!("{}/{path}", base.trim_end_matches('/'))
}

/// How `mem-trace run` steers its push loop: stop, or push once more and then stop (its
/// program is held at the end of `exit`, its tables final: the allocations since the last
/// push would otherwise never be sent).
#[derive(Default)]
pub struct Control {
    stop: AtomicBool,
    last: AtomicBool,
    last_done: AtomicBool,
    last_made: AtomicBool,
}

impl Control {
    /// Ends the loop without another push.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Asks for one last push now, and waits until it was made (or failed, or the loop had
    /// ended), at most `within`; whether it was.
    pub fn last_push(&self, within: Duration) -> bool {
        self.last.store(true, Ordering::Relaxed);
        let until = Instant::now() + within;
        while !self.last_done.load(Ordering::Relaxed) {
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    /// Whether a last push was made (accepted or not).
    pub fn last_made(&self) -> bool {
        self.last_made.load(Ordering::Relaxed)
    }

    /// Whether the loop should stop waiting: stopped, or a last push asked for.
    fn waking(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || self.last.load(Ordering::Relaxed)
    }
}

/// Says that the loop has ended, whichever way it does (`Control::last_push` waits on it).
struct Ended<'a>(&'a AtomicBool);

impl Drop for Ended<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// How long a last push may take, retries included: its process waits at exit meanwhile.
const LAST_PUSH_WITHIN: Duration = Duration::from_secs(5);

/// Waits until `until`, or less once `control` says so (checked every 50 ms).
fn wait_until(until: Instant, control: &Control) {
    while !control.waking() {
        let now = Instant::now();
        if now >= until {
            return;
        }
        std::thread::sleep((until - now).min(Duration::from_millis(50)));
    }
}

/// Pushes `args`' target at each interval, the first after `first`, until it ends,
/// `--count` is reached or `control` stops it (after a last push, if asked for one); the
/// profiles made and accepted.
pub fn pushes(args: &PushArgs, control: &Control, first: Duration) -> Result<(u64, u64)> {
    let _ended = Ended(&control.last_done);
    let stop = &control.stop;
    wait_until(Instant::now() + first, control);
    if stop.load(Ordering::Relaxed) {
        return Ok((0, 0));
    }
    let url = endpoint(args.server, &args.url);
    let timeout = Duration::from_secs_f64(args.timeout);
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(timeout)
        .timeout(timeout)
        .build();
    let every = Duration::from_secs_f64(args.every);
    let mut base = Totals::new();
    let (mut made, mut accepted) = (0u64, 0u64);
    loop {
        let started = Instant::now();
        let last = control.last.load(Ordering::Relaxed);
        let target = match args.target.open() {
            Ok(t) => t,
            Err(_) if (made > 0 || stop.load(Ordering::Relaxed)) && gone(args) => break,
            Err(e) => return Err(e),
        };
        let service = args
            .service
            .clone()
            .unwrap_or_else(|| service_name(&target));
        let mut profile = match stacks::read(&target, None) {
            Ok(p) => p,
            Err(_) if (made > 0 || stop.load(Ordering::Relaxed)) && gone(args) => break,
            Err(e) => return Err(e),
        };
        let threads = pprof::thread_shares(&target, &profile).unwrap_or_default();
        let totals = deltas(&mut profile, &base);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let comment = format!("mem-trace heap profile of {}", target.name());
        let encoded = pprof::encode(&pprof::document(
            &profile,
            &threads,
            &pprof::modules(&target),
            i64::try_from(now.as_nanos()).unwrap_or(i64::MAX),
            &comment,
        ));
        made += 1;
        control.last_made.store(last, Ordering::Relaxed);
        let id = format!("{:x}-{:x}-{made}", std::process::id(), now.as_nanos());
        let request = body(args.server, &encoded, &service, &args.labels, &id);
        let deadline = started + if last { LAST_PUSH_WITHIN } else { every };
        if send(&agent, &url, &request, deadline) {
            accepted += 1;
            base = totals;
        }
        if last || !target.is_live() || (args.count != 0 && made >= args.count) {
            break;
        }
        wait_until(started + every, control);
        if stop.load(Ordering::Relaxed) {
            break;
        }
    }
    Ok((made, accepted))
}

/// The service a profile is filed under by default: the executable's file name.
fn service_name(target: &mem_trace_read::target::Target) -> String {
    target
        .command()
        .and_then(|c| c.split_whitespace().next())
        .and_then(|exe| exe.rsplit('/').next())
        .filter(|s| !s.is_empty())
        .unwrap_or("mem-trace")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `server`'s body for a profile of three bytes, labels host=h1, service api, ID id7:
    /// the parsed body, after checking the labels (in `labels` of the series) and the
    /// profile every server gets.
    fn checked_body(server: Server, labels_at: &[&str]) -> serde_json::Value {
        let labels = [("host".to_string(), "h1".to_string())];
        let text = body(server, b"\x1f\x8b\x08abc", "api", &labels, "id7");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let series = &v["series"][0];
        let list = labels_at.iter().fold(&series["labels"], |v, k| &v[*k]);
        let pairs: Vec<(&str, &str)> = list
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["name"].as_str().unwrap(), p["value"].as_str().unwrap()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("__name__", "memory"),
                ("service_name", "api"),
                ("host", "h1")
            ]
        );
        let raw = series["samples"][0]["rawProfile"].as_str().unwrap();
        assert_eq!(
            base64::engine::general_purpose::STANDARD
                .decode(raw)
                .unwrap(),
            b"\x1f\x8b\x08abc"
        );
        v
    }

    #[test]
    fn the_body_is_one_series_with_the_profile_in_base64() {
        let v = checked_body(Server::Pyroscope, &[]);
        assert_eq!(v["series"][0]["samples"][0]["ID"], "id7");
    }

    #[test]
    fn parca_gets_a_label_set_and_addresses_to_normalize() {
        let v = checked_body(Server::Parca, &["labels"]);
        assert_eq!(v["normalized"], false);
        assert_eq!(
            endpoint(Server::Parca, "http://parca:7070/"),
            "http://parca:7070/profiles/writeraw"
        );
        assert_eq!(
            endpoint(Server::Pyroscope, "http://p:4040"),
            "http://p:4040/push.v1.PusherService/Push"
        );
    }

    #[test]
    fn allocations_are_deltas_since_the_last_accepted_push() {
        use mem_trace_format::Counts;
        let stack = |id, blocks, bytes, live| stacks::Stack {
            id,
            counts: Counts {
                total_blocks: blocks,
                total_bytes: bytes,
                live_bytes: live,
                ..Counts::default()
            },
            frames: vec![],
        };
        let mut p = stacks::Profile {
            stacks: vec![stack(1, 10, 1000, 500), stack(2, 1, 8, 8)],
            ..stacks::Profile::default()
        };
        let base = Totals::from([(1, (4, 400))]);
        let now = deltas(&mut p, &base);
        assert_eq!(now, Totals::from([(1, (10, 1000)), (2, (1, 8))]));
        assert_eq!(
            (
                p.stacks[0].counts.total_blocks,
                p.stacks[0].counts.total_bytes
            ),
            (6, 600)
        );
        // In use stays absolute.
        assert_eq!(p.stacks[0].counts.live_bytes, 500);
        assert_eq!(p.stacks[1].counts.total_bytes, 8);
    }
}

//! `mem-trace push`: profiles of a running process reach a profiling server again and again,
//! with allocations as deltas, and the push survives a server that is down, one that never
//! answers and one that answers 500.
//!
//! No Pyroscope or Parca server can be installed here: the receiver is this test's own, on
//! 127.0.0.1. It implements the request Pyroscope documents for `POST
//! /push.v1.PusherService/Push` (Connect's JSON encoding: `series[].labels[]`,
//! `series[].samples[].rawProfile` in base64) and the one of Parca's `WriteRaw` through its
//! HTTP gateway, `POST /profiles/writeraw` (`series[].labels.labels[]`, the same samples,
//! `normalized`), and hands each profile to the real `go tool pprof`.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::pprof_sites::{self, go_pprof, top, Sites};
use common::{c_fixture, mem_trace_binary, Fixture};

/// What the receiver does with the next request.
#[derive(Clone, Copy, Debug)]
enum Reply {
    Accept,
    Fail500,
    /// Reads the request and never answers.
    Hang,
}

/// One request as received.
struct Received {
    path: String,
    body: String,
}

/// Serves `replies` in order on `listener`, one request a connection; sends each request on.
fn receiver(listener: TcpListener, replies: Vec<Reply>, tx: mpsc::Sender<Received>) {
    std::thread::spawn(move || {
        let mut hung = Vec::new();
        for reply in replies {
            let Ok((mut stream, _)) = listener.accept() else {
                return;
            };
            let Some(request) = read_request(&mut stream) else {
                continue;
            };
            match reply {
                Reply::Accept => respond(&mut stream, "200 OK", "{}"),
                Reply::Fail500 => {
                    respond(&mut stream, "500 Internal Server Error", "ingester down")
                }
                Reply::Hang => hung.push(stream),
            }
            let _ = tx.send(request);
        }
    });
}

fn read_request(stream: &mut TcpStream) -> Option<Received> {
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut first = String::new();
    reader.read_line(&mut first).ok()?;
    let path = first.split_whitespace().nth(1)?.to_string();
    let mut length = 0;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        if line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().ok()?;
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(Received {
        path,
        body: String::from_utf8(body).ok()?,
    })
}

fn respond(stream: &mut TcpStream, status: &str, body: &str) {
    let _ = write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// A request's labels and its profile written to `file`.
fn decode(request: &Received, file: &Path) -> Vec<(String, String)> {
    use base64::Engine as _;
    let v: serde_json::Value = serde_json::from_str(&request.body).expect("a JSON body");
    let series = &v["series"][0];
    let labels = match request.path.as_str() {
        "/push.v1.PusherService/Push" => &series["labels"],
        "/profiles/writeraw" => {
            // The locations hold the process's addresses, for Parca to normalize.
            assert_eq!(v["normalized"], false);
            &series["labels"]["labels"]
        }
        other => panic!("a request to {other}"),
    };
    let labels = labels
        .as_array()
        .expect("labels")
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["value"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let raw = series["samples"][0]["rawProfile"]
        .as_str()
        .expect("a profile");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(raw)
        .expect("base64");
    std::fs::write(file, bytes).expect("write the profile");
    labels
}

/// `go tool pprof -top -unit=B -sample_index=INDEX FILE`: flat bytes of `function`.
fn flat(fixture: &Fixture, file: &Path, index: &str, function: &str) -> u64 {
    let label = format!("{}.{index}", file.file_name().unwrap().to_string_lossy());
    let text = go_pprof(
        fixture,
        &label,
        &[
            "-top",
            "-unit=B",
            &format!("-sample_index={index}"),
            file.to_str().unwrap(),
        ],
    );
    pprof_sites::flat(&top(&text), function)
}

/// `mem-trace push` started in the background with `args` after the target.
fn push(fixture: &Fixture, pid: u32, args: &[&str], label: &str) -> Child {
    let log = std::fs::File::create(fixture.dir.join(format!("push.{label}.stderr"))).unwrap();
    Command::new(mem_trace_binary())
        .arg("push")
        .arg(pid.to_string())
        .args(args)
        .current_dir(&fixture.dir)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start mem-trace push")
}

fn wait(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let until = std::time::Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            std::time::Instant::now() < until,
            "mem-trace push did not end"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn profiles_reach_the_server_with_allocations_as_deltas() {
    let fixture = c_fixture("pprof_sites.c", &["-pthread"]);
    let mut sites = Sites::start(&fixture);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::channel();
    receiver(listener, vec![Reply::Accept; 3], tx);
    let mut child = push(
        &fixture,
        sites.pid,
        &[
            "--url",
            &url,
            "--every",
            "1",
            "--count",
            "3",
            "--service",
            "sites",
            "--label",
            "host=test-1",
        ],
        "deltas",
    );
    let mut files = Vec::new();
    for k in 0..3 {
        let request = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("a push within a minute");
        let file = fixture.dir.join(format!("pushed.{k}.pb.gz"));
        let labels = decode(&request, &file);
        assert_eq!(
            labels,
            [
                ("__name__".to_string(), "memory".to_string()),
                ("service_name".into(), "sites".into()),
                ("host".into(), "test-1".into()),
            ]
        );
        files.push(file);
        // Allocated between two pushes: the next profile's delta.
        sites.more();
    }
    assert!(wait(&mut child, Duration::from_secs(30)).success());
    let half = 512 << 10;
    // Allocations: everything up to the first push, then only what came since.
    assert_eq!(
        flat(&fixture, &files[0], "alloc_space", "site_live"),
        3 << 20
    );
    assert_eq!(flat(&fixture, &files[1], "alloc_space", "site_live"), 0);
    assert_eq!(flat(&fixture, &files[1], "alloc_space", "site_more"), half);
    assert_eq!(flat(&fixture, &files[2], "alloc_space", "site_more"), half);
    // In use: absolute, growing.
    assert_eq!(flat(&fixture, &files[1], "inuse_space", "site_more"), half);
    assert_eq!(
        flat(&fixture, &files[2], "inuse_space", "site_more"),
        2 * half
    );
    assert_eq!(
        flat(&fixture, &files[2], "inuse_space", "site_live"),
        3 << 20
    );
}

#[test]
fn parca_receives_the_same_profiles_through_writeraw() {
    let fixture = c_fixture("pprof_sites.c", &["-pthread"]);
    let mut sites = Sites::start(&fixture);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::channel();
    receiver(listener, vec![Reply::Accept; 2], tx);
    let mut child = push(
        &fixture,
        sites.pid,
        &[
            "--url", &url, "--server", "parca", "--every", "1", "--count", "2", "--label", "zone=b",
        ],
        "parca",
    );
    let mut files = Vec::new();
    for k in 0..2 {
        let request = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("a push within a minute");
        assert_eq!(request.path, "/profiles/writeraw");
        let file = fixture.dir.join(format!("parca.{k}.pb.gz"));
        let labels = decode(&request, &file);
        assert_eq!(labels[0], ("__name__".to_string(), "memory".to_string()));
        assert!(labels.contains(&("zone".to_string(), "b".to_string())));
        assert!(labels.iter().any(|(n, _)| n == "service_name"));
        files.push(file);
        sites.more();
    }
    assert!(wait(&mut child, Duration::from_secs(30)).success());
    assert_eq!(
        flat(&fixture, &files[0], "inuse_space", "site_live"),
        3 << 20
    );
    assert_eq!(flat(&fixture, &files[1], "alloc_space", "site_live"), 0);
    assert_eq!(
        flat(&fixture, &files[1], "alloc_space", "site_more"),
        512 << 10
    );
    let stderr =
        std::fs::read_to_string(fixture.dir.join("push.parca.stderr")).expect("push's stderr");
    assert!(
        stderr.contains(&format!(
            "2 of 2 profiles accepted by {url}/profiles/writeraw"
        )),
        "{stderr}"
    );
}

#[test]
fn a_server_down_failing_or_silent_is_survived() {
    let fixture = c_fixture("pprof_sites.c", &["-pthread"]);
    let mut sites = Sites::start(&fixture);
    // A port nobody listens on yet: the first attempts are refused.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let mut child = push(
        &fixture,
        sites.pid,
        &[
            "--url",
            &url,
            "--every",
            "3",
            "--timeout",
            "1",
            "--count",
            "3",
        ],
        "failures",
    );
    std::thread::sleep(Duration::from_millis(500));
    let listener = TcpListener::bind(("127.0.0.1", port)).expect("the port again");
    let (tx, rx) = mpsc::channel();
    receiver(
        listener,
        vec![Reply::Fail500, Reply::Hang, Reply::Accept, Reply::Accept],
        tx,
    );
    let status = wait(&mut child, Duration::from_secs(60));
    let stderr =
        std::fs::read_to_string(fixture.dir.join("push.failures.stderr")).expect("push's stderr");
    assert!(status.success(), "{status:?}\n{stderr}");
    for expected in [
        "Connection refused",
        "HTTP 500: ingester down",
        "timed out",
        "retrying in 1 s",
        "giving this profile up",
        "2 of 3 profiles accepted",
    ] {
        assert!(stderr.contains(expected), "{expected:?} not in:\n{stderr}");
    }
    // Every failure is one line; the program went on untouched.
    assert!(
        stderr.lines().all(|l| l.starts_with("mem-trace: push")),
        "{stderr}"
    );
    sites.more();
    let received: Vec<Received> = rx.try_iter().collect();
    assert_eq!(received.len(), 4);
    // The first accepted profile carries every allocation so far: nothing was accepted
    // before it.
    let file = fixture.dir.join("after-failures.pb.gz");
    decode(&received[2], &file);
    assert_eq!(flat(&fixture, &file, "alloc_space", "site_live"), 3 << 20);
}

#[test]
fn the_push_ends_when_the_process_does() {
    let fixture = c_fixture("pprof_sites.c", &["-pthread"]);
    let sites = Sites::start(&fixture);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::channel();
    receiver(listener, vec![Reply::Accept; 100], tx);
    let mut child = push(
        &fixture,
        sites.pid,
        &["--url", &url, "--every", "0.5"],
        "ends",
    );
    rx.recv_timeout(Duration::from_secs(60))
        .expect("a first push");
    drop(sites);
    let status = wait(&mut child, Duration::from_secs(30));
    assert!(status.success(), "{status:?}");
}

#[test]
fn run_pushes_its_program_while_it_runs() {
    let fixture = c_fixture("pprof_sites.c", &["-pthread"]);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::channel();
    receiver(listener, vec![Reply::Accept; 100], tx);
    let out_dir = fixture.dir.join("run-push");
    let _ = std::fs::remove_dir_all(&out_dir);
    let mut child = Command::new(mem_trace_binary())
        .args([
            "run",
            "--push",
            &url,
            "--push-every",
            "0.5",
            "--push-service",
            "sites",
        ])
        .args(["--push-label", "host=h1", "-o"])
        .arg(&out_dir)
        .arg(&fixture.bin)
        .current_dir(&fixture.dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start mem-trace run");
    // Two pushes while the program waits on its input, then its end.
    let first = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("a first push");
    rx.recv_timeout(Duration::from_secs(60))
        .expect("a second push");
    // 512 KiB more from site_more, then the end of input: the program exits, and is held at
    // the end of `exit` for a last push, which carries it whatever the interval.
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"more\n").unwrap();
    }
    let status = wait(&mut child, Duration::from_secs(60));
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(status.success(), "{status:?}\n{stderr}");
    let labels = decode(&first, &fixture.dir.join("run-push.pb.gz"));
    assert!(labels.contains(&("service_name".to_string(), "sites".to_string())));
    assert!(labels.contains(&("host".to_string(), "h1".to_string())));
    assert_eq!(
        flat(
            &fixture,
            &fixture.dir.join("run-push.pb.gz"),
            "inuse_space",
            "site_live"
        ),
        3 << 20
    );
    assert!(stderr.contains("profiles accepted by"), "{stderr}");
    assert!(
        stderr.contains("the last one as the program exited"),
        "{stderr}"
    );
    let last = rx.try_iter().last().expect("a last push");
    let file = fixture.dir.join("run-push-last.pb.gz");
    decode(&last, &file);
    assert_eq!(flat(&fixture, &file, "inuse_space", "site_more"), 512 << 10);
    assert_eq!(flat(&fixture, &file, "inuse_space", "site_live"), 3 << 20);
}

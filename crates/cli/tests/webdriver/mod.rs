//! Just enough of the W3C WebDriver protocol to drive headless Chromium through Debian's
//! `chromedriver`: start a session, open a page, hand a file to an `<input type=file>`, and read
//! the page's text. HTTP/1.1 over `std::net::TcpStream`, JSON with `serde_json`.
//!
//! Everything is bounded: chromedriver must answer its status within [`START_LIMIT`], each
//! request within [`REQUEST_LIMIT`]; chromedriver and the browser it starts run in a process
//! group of their own, killed when the [`Browser`] is dropped (even when a test panics).
//! chromium or chromedriver missing is a failure, not a skip: `.ci/run` installs both.

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long chromedriver may take to listen.
const START_LIMIT: Duration = Duration::from_secs(30);
/// How long one request may take (opening a session starts the browser).
const REQUEST_LIMIT: Duration = Duration::from_secs(60);
/// The W3C key of an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A headless Chromium session.
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session.
    pub fn start() -> Browser {
        let port = free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run chromedriver ({e}): install chromium and chromium-driver")
            });
        let mut browser = Browser {
            driver,
            port,
            session: String::new(),
        };
        let started = Instant::now();
        while browser.request("GET", "/status", None).is_err() {
            assert!(
                started.elapsed() < START_LIMIT,
                "chromedriver did not listen on port {port} within {START_LIMIT:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                // As root in a container: no sandbox; /dev/shm may be small.
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--lang=en-US"]
            }
        }}});
        let v = browser
            .request("POST", "/session", Some(&caps))
            .unwrap_or_else(|e| panic!("cannot start a chromium session: {e}"));
        browser.session = v["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session id in {v}"))
            .to_string();
        browser
    }

    /// Opens `url`.
    pub fn open(&self, url: &str) {
        self.command("POST", "url", json!({ "url": url }));
    }

    /// Hands the local file `path` to the page's `<input type=file>` (as choosing it in the
    /// file dialog would, firing its change event).
    pub fn choose_file(&self, path: &str) {
        let v = self.command(
            "POST",
            "element",
            json!({"using": "css selector", "value": "input[type=file]"}),
        );
        let id = v[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("no file input on the page: {v}"))
            .to_string();
        self.command(
            "POST",
            &format!("element/{id}/value"),
            json!({ "text": path }),
        );
    }

    /// The page's visible text.
    pub fn text(&self) -> String {
        let v = self.command(
            "POST",
            "execute/sync",
            json!({"script": "return document.body.innerText;", "args": []}),
        );
        v.as_str().unwrap_or_default().to_string()
    }

    /// Polls the page's text until `done` says so or `limit` passes; the last text either way.
    pub fn text_when(&self, limit: Duration, done: impl Fn(&str) -> bool) -> String {
        let started = Instant::now();
        loop {
            let text = self.text();
            if done(&text) || started.elapsed() > limit {
                return text;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A command of this session; its `value`. Panics with the driver's error.
    fn command(&self, method: &str, path: &str, body: Value) -> Value {
        let path = format!("/session/{}/{path}", self.session);
        match self.request(method, &path, Some(&body)) {
            Ok(v) => v["value"].clone(),
            Err(e) => panic!("webdriver {method} {path}: {e}"),
        }
    }

    /// One HTTP request to chromedriver; the JSON answer, or why not.
    fn request(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(REQUEST_LIMIT))
            .map_err(|e| e.to_string())?;
        let body = body.map(Value::to_string).unwrap_or_default();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.port,
            body.len()
        );
        s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
        // chromedriver keeps the connection open whatever `Connection: close` says: the
        // answer ends where its length (or its last chunk) says.
        let (head, body) = read_answer(&mut s)?;
        let status = head.split_whitespace().nth(1).unwrap_or("");
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        if status != "200" {
            return Err(format!("HTTP {status}: {v}"));
        }
        Ok(v)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.request("DELETE", &format!("/session/{}", self.session), None);
        }
        // SAFETY: signals the process group this test started (chromedriver and its browser).
        unsafe { libc::kill(-(self.driver.id() as i32), libc::SIGKILL) };
        let _ = self.driver.wait();
    }
}

/// A port nothing listens on right now.
fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a local port");
    l.local_addr().expect("local address").port()
}

/// An HTTP answer's head and body, read up to the end its head announces.
fn read_answer(s: &mut TcpStream) -> Result<(String, String), String> {
    let mut raw: Vec<u8> = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let text = String::from_utf8_lossy(&raw).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let lower = head.to_ascii_lowercase();
            let length = lower
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|n| n.trim().parse::<usize>().ok());
            match length {
                Some(n) if body.len() >= n => return Ok((head.into(), body[..n].into())),
                None if lower.contains("transfer-encoding: chunked") => {
                    if let Some(body) = dechunk(body) {
                        return Ok((head.into(), body));
                    }
                }
                _ => {}
            }
        }
        let n = s.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err(format!(
                "the connection closed mid-answer: {}",
                String::from_utf8_lossy(&raw)
            ));
        }
        raw.extend_from_slice(&buf[..n]);
    }
}

/// The body of a chunked HTTP answer, once its last (empty) chunk has arrived.
fn dechunk(mut body: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n")?;
        let n = usize::from_str_radix(size.trim(), 16).ok()?;
        if n == 0 {
            return Some(out);
        }
        if rest.len() < n + 2 {
            return None;
        }
        out.push_str(&rest[..n]);
        body = &rest[n + 2..];
    }
}

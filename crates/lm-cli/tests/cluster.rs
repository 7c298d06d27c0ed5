//! Two `lm-cli serve` replicas on SmolLM2 behind nginx, configured by
//! deploy/nginx.conf as `cargo xtask serve-cluster` runs it: 8 chats of 6
//! turns, each request with its session's `X-Session-Id`, stay on the
//! replica that served their first turn and read their history from its
//! prefix cache (>= 90% of the prompt tokens of turns 2-6, from each
//! replica's `/metrics`); then one replica is killed (SIGKILL) while the
//! chats go on, and its sessions move to the other with no failed request
//! beyond the one each had in flight.
//!
//! Requests go as HTTP/1.0 with `Connection: close`, so nginx answers with
//! the whole body and closes (no chunked encoding to undo); nginx's
//! `X-Upstream` header names the replica that answered.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lm_model::catalog::SMOLLM2;
use serde_json::{Value, json};

use crate::common::Cli;

const N_SESSIONS: usize = 8;
const N_TURNS: usize = 6;
/// Turns each session takes after the first six, while a replica dies.
const N_LATER_TURNS: usize = 4;

/// A long system prompt, as real deployments send: it makes a turn's new
/// text (the last answer's end and the next question) small next to the
/// history the cache holds.
fn system_prompt() -> String {
    (1..=20)
        .map(|i| format!("Rule {i}: answer briefly and politely, and never repeat rule {i}."))
        .collect::<Vec<_>>()
        .join(" ")
}

/// nginx's binary, or a panic naming the install command.
fn nginx_binary() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join("nginx"))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| panic!("nginx not found; install it with `apt-get install -y nginx`"))
}

/// A replica: an `lm-cli serve` child and its address.
struct Replica {
    child: Child,
    addr: SocketAddr,
}

impl Replica {
    fn start() -> Self {
        let (child, addr) = Cli::new("serve")
            .model("smollm2")
            .opt("--parallel", 4)
            .opt("--threads", 1)
            .spawn_server();
        let addr = addr
            .parse()
            .unwrap_or_else(|_| panic!("not an address: {addr}"));
        Self { child, addr }
    }

    /// A counter of its `/metrics`.
    fn metric(&self, name: &str) -> f64 {
        let (status, _, body) = exchange(self.addr, "GET", "/metrics", &[], "");
        assert_eq!(status, 200, "{body}");
        body.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {body}"))
    }

    /// (prefix-cache hit tokens, prompt tokens) so far.
    fn cache_counts(&self) -> (f64, f64) {
        (
            self.metric("lm_prefix_cache_hit_tokens_total"),
            self.metric("lm_prompt_tokens_total"),
        )
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// nginx in the foreground, stopped (with its workers) when dropped.
struct Nginx {
    child: Child,
    listen: SocketAddr,
    prefix: tempfile::TempDir,
}

impl Nginx {
    /// deploy/nginx.conf, its placeholders filled as `cargo xtask
    /// serve-cluster` fills them, in a temporary prefix.
    fn start(replicas: &[SocketAddr]) -> Self {
        let binary = nginx_binary();
        let template = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/nginx.conf");
        let template = std::fs::read_to_string(template).unwrap();
        let prefix = tempfile::tempdir().unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let listen = SocketAddr::from(([127, 0, 0, 1], port));
        let servers = replicas
            .iter()
            .map(|addr| format!("server {addr} max_fails=1 fail_timeout=5s;"))
            .collect::<Vec<_>>()
            .join("\n        ");
        let conf = template
            .replace("@PREFIX@", &prefix.path().display().to_string())
            .replace("@LISTEN@", &listen.to_string())
            .replace("@SERVERS@", &servers);
        let conf_path = prefix.path().join("nginx.conf");
        std::fs::write(&conf_path, conf).unwrap();
        let mut child = Command::new(binary)
            .arg("-p")
            .arg(prefix.path())
            .arg("-c")
            .arg(&conf_path)
            .arg("-e")
            .arg(prefix.path().join("error.log"))
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(listen).is_err() {
            if let Some(status) = child.try_wait().unwrap() {
                let log = std::fs::read_to_string(prefix.path().join("error.log"));
                panic!("nginx exited at start ({status}): {log:?}");
            }
            assert!(
                Instant::now() < deadline,
                "nginx did not listen on {listen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            listen,
            prefix,
        }
    }
}

impl Nginx {
    /// What nginx logged, for a failure's message.
    fn error_log(&self) -> String {
        std::fs::read_to_string(self.prefix.path().join("error.log")).unwrap_or_default()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGKILL would leave the workers running: ask the master to stop.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.0 exchange: (status, headers lowercased, body); status 0
/// when the connection failed or closed without an answer.
fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, BTreeMap<String, String>, String) {
    let Ok(mut stream) = TcpStream::connect(addr) else {
        return (0, BTreeMap::new(), String::new());
    };
    let headers: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    let request = format!(
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n{headers}\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut response = String::new();
    if stream.write_all(request.as_bytes()).is_err()
        || stream.read_to_string(&mut response).is_err()
    {
        return (0, BTreeMap::new(), String::new());
    }
    let Some((head, body)) = response.split_once("\r\n\r\n") else {
        return (0, BTreeMap::new(), response);
    };
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    (status, headers, body.to_owned())
}

/// Session ids for which nginx picks each replica in turn (found by
/// asking it: `GET /health` with the id, read `X-Upstream`), so both
/// replicas hold sessions whatever ports they got (the ring's points hash
/// the servers' addresses).
fn session_ids(nginx: &Nginx, replicas: &[SocketAddr]) -> Vec<String> {
    let mut by_replica: Vec<Vec<String>> = vec![Vec::new(); replicas.len()];
    for idx in 0..1000 {
        let id = format!("session-{idx}");
        let (status, headers, _) =
            exchange(nginx.listen, "GET", "/health", &[("X-Session-Id", &id)], "");
        assert_eq!(status, 200, "{}", nginx.error_log());
        let by: SocketAddr = headers["x-upstream"].parse().unwrap();
        let slot = replicas.iter().position(|r| *r == by).unwrap();
        if by_replica[slot].len() < N_SESSIONS / replicas.len() {
            by_replica[slot].push(id);
        }
        if by_replica
            .iter()
            .all(|ids| ids.len() == N_SESSIONS / replicas.len())
        {
            break;
        }
    }
    (0..N_SESSIONS / replicas.len())
        .flat_map(|turn| by_replica.iter().map(move |ids| ids[turn].clone()))
        .collect()
}

/// A chat session: its id and its messages so far.
struct Session {
    id: String,
    messages: Vec<Value>,
}

/// What one turn got: the replica that answered (nginx's last try), or
/// the status of a failure.
#[derive(Debug, Clone, PartialEq)]
enum Turn {
    Answered { by: SocketAddr, started: Instant },
    Failed { status: u16, started: Instant },
}

impl Session {
    fn new(id: String, system: &str) -> Self {
        Self {
            id,
            messages: vec![json!({"role": "system", "content": system})],
        }
    }

    /// Sends the next question through nginx; on success the answer joins
    /// the history, as a chat client keeps it.
    fn turn(&mut self, nginx: SocketAddr) -> Turn {
        let n = self.messages.len() / 2 + 1;
        self.messages.push(json!({
            "role": "user",
            "content": format!("Question {n}: name one colour of the rainbow."),
        }));
        let body = json!({"messages": self.messages, "max_tokens": 8, "temperature": 0});
        let started = Instant::now();
        let (status, headers, body) = exchange(
            nginx,
            "POST",
            "/v1/chat/completions",
            &[("X-Session-Id", &self.id)],
            &body.to_string(),
        );
        if status != 200 {
            self.messages.pop();
            return Turn::Failed { status, started };
        }
        let answer: Value = serde_json::from_str(&body).unwrap();
        let content = answer["choices"][0]["message"]["content"].as_str().unwrap();
        self.messages
            .push(json!({"role": "assistant", "content": content}));
        let upstream = &headers["x-upstream"];
        // After a retry nginx lists every replica it tried: the last answered.
        let by = upstream.rsplit(", ").next().unwrap().parse().unwrap();
        Turn::Answered { by, started }
    }
}

/// Runs `f` on every session at once, one thread each.
fn on_each<T: Send>(
    sessions: &mut [Session],
    f: impl Fn(usize, &mut Session) -> T + Sync,
) -> Vec<T> {
    std::thread::scope(|scope| {
        let f = &f;
        let handles: Vec<_> = sessions
            .iter_mut()
            .enumerate()
            .map(|(idx, session)| scope.spawn(move || f(idx, session)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
#[ignore = "needs SmolLM2 and nginx: cargo xtask fetch-model smollm2; apt-get install -y nginx"]
fn sessions_stay_on_their_replica_and_move_when_it_dies() {
    if let Err(err) = SMOLLM2.path() {
        panic!("{err}");
    }
    nginx_binary();
    let mut replicas = vec![Replica::start(), Replica::start()];
    let addrs: Vec<SocketAddr> = replicas.iter().map(|r| r.addr).collect();
    let nginx = Nginx::start(&addrs);
    let system = system_prompt();
    let ids = session_ids(&nginx, &addrs);
    let mut sessions: Vec<Session> = ids
        .into_iter()
        .map(|id| Session::new(id, &system))
        .collect();

    // Turn 1 of every session, then the counters, then turns 2-6.
    let first = on_each(&mut sessions, |_, s| s.turn(nginx.listen));
    let home: Vec<SocketAddr> = first
        .iter()
        .map(|turn| match turn {
            Turn::Answered { by, .. } => *by,
            failed => panic!("turn 1 failed: {failed:?}"),
        })
        .collect();
    for (idx, (by, probed)) in home.iter().zip(&addrs.repeat(N_SESSIONS / 2)).enumerate() {
        assert_eq!(by, probed, "session {idx}: {}", nginx.error_log());
    }
    let before: Vec<(f64, f64)> = replicas.iter().map(Replica::cache_counts).collect();
    let later = on_each(&mut sessions, |idx, s| {
        (1..N_TURNS)
            .map(|_| s.turn(nginx.listen))
            .map(|turn| match turn {
                Turn::Answered { by, .. } => by,
                failed => panic!("session {idx}: {failed:?}"),
            })
            .collect::<Vec<_>>()
    });
    for (idx, served) in later.iter().enumerate() {
        assert!(
            served.iter().all(|by| *by == home[idx]),
            "session {idx} left {}: {served:?}",
            home[idx]
        );
    }
    for (replica, (hits_before, prompt_before)) in replicas.iter().zip(&before) {
        let (hits, prompt) = replica.cache_counts();
        let (hits, prompt) = (hits - hits_before, prompt - prompt_before);
        let n_sessions = home.iter().filter(|h| **h == replica.addr).count();
        assert!(prompt > 0.0, "{} served no later turn", replica.addr);
        assert!(
            hits >= 0.9 * prompt,
            "{}: turns 2-6 of its {n_sessions} sessions read {hits} of {prompt} prompt tokens \
             from the prefix cache ({:.1}%)",
            replica.addr,
            100.0 * hits / prompt
        );
        eprintln!(
            "{}: {n_sessions} sessions, turns 2-6: {hits} of {prompt} prompt tokens from the cache ({:.1}%)",
            replica.addr,
            100.0 * hits / prompt
        );
    }

    // The chats go on; once 8 later turns are answered, replica 0 dies.
    let done = AtomicUsize::new(0);
    let killed_at: Mutex<Option<Instant>> = Mutex::new(None);
    let victim = Mutex::new(replicas.remove(0));
    let (dead, survivor) = (addrs[0], addrs[1]);
    let turns = std::thread::scope(|scope| {
        let killer = scope.spawn(|| {
            while done.load(Ordering::SeqCst) < N_SESSIONS {
                std::thread::sleep(Duration::from_millis(5));
            }
            victim.lock().unwrap().child.kill().unwrap();
            *killed_at.lock().unwrap() = Some(Instant::now());
        });
        let turns = on_each(&mut sessions, |_, s| {
            let mut turns = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(60);
            while turns
                .iter()
                .filter(|t| matches!(t, Turn::Answered { .. }))
                .count()
                < N_LATER_TURNS
            {
                assert!(Instant::now() < deadline, "no progress: {turns:?}");
                let turn = s.turn(nginx.listen);
                if matches!(turn, Turn::Answered { .. }) {
                    done.fetch_add(1, Ordering::SeqCst);
                }
                turns.push(turn);
            }
            turns
        });
        killer.join().unwrap();
        turns
    });
    let killed_at = killed_at
        .into_inner()
        .unwrap()
        .expect("the replica was killed");
    let mut n_failed = 0;
    for (idx, turns) in turns.iter().enumerate() {
        let failed: Vec<&Turn> = turns
            .iter()
            .filter(|t| matches!(t, Turn::Failed { .. }))
            .collect();
        n_failed += failed.len();
        // At most the request in flight when the replica died fails, and
        // only on a session that lived there.
        assert!(failed.len() <= 1, "session {idx}: {turns:?}");
        if let Some(Turn::Failed { started, .. }) = failed.first() {
            assert_eq!(home[idx], dead, "session {idx} failed off the dead replica");
            assert!(*started < killed_at, "session {idx} failed after the kill");
        }
        if home[idx] == dead {
            let moved = turns.iter().any(
                |t| matches!(t, Turn::Answered { by, started } if *started > killed_at && *by == survivor),
            );
            assert!(
                moved,
                "session {idx} was not answered after the kill: {turns:?}"
            );
        }
        for turn in turns {
            if let Turn::Answered { by, started } = turn {
                let expected = if *started > killed_at {
                    survivor
                } else {
                    home[idx]
                };
                if *started > killed_at || home[idx] == survivor {
                    assert_eq!(*by, expected, "session {idx}: {turns:?}");
                }
            }
        }
    }
    let moved = home.iter().filter(|h| **h == dead).count();
    eprintln!(
        "replica {dead} killed: its {moved} sessions moved to {survivor}, {n_failed} requests failed"
    );
    assert!(n_failed <= moved);
}

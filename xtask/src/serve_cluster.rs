//! `cargo xtask serve-cluster --replicas N [--model M] [--port P]`: N
//! `lm-cli serve` replicas on free loopback ports behind nginx, which routes
//! each `X-Session-Id` to one replica (deploy/nginx.conf), until Ctrl-C.
//!
//! ```text
//! client ──> nginx 127.0.0.1:P ──hash(X-Session-Id)──> replica 0 127.0.0.1:free
//!            (prefix, logs, pid      (no id: round    > replica 1 127.0.0.1:free
//!             in a temp dir)          robin)           > ...
//! ```
//!
//! The replica helpers ([`lm_cli`], [`Replica`]) are shared with the soak
//! task, which drives one replica without nginx.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::project_root;

pub(crate) const USAGE: &str = "\
usage: cargo xtask serve-cluster [--replicas N (2)] [--model M (smollm2)] [--port P (8080; 0: a free one)]
                                 [-- more lm-cli serve options]
starts N `lm-cli serve` replicas on free loopback ports and nginx in front (deploy/nginx.conf:
X-Session-Id picks the replica), prints nginx's address and stops everything on Ctrl-C";

/// The command that installs nginx, named when it is missing.
pub(crate) const NGINX_INSTALL: &str = "apt-get install -y nginx";

/// How long a replica may take to load its model and answer `/health`.
const START_TIMEOUT: Duration = Duration::from_secs(180);

/// Runs the task.
pub(crate) fn run(args: &[String]) -> Result<()> {
    let (mut n_replicas, mut model, mut port) = (2usize, "smollm2".to_owned(), 8080u16);
    let mut serve_args = Vec::new();
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        if flag == "--" {
            serve_args.extend(args.by_ref().cloned());
            break;
        }
        let value = args
            .next()
            .with_context(|| format!("{flag} needs a value\n{USAGE}"))?;
        match flag.as_str() {
            "--replicas" => n_replicas = parse_number(flag, value)?,
            "--model" => model.clone_from(value),
            "--port" => port = parse_number(flag, value)?,
            other => bail!("unknown option `{other}`\n{USAGE}"),
        }
    }
    if n_replicas == 0 {
        bail!("--replicas must be at least 1");
    }
    let nginx = nginx_binary()?;
    let lm_cli = lm_cli()?;
    let dir = tempfile::Builder::new()
        .prefix("lm-cluster-")
        .tempdir()
        .context("cannot make a temporary directory for nginx")?;
    let mut replicas = Vec::new();
    for idx in 0..n_replicas {
        let mut command = Command::new(&lm_cli);
        command
            .args(["serve", "--model", &model, "--port", "0"])
            .args(&serve_args);
        replicas.push(Replica::start(command, &format!("replica {idx}"), true)?);
    }
    for replica in &replicas {
        replica.wait_healthy(START_TIMEOUT)?;
    }
    let listen = if port == 0 { free_port()? } else { port };
    let listen = SocketAddr::from(([127, 0, 0, 1], listen));
    let addrs: Vec<SocketAddr> = replicas.iter().map(|r| r.addr).collect();
    let mut front = start_nginx(&nginx, dir.path(), listen, &addrs)?;
    println!(
        "cluster on http://{listen} (nginx, pid {}), replicas: {}; Ctrl-C stops",
        front.id(),
        addrs
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    let (stop_tx, stop_rx) = std::sync::mpsc::channel();
    ctrlc::set_handler(move || {
        let _ = stop_tx.send(());
    })
    .context("cannot install the Ctrl-C handler")?;
    let outcome = loop {
        if stop_rx.recv_timeout(Duration::from_secs(1)).is_ok() {
            break Ok(());
        }
        if let Some(status) = front.try_wait()? {
            break Err(anyhow::anyhow!(
                "nginx exited ({status}); its log: {}",
                dir.path().join("error.log").display()
            ));
        }
    };
    eprintln!("stopping: the replicas drain, then nginx");
    for replica in &replicas {
        replica.signal("TERM")?;
    }
    for replica in &mut replicas {
        replica.wait_exit(Duration::from_secs(60))?;
    }
    signal(front.id(), "QUIT")?;
    let _ = front.wait();
    outcome
}

fn parse_number<T: std::str::FromStr>(flag: &str, text: &str) -> Result<T> {
    text.parse()
        .ok()
        .with_context(|| format!("{flag} needs a number, got `{text}`"))
}

/// nginx on the `PATH` (or in /usr/sbin, which a user's `PATH` may lack),
/// or an error naming the install command.
pub(crate) fn nginx_binary() -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join("nginx"))
        .find(|candidate| candidate.is_file())
        .with_context(|| format!("nginx not found; install it with `{NGINX_INSTALL}`"))
}

/// deploy/nginx.conf with its placeholders filled in: `prefix` for the
/// pid, logs and temp files, `listen`, and one `server` line per replica.
pub(crate) fn nginx_conf(
    template: &str,
    prefix: &Path,
    listen: SocketAddr,
    replicas: &[SocketAddr],
) -> String {
    let servers = replicas
        .iter()
        .map(|addr| format!("server {addr} max_fails=1 fail_timeout=5s;"))
        .collect::<Vec<_>>()
        .join("\n        ");
    template
        .replace("@PREFIX@", &prefix.display().to_string())
        .replace("@LISTEN@", &listen.to_string())
        .replace("@SERVERS@", &servers)
}

/// Writes the configuration into `prefix` and starts nginx in the
/// foreground (`daemon off`), then waits until it accepts connections.
fn start_nginx(
    nginx: &Path,
    prefix: &Path,
    listen: SocketAddr,
    replicas: &[SocketAddr],
) -> Result<Child> {
    let template_path = project_root().join("deploy/nginx.conf");
    let template = std::fs::read_to_string(&template_path)
        .with_context(|| format!("cannot read {}", template_path.display()))?;
    let conf = prefix.join("nginx.conf");
    std::fs::write(&conf, nginx_conf(&template, prefix, listen, replicas))
        .with_context(|| format!("cannot write {}", conf.display()))?;
    let mut child = Command::new(nginx)
        .arg("-p")
        .arg(prefix)
        .arg("-c")
        .arg(&conf)
        // The error log before the configuration is read (nginx's default,
        // under /var/log, is not ours to write).
        .arg("-e")
        .arg(prefix.join("error.log"))
        .stdin(Stdio::null())
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot run {}", nginx.display()))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(listen).is_err() {
        if let Some(status) = child.try_wait()? {
            let log = std::fs::read_to_string(prefix.join("error.log")).unwrap_or_default();
            bail!("nginx exited at start ({status}): {log}");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            bail!("nginx did not listen on {listen} within 10 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(child)
}

/// A free loopback port (the OS picks it; nginx cannot report one itself).
pub(crate) fn free_port() -> Result<u16> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).context("cannot bind a loopback port")?;
    Ok(listener.local_addr()?.port())
}

/// Builds `lm-cli` in release, as it is deployed (in the dev profile the
/// compute crates are optimised but the grammar engine and the HTTP stack
/// are not), and returns the binary's path.
pub(crate) fn lm_cli() -> Result<PathBuf> {
    crate::bench::release_binary("lm-cli")
}

/// Sends `kill -SIGNAL pid` (xtask has no unsafe code for `libc::kill`).
pub(crate) fn signal(pid: u32, name: &str) -> Result<()> {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .context("cannot run kill")?;
    if !status.success() {
        bail!("kill -{name} {pid} failed ({status})");
    }
    Ok(())
}

/// A running `lm-cli serve`, killed if dropped while still running.
#[derive(Debug)]
pub(crate) struct Replica {
    child: Child,
    /// Where it listens.
    pub(crate) addr: SocketAddr,
    name: String,
    /// Everything it printed on stderr after its first line.
    log: Arc<Mutex<String>>,
}

impl Replica {
    /// Starts `command` (an `lm-cli serve ... --port 0` line) in a process
    /// group of its own, so a Ctrl-C reaches only this task, and reads the
    /// address from its first line; `echo` copies its later lines to
    /// stderr, prefixed with `name`.
    pub(crate) fn start(mut command: Command, name: &str, echo: bool) -> Result<Self> {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .with_context(|| format!("cannot start {name}: {command:?}"))?;
        let mut stderr = BufReader::new(child.stderr.take().context("no stderr")?);
        let mut line = String::new();
        stderr.read_line(&mut line)?;
        let Some(addr) = line
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|addr| addr.parse().ok())
        else {
            let mut rest = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr, &mut rest);
            let _ = child.kill();
            let _ = child.wait();
            bail!("{name} did not start: {line}{rest}");
        };
        let log = Arc::new(Mutex::new(String::new()));
        let (kept, prefix) = (Arc::clone(&log), name.to_owned());
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                if echo {
                    eprintln!("[{prefix}] {line}");
                }
                if let Ok(mut log) = kept.lock() {
                    log.push_str(&line);
                    log.push('\n');
                }
            }
        });
        Ok(Self {
            child,
            addr,
            name: name.to_owned(),
            log,
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What it printed on stderr since it started listening.
    pub(crate) fn log(&self) -> String {
        self.log.lock().map(|log| log.clone()).unwrap_or_default()
    }

    /// Waits until `/health` answers 200.
    pub(crate) fn wait_healthy(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if health(self.addr) == Some(200) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{} at {} not healthy after {timeout:?}",
                    self.name,
                    self.addr
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sends it a signal (`TERM`: drain and exit).
    pub(crate) fn signal(&self, name: &str) -> Result<()> {
        signal(self.pid(), name)
    }

    /// Waits up to `timeout` for it to exit.
    pub(crate) fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!("{} did not exit within {timeout:?}", self.name);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The status of `GET /health`, or `None` when nothing answers. A status
/// line is all it reads, with hyper, on a runtime of its own.
fn health(addr: SocketAddr) -> Option<u16> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    runtime.block_on(async {
        let response = crate::soak::client::get(addr, "/health").await.ok()?;
        Some(response.status)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_gets_every_placeholder() {
        let template = std::fs::read_to_string(project_root().join("deploy/nginx.conf")).unwrap();
        let listen = SocketAddr::from(([127, 0, 0, 1], 8080));
        let replicas = [
            SocketAddr::from(([127, 0, 0, 1], 9001)),
            SocketAddr::from(([127, 0, 0, 1], 9002)),
        ];
        let conf = nginx_conf(&template, Path::new("/tmp/x"), listen, &replicas);
        for placeholder in ["@PREFIX@", "@LISTEN@", "@SERVERS@"] {
            assert!(!conf.contains(placeholder), "{conf}");
        }
        assert!(conf.contains("listen 127.0.0.1:8080;"));
        assert!(conf.contains("pid /tmp/x/nginx.pid;"));
        // Two upstreams (affinity, round robin), each with both replicas.
        assert_eq!(
            conf.matches("server 127.0.0.1:9002 max_fails=1 fail_timeout=5s;")
                .count(),
            2
        );
        assert!(conf.contains("hash $http_x_session_id consistent;"));
    }

    #[test]
    fn bad_options_are_refused() {
        crate::assert_refused(
            run,
            &[
                &["--replicas"],
                &["--replicas", "0"],
                &["--port", "http"],
                &["--fast", "1"],
            ],
        );
    }
}

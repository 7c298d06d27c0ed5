//! Shared by lm-serve's integration tests: a server started on a free
//! loopback port in a thread of its own (stopped when dropped), a plain
//! HTTP/1.1 client on `std::net` (it also sends what no proper client
//! would: bad bodies, half requests, dropped connections), the toy decoder's
//! text side, a model whose forward passes wait at a gate, and where
//! SmolLM2 is.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use lm_core::{Adapted, ForwardHook, LanguageModel, TokenId};
use lm_serve::{ServeConfig, ServeError, ServedText, Server};
use serde_json::Value;

/// A running server; dropping it stops it (as Ctrl-C would) and waits.
pub struct TestServer {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<Result<(), ServeError>>>,
}

impl TestServer {
    /// SmolLM2 served by `parallel` workers (panics naming the fetch
    /// command when the file is missing).
    pub fn smollm2(parallel: usize) -> Self {
        let config = ServeConfig {
            parallel,
            ..ServeConfig::default()
        };
        Self::gguf(smollm2_path(), config)
    }

    /// The GGUF file at `path`, served with `config`'s settings.
    pub fn gguf(path: impl AsRef<std::path::Path>, config: ServeConfig) -> Self {
        let lm::GgufModel { decoder, text, .. } = lm::load_gguf(path).unwrap();
        Self::start(decoder, text, config)
    }

    /// [`TestServer::gguf`] under the model name `name`.
    pub fn named(path: impl AsRef<std::path::Path>, name: &str, config: ServeConfig) -> Self {
        let config = ServeConfig {
            model_name: name.into(),
            ..config
        };
        Self::gguf(path, config)
    }

    /// The toy model and its text side, served with `config`'s settings.
    pub fn toy(config: ServeConfig) -> Self {
        Self::start(toy_model(), ToyText, config)
    }

    /// The toy model behind a closed [`Gate`] with `text`, served with
    /// `config`'s settings, and the gate that lets its forward passes run.
    pub fn gated_toy(text: impl ServedText + 'static, config: ServeConfig) -> (Self, Gate) {
        let (model, gate) = gated(toy_model());
        gate.close();
        (Self::start(model, text, config), gate)
    }

    /// Serves `model` on a free loopback port with `config`'s other settings.
    pub fn start<M>(model: M, text: impl ServedText + 'static, config: ServeConfig) -> Self
    where
        M: lm_serve::ServedModel,
    {
        let config = ServeConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            ..config
        };
        Self::run(Server::bind(Arc::new(model), Arc::new(text), config).unwrap())
    }

    /// Runs a bound `server` (its address: port 0 for a free one).
    pub fn run(server: Server) -> Self {
        let addr = server.local_addr();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(server.run(async {
                let _ = stopped.await;
            }))
        });
        Self {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Stops the server as a signal would and returns how `run` ended.
    pub fn stop(mut self) -> Result<(), ServeError> {
        self.stop_now()
    }

    /// Asks the server to stop as a signal would, without waiting for it.
    pub fn signal_stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    fn stop_now(&mut self) -> Result<(), ServeError> {
        self.signal_stop();
        match self.thread.take() {
            Some(thread) => thread.join().expect("the server thread does not panic"),
            None => Ok(()),
        }
    }

    /// `POST path` with a JSON body: the status and the JSON answer.
    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let response = post_body(self.addr, path, &body.to_string());
        (response.status, response.json())
    }

    /// `GET path`.
    pub fn get(&self, path: &str) -> Response {
        request(self.addr, "GET", path, &[], b"")
    }

    /// A Prometheus metric's value from `/metrics`.
    pub fn metric(&self, name: &str) -> f64 {
        let text = String::from_utf8(self.get("/metrics").body).unwrap();
        text.lines()
            .find_map(|line| line.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no metric {name} in:\n{text}"))
            .parse()
            .unwrap()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.stop_now();
    }
}

/// An HTTP response, the body de-chunked.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "status {}: body is not JSON ({e}): {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// The JSON chunks of a stream: its events before the closing `[DONE]`.
    pub fn chunks(&self) -> Vec<Value> {
        let events = self.events();
        events[..events.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(e).unwrap())
            .collect()
    }

    /// The `data:` payloads of a server-sent-events body.
    pub fn events(&self) -> Vec<String> {
        String::from_utf8(self.body.clone())
            .unwrap()
            .lines()
            .filter_map(|line| line.strip_prefix("data: ").map(str::to_owned))
            .collect()
    }
}

/// `POST path` with `body` to the server at `addr`, without extra headers.
pub fn post_body(addr: SocketAddr, path: &str, body: &str) -> Response {
    request(addr, "POST", path, &[], body.as_bytes())
}

/// Sends one request (`Connection: close`) and reads the whole answer.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    // A server may answer (413) before reading the whole body.
    let _ = stream.write_all(body);
    read_response(&mut BufReader::new(stream))
}

/// Reads a status line, headers and a body (chunked or sized or to EOF).
pub fn read_response(reader: &mut impl BufRead) -> Response {
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .unwrap_or_else(|| panic!("no status line: {line:?}"))
        .parse()
        .unwrap();
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line).unwrap();
        let trimmed = line.trim_end();
        if trimmed.is_empty() {
            break;
        }
        let (name, value) = trimmed.split_once(':').unwrap();
        headers.push((name.trim().to_owned(), value.trim().to_owned()));
    }
    let find = |name: &str| {
        headers
            .iter()
            .find(|(n, _): &&(String, String)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    let mut body = Vec::new();
    if find("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            line.clear();
            reader.read_line(&mut line).unwrap();
            let size = usize::from_str_radix(line.trim(), 16).unwrap();
            if size == 0 {
                break;
            }
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).unwrap();
            body.extend_from_slice(&chunk[..size]);
        }
    } else if let Some(len) = find("content-length") {
        body.resize(len.parse().unwrap(), 0);
        reader.read_exact(&mut body).unwrap();
    } else {
        reader.read_to_end(&mut body).unwrap();
    }
    Response {
        status,
        headers,
        body,
    }
}

/// The toy decoder with room for long runs, and its text side (shared
/// with the fuzzer).
pub use lm_serve::fuzz::{ToyText, toy_model};

/// Opens and closes a gated model's forward passes (see [`gated`]); clones
/// share one gate.
#[derive(Clone, Default)]
pub struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    pub fn close(&self) {
        *self.0.0.lock().unwrap() = true;
    }

    pub fn open(&self) {
        *self.0.0.lock().unwrap() = false;
        self.0.1.notify_all();
    }
}

impl ForwardHook for Gate {
    /// Waits while the gate is closed. After [`GATE_TIMEOUT`] the gate opens
    /// for good, so a test that fails with it closed ends instead of hanging.
    fn before_forward<M: LanguageModel + ?Sized>(
        &self,
        _model: &M,
        _pos: usize,
        _tokens: &[TokenId],
    ) -> lm_core::Result<()> {
        let (closed, opened) = &*self.0;
        let (mut closed, waited) = opened
            .wait_timeout_while(closed.lock().unwrap(), GATE_TIMEOUT, |closed| *closed)
            .unwrap();
        if waited.timed_out() {
            *closed = false;
            opened.notify_all();
        }
        Ok(())
    }
}

/// The longest a forward pass waits at a closed [`Gate`].
const GATE_TIMEOUT: Duration = Duration::from_secs(60);

/// Asserts that an error answer's message contains `part`.
#[track_caller]
pub fn assert_error_message(answer: &Value, part: &str) {
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains(part), "{answer}");
}

/// Polls `done` until it holds; panics after 30 s, naming `what`.
pub fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `model` behind an open [`Gate`], and the gate: a test closes it, lets
/// requests pile up, and opens it to see them served together, however the
/// threads happen to be scheduled.
pub fn gated<M>(model: M) -> (Adapted<M, Gate>, Gate) {
    let gate = Gate::default();
    let hook = gate.clone();
    (Adapted { inner: model, hook }, gate)
}

/// A model file of the catalog (panics naming the fetch command when it
/// is missing), loaded anew at each call, served as `id` with `config`:
/// one model of a several-model server.
pub fn gguf_source(
    id: &str,
    model: &lm_model::catalog::KnownModel,
    config: ServeConfig,
) -> lm_serve::ModelSource {
    let path = model.path().unwrap_or_else(|err| panic!("{err}"));
    let load: lm_serve::LoadModel = Arc::new(move || {
        let lm::GgufModel { decoder, text, .. } =
            lm::load_gguf(&path).map_err(|error| ServeError::Load {
                id: "gguf".into(),
                source: error.into(),
            })?;
        lm_serve::LoadedModel::new(Arc::new(decoder), Arc::new(text), config.clone())
    });
    lm_serve::ModelSource {
        id: id.into(),
        load,
    }
}

/// The SmolLM2 file; panics naming the fetch command when it is missing.
pub fn smollm2_path() -> std::path::PathBuf {
    lm_model::catalog::SMOLLM2
        .path()
        .unwrap_or_else(|err| panic!("{err}"))
}

/// The target folder, where `.ci/run` makes the tests' Python venvs.
pub fn target_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target folder")
        .to_owned()
}

/// A Python that imports `packages`: the one `variable` names, or
/// `<target>/<venv>/bin/python`; panics naming the install command.
pub fn venv_python(variable: &str, venv: &str, packages: &[&str]) -> std::path::PathBuf {
    let python = match std::env::var_os(variable) {
        Some(python) => std::path::PathBuf::from(python),
        None => target_dir().join(venv).join("bin/python"),
    };
    let imports = format!("import {}", packages.join(", "));
    let has_packages = std::process::Command::new(&python)
        .args(["-c", &imports])
        .status()
        .is_ok_and(|status| status.success());
    let target = target_dir();
    assert!(
        has_packages,
        "{} cannot `{imports}`: run `python3 -m venv {1}/{venv} && {1}/{venv}/bin/pip install {2}` \
         (as .ci/run does), or set {variable}",
        python.display(),
        target.display(),
        packages.join(" ")
    );
    python
}

/// Runs `tests/<script>` with `python` and `args`; panics with its output
/// unless it succeeds and prints "all checks passed".
pub fn run_checks<S: AsRef<std::ffi::OsStr>>(python: &std::path::Path, script: &str, args: &[S]) {
    let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(script);
    let output = std::process::Command::new(python)
        .arg(&script)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", python.display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("all checks passed"),
        "{} failed:\n{stdout}\n{}",
        script.display(),
        String::from_utf8_lossy(&output.stderr)
    );
}

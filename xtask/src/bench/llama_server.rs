//! llama-server, the peer of `cargo xtask bench --serve`: llama.cpp's own
//! OpenAI-compatible server with continuous batching, run on the same model
//! with as many slots as the benchmark has clients.
//!
//! It is built once into `<target>/llama-server/` from the llama.cpp sources
//! that the pinned llama-cpp-python source package vendors (the version the
//! reference fixtures come from), downloaded by pip (which checks PyPI's
//! hash), configured with the reference build's instruction-set switches
//! ([`reference::cmake_args`]: no `-march=native`, AMX off) and compiled
//! with CMake and Ninja from PyPI, so nothing is installed system-wide.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::reference::{self, LLAMA_CPP_PYTHON_VERSION, run_checked as run};

/// How long the server may take to load the model and answer `/health`.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// `<target>/llama-server/build/bin/llama-server`, built first when missing.
pub(super) fn binary() -> Result<PathBuf> {
    let dir = reference::target_dir().join("llama-server");
    let binary = dir.join("build").join("bin").join("llama-server");
    if binary.is_file() {
        return Ok(binary);
    }
    println!(
        "building llama-server from llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}'s vendored llama.cpp into {} (several minutes on two cores)",
        dir.display()
    );
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let venv = dir.join("venv");
    let bin = venv.join("bin");
    if !bin.join("python").is_file() {
        run(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
    }
    run(Command::new(bin.join("pip")).args([
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "cmake",
        "ninja",
    ]))?;
    let sdist = dir.join(format!(
        "llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
    ));
    if !sdist.is_file() {
        run(Command::new(bin.join("pip"))
            .args([
                "download",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
            ])
            .args(["--no-binary", "llama-cpp-python", "--dest"])
            .arg(&dir)
            .arg(format!("llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}")))?;
    }
    run(Command::new("tar")
        .arg("xzf")
        .arg(&sdist)
        .arg("-C")
        .arg(&dir))?;
    let source = dir
        .join(format!("llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}"))
        .join("vendor")
        .join("llama.cpp");
    let build = dir.join("build");
    // The tools on PATH so CMake finds Ninja.
    let path = std::env::join_paths(std::iter::once(bin.clone()).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))?;
    let isa = reference::cmake_args(&reference::cpu_flags());
    run(Command::new(bin.join("cmake"))
        .env("PATH", &path)
        .arg("-S")
        .arg(&source)
        .arg("-B")
        .arg(&build)
        .args(["-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release"])
        .args(isa.split_whitespace())
        .args([
            "-DLLAMA_BUILD_SERVER=ON",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_CURL=OFF",
            "-DLLAMA_OPENSSL=OFF",
        ]))?;
    run(Command::new(bin.join("cmake"))
        .env("PATH", &path)
        .arg("--build")
        .arg(&build)
        .args(["--target", "llama-server"]))?;
    if !binary.is_file() {
        bail!("the build finished without {}", binary.display());
    }
    Ok(binary)
}

/// A running llama-server, killed when dropped.
pub(super) struct LlamaServer {
    child: Child,
    addr: SocketAddr,
}

impl LlamaServer {
    /// Starts `binary` on `model` with `n_slots` parallel slots of
    /// `slot_context` tokens each (llama-server splits its context among
    /// the slots) and `n_threads` threads, on a free loopback port, and
    /// waits until `/health` answers 200.
    pub(super) fn start(
        binary: &Path,
        model: &Path,
        n_slots: usize,
        slot_context: usize,
        n_threads: usize,
    ) -> Result<Self> {
        let port = crate::serve_cluster::free_port()?;
        let child = Command::new(binary)
            .arg("--model")
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--parallel", &n_slots.to_string()])
            .args(["--ctx-size", &(n_slots * slot_context).to_string()])
            .args(["--threads", &n_threads.to_string()])
            .args(["--threads-batch", &n_threads.to_string()])
            .arg("--cont-batching")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {}", binary.display()))?;
        let mut server = Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        };
        let started = Instant::now();
        while !server.healthy() {
            if let Some(status) = server.child.try_wait()? {
                bail!("llama-server exited ({status}) before it was ready");
            }
            if started.elapsed() > START_TIMEOUT {
                bail!("llama-server did not answer /health within {START_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(server)
    }

    /// Where it listens.
    pub(super) fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn healthy(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut connection) = TcpStream::connect(self.addr) else {
            return false;
        };
        let request = format!(
            "GET /health HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.addr
        );
        let mut head = [0u8; 12];
        connection.write_all(request.as_bytes()).is_ok()
            && connection.read_exact(&mut head).is_ok()
            && head.ends_with(b"200")
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

//! Where results go: a locked, buffered stdout whose write errors are
//! returned, never panicked on (`println!` panics when a reader such as
//! `head -c 1` closes the pipe; `main` turns a broken pipe into a quiet exit).

use std::io::{self, Write};

/// Buffered standard output.
#[derive(Debug)]
pub struct Output {
    out: io::BufWriter<io::StdoutLock<'static>>,
}

impl Output {
    /// Locks stdout for this process.
    pub fn stdout() -> Self {
        Self {
            out: io::BufWriter::new(io::stdout().lock()),
        }
    }

    /// Writes `text` and flushes, so streamed text appears at once.
    pub fn write_now(&mut self, text: &str) -> io::Result<()> {
        self.out.write_all(text.as_bytes())?;
        self.out.flush()
    }

    /// Writes a value as pretty JSON followed by a newline.
    pub fn write_json<T: serde::Serialize>(&mut self, value: &T) -> anyhow::Result<()> {
        serde_json::to_writer_pretty(&mut self.out, value)?;
        self.out.write_all(b"\n")?;
        self.out.flush()?;
        Ok(())
    }

    /// Writes a value as one line of compact JSON and flushes (`--json-lines`).
    pub fn write_json_line<T: serde::Serialize>(&mut self, value: &T) -> anyhow::Result<()> {
        serde_json::to_writer(&mut self.out, value)?;
        self.out.write_all(b"\n")?;
        self.out.flush()?;
        Ok(())
    }
}

impl Write for Output {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.out.write(bytes)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// Whether `error` (or anything in its chain) is a write to a closed pipe.
pub fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<io::Error>()
            .is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe)
            || cause
                .downcast_ref::<serde_json::Error>()
                .and_then(|e| e.io_error_kind())
                .is_some_and(|kind| kind == io::ErrorKind::BrokenPipe)
    })
}

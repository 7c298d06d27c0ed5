//! A bounded fuzz run of the HTTP API (lm-serve's `fuzz` module: request
//! bodies from OpenAI's schema, mutated): 2,000 requests here, 100,000 with
//! `cargo xtask fuzz-serve`. The server runs in a child process (this test
//! binary again, in the server role), so its RSS is its own.

use std::process::Command;

use lm_serve::fuzz::{self, ServerProcess};

/// Set in the child: serve instead of fuzzing.
const SERVER_ROLE: &str = "LM_SERVE_FUZZ_SERVER";
const N_REQUESTS: u64 = 2_000;
const SEED: u64 = 33;

#[test]
fn fuzzed_requests_get_2xx_or_4xx_and_the_server_keeps_its_memory() {
    if std::env::var_os(SERVER_ROLE).is_some() {
        // The server role: serve until the fuzzer closes stdin.
        fuzz::serve_toy(
            |addr| println!("{}{addr}", fuzz::LISTENING),
            || {
                let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
            },
        )
        .unwrap();
        return;
    }
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "fuzz::fuzzed_requests_get_2xx_or_4xx_and_the_server_keeps_its_memory",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(SERVER_ROLE, "1");
    let server = ServerProcess::spawn(command).unwrap();
    let report = fuzz::run(server.addr, server.pid(), N_REQUESTS, SEED, 4);
    eprintln!("{report}");
    server.stop().unwrap();
    report.check().unwrap();
    assert_eq!(report.n_requests, N_REQUESTS);
    // The generator reaches both answers: served and refused.
    assert!(
        report.statuses.get(&200).is_some_and(|&n| n > 100),
        "{report}"
    );
    assert!(
        report.statuses.get(&400).is_some_and(|&n| n > 100),
        "{report}"
    );
}

//! `--mmap`: a GGUF file mapped instead of copied gives the copy's tokens,
//! its weights stay in the file's pages (shared by two servers of it), and
//! a model that is not a GGUF file is refused.

use lm_model::catalog::SMOLLM2;

use crate::common::{Cli, assert_contains, fixture};

#[test]
fn mmap_is_refused_for_a_model_that_is_not_a_gguf_file() {
    let hf_dir = fixture("hf/gpt_oss");
    let hf_dir = hf_dir.display().to_string();
    for model in ["toy", hf_dir.as_str()] {
        let run = Cli::generate("x").model(model).arg("--mmap").run();
        run.assert_exit(1, &format!("--mmap maps a GGUF file; {model} is not one"));
    }
    let run = Cli::generate("x")
        .model(&hf_dir)
        .opt("--quantize", "q8_0")
        .arg("--mmap")
        .run();
    assert_contains(
        &run.stderr,
        "--mmap maps a GGUF file; --quantize converts a Hugging Face directory",
    );
}

/// `field`'s value in kB in `/proc/PID/smaps_rollup`.
fn rollup_kb(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in:\n{text}"))
        .trim()
        .trim_end_matches(" kB")
        .parse()
        .unwrap()
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn mmap_gives_the_copy_s_tokens_from_pages_two_servers_share() {
    let path = SMOLLM2.path().unwrap_or_else(|err| panic!("{err}"));
    // The same kernels either way: a copy packs SmolLM2's Q4_1 matrices in
    // panels (sums in another order), a map cannot.
    let generate = |mmap: bool| {
        let cli = Cli::generate("The capital of France is")
            .model("smollm2")
            .n(16)
            .arg("--greedy")
            .env("LM_PACK", "0");
        if mmap { cli.arg("--mmap") } else { cli }.ok().stdout
    };
    assert_eq!(generate(true), generate(false));

    let file_kb = std::fs::metadata(&path).unwrap().len() / 1024;
    let serve = |mmap: bool| {
        let cli = Cli::new("serve").model("smollm2");
        let cli = if mmap { cli.arg("--mmap") } else { cli };
        cli.spawn_server()
    };
    let (mut copied, _) = serve(false);
    let (mut first, _) = serve(true);
    let (mut second, _) = serve(true);
    // The copy holds the weights in its own memory; each mapping server
    // has them resident in the file's pages (read at load, as every tensor
    // is validated), shared: each is charged about half of them.
    let copied_anon = rollup_kb(copied.id(), "Pss_Anon");
    assert!(
        copied_anon > file_kb,
        "{copied_anon} kB anonymous, file {file_kb} kB"
    );
    for server in [&first, &second] {
        let (anon, rss_file, pss_file) = (
            rollup_kb(server.id(), "Pss_Anon"),
            rollup_kb(server.id(), "Rss") - rollup_kb(server.id(), "Anonymous"),
            rollup_kb(server.id(), "Pss_File"),
        );
        assert!(anon < file_kb / 2, "{anon} kB anonymous, file {file_kb} kB");
        assert!(
            rss_file > file_kb * 9 / 10,
            "{rss_file} kB of file pages, file {file_kb} kB"
        );
        assert!(
            pss_file < file_kb * 6 / 10,
            "{pss_file} kB proportional, file {file_kb} kB"
        );
    }
    for child in [&mut copied, &mut first, &mut second] {
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

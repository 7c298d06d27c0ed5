//! The command line, declared with clap's derive API: one struct per
//! subcommand, help written for someone meeting these ideas for the first
//! time, and examples in each subcommand's `after_help`.
//!
//! Values that lm-decode validates (temperature, top-k, top-p, min-p,
//! penalties) are checked here with lm-decode's own constructors, so a bad
//! value is a usage error (exit code 2) with the library's message.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use lm_decode::{SamplerOrder, SamplingConfig, Truncation};

use crate::spec::ModelSpec;
use crate::structured::StructuredArgs;

/// The whole command line.
#[derive(Debug, Parser)]
#[command(
    name = "lm-cli",
    version,
    about = "Autoregressive text generation, every step visible",
    long_about = "Autoregressive text generation, every step visible.\n\n\
        A language model answers one question: what comes next? It turns a prefix of \
        tokens into a probability for every token of its vocabulary. Generation repeats \
        that: predict, choose a token (the policy: greedy, or sampling with temperature, \
        top-k, top-p, min-p), append it, and stop at an end token or a limit.\n\n\
        Every subcommand takes a model with --model (see MODELS below); without it, the \
        embedded default is used: a trigram model of the King James Bible, built in.",
    after_help = MODELS_HELP,
    propagate_version = true,
    arg_required_else_help = true
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The MODELS section shared by the help texts.
pub const MODELS_HELP: &str = "\
MODELS (--model SPEC):
  toy          the lessons' seven-token decoder; a prompt is words of its vocabulary
               separated by spaces: <start> the cat dog sat slept <end> (ids 0 to 6)
  count:FILE   a count (n-gram) model: an ARPA file, or a text corpus trained on the fly
  FILE.gguf    a llama, qwen2, qwen3 or gemma3 model in a GGUF file (tokenizer read from
               the file; a file is GGUF by its first bytes, whatever its name)
  NAME         a known model from the models folder ($LM_MODELS_DIR, default
               ~/.cache/lm/models): smollm2 (SmolLM2-135M-Instruct), gemma3-270m,
               smollm2-q4_k_m, ...; get it with `cargo xtask fetch-model NAME`
  (no --model) the embedded default: a Kneser-Ney trigram model of the King James Bible";

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Generate a continuation of a prompt, step by step.
    #[command(after_help = GENERATE_HELP)]
    Generate(Box<GenerateArgs>),
    /// Show the distribution a decoding policy would draw from, for logits you type.
    #[command(after_help = PROBS_HELP)]
    Probs(ProbsArgs),
    /// Score a continuation (or, for a count model, a sentence) token by token.
    #[command(after_help = SCORE_HELP)]
    Score(ScoreArgs),
    /// Score every continuation of a few tokens and rank them; see where greedy lands.
    #[command(after_help = ENUMERATE_HELP)]
    Enumerate(EnumerateArgs),
    /// Split text into the model's tokens and show their ids (a space shows
    /// as ␣, a line break as \n, a tab as \t).
    #[command(after_help = TOKENIZE_HELP)]
    Tokenize(TokenizeArgs),
    /// Train a count (n-gram) model on a text corpus and write it as an ARPA file.
    #[command(after_help = TRAIN_HELP)]
    Train(TrainArgs),
    /// Quantize a GGUF model to another type (llama-quantize's rules and blocks).
    #[command(after_help = crate::commands::quantize::QUANTIZE_HELP)]
    Quantize(crate::commands::quantize::QuantizeArgs),
    /// Talk with a chat model, turn by turn (the model's own chat template).
    #[command(after_help = CHAT_HELP)]
    Chat(Box<ChatArgs>),
    /// Serve the model over HTTP with OpenAI's API (completions, chat, streaming).
    #[command(after_help = SERVE_HELP)]
    Serve(ServeArgs),
    /// Print a text's embedding: the final hidden states pooled, L2-normalised (JSON).
    #[command(after_help = EMBED_HELP)]
    Embed(EmbedArgs),
    /// Print a shell completion script (bash, zsh, fish, ...).
    #[command(after_help = COMPLETIONS_HELP)]
    Completions(CompletionsArgs),
}

const GENERATE_HELP: &str = "\
EXAMPLES:
  lm-cli generate --prompt \"And God said\"
  lm-cli generate --model toy --prompt \"<start> the cat\" --max-new-tokens 5 --greedy --trace
  lm-cli generate --model toy --prompt \"<start> the cat\" --temperature 0.5 --seed 1 --json
  lm-cli generate --model toy --prompt \"<start> the cat\" --num-beams 4 --length-penalty 0.6
  lm-cli generate --model smollm2 --chat --prompt \"What is a language model?\"
  lm-cli generate -f prompt.txt                  # or: cat prompt.txt | lm-cli generate
  lm-cli generate --model toy --prompt \"<start> the\" --logit-bias cat=-inf --presence-penalty 0.5

HOW A STEP IS CHOSEN:
  raw logits -> repetition, presence, frequency penalties -> dry ->
  no-repeat-ngram -> logit bias -> temperature (dynatemp) -> top-n-sigma -> top-k ->
  typical -> top-p -> min-p -> xtc -> epsilon-cutoff -> eta-cutoff -> mirostat ->
  choose; --samplers \"top_k;typ_p;top_p;min_p;xtc;temperature\" runs exactly the
  stages named, in that order (llama.cpp's names).
  llama.cpp names work too: --temp, --n-predict, --repeat-penalty, --ignore-eos,
  --n-probs, -c/--ctx-size.
  Temperature 0 (or --greedy) takes the most probable token. Otherwise a seeded
  ChaCha20 draw picks a token with the policy's probabilities, so the same --seed
  gives the same text on every run and every --threads count.

STOPPING:
  end_token       the model chose an end token (toy: <end>; count models: </s>)
  stop_string     the text came to contain a --stop string
  max_new_tokens  --max-new-tokens tokens were generated (truncated)
  context_bound   prompt plus new tokens filled the context (truncated)";

const PROBS_HELP: &str = "\
EXAMPLES:
  lm-cli probs --logits 2,1,0 --temperature 0.5      # lesson 000: 0.867 0.117 0.016
  lm-cli probs --logits 2,1,0 --temperature 0        # greedy: all mass on the argmax
  lm-cli probs --logits 3,1,1,0,-1 --top-k 2 --json

The policy is the one `generate` uses: temperature first, then top-n-sigma,
top-k, typical, top-p, min-p, XTC and the epsilon and eta cutoffs, each
renormalising what it keeps, then mirostat (or the order --samplers gives; the
policy: line shows it). Here XTC shows the distribution it draws from (the mix
of removing and keeping the top choices), since there is no draw, and mirostat
its first step (mu = 2 tau). Without a history, the penalties and DRY do not
apply.";

const SCORE_HELP: &str = "\
EXAMPLES:
  lm-cli score --model toy --prompt \"<start> the cat\" --continuation \"dog dog\"
  lm-cli score --prompt \"In the beginning\" --continuation \"God created\" --json
  lm-cli score --model count:model.arpa --text \"the cat sat on the mat .\" --json
  lm-cli score --model smollm2 --file essay.txt        # perplexity of a whole file

With --prompt and --continuation: the log-probability of each continuation token
given everything before it, their sum (the chain rule) and the perplexity
exp(-sum / n). With --text (count models only): the sentence scored as KenLM's
query scores it, with <s> before and </s> after, in log10. With --file: the
perplexity of a whole file (a progress bar on a terminal); a count model scores
each line as a sentence, as KenLM's query does (perplexity with and without
unknown words); any other model scores every token from the first, after the
document start when the model has one (its BOS when every text gets one, else
<|endoftext|>), in windows of the context length.";

const ENUMERATE_HELP: &str = "\
EXAMPLES:
  lm-cli enumerate --model toy --prompt \"<start> the cat\" --steps 4 --top 5
  lm-cli enumerate --model toy --prompt \"<start> the cat\" --steps 2 --json

Scores all vocab^steps continuations (lesson 001: 7^4 = 2,401) and shows where
the greedy continuation ranks: greedy is best at each step, not always overall.";

const TOKENIZE_HELP: &str = "\
EXAMPLES:
  lm-cli tokenize --model toy --text \"<start> the cat\"
  lm-cli tokenize --model smollm2 --text \"Hello, world!\" --json
  lm-cli tokenize --model smollm2 --chat --text \"Hi\"

A token that is one byte of a character split across tokens is shown as the
vocabulary writes it (<0xF0>, or its byte-level string such as ðŁ), not as �.";

const TRAIN_HELP: &str = "\
EXAMPLES:
  lm-cli train --corpus corpus.txt --order 3 --smoothing kneser-ney --out model.arpa
  lm-cli generate --model count:model.arpa --prompt \"the cat\"

Each line of the corpus is a sentence; it is split into words and punctuation.
The file is written to a temporary name first and renamed when complete.";

const CHAT_HELP: &str = "\
EXAMPLES:
  lm-cli chat --model smollm2
  echo \"What are the three primary colors?\" | lm-cli chat --model smollm2 --greedy
  printf 'Hi\\nWhat is 2+2?\\n' | lm-cli chat --model smollm2 --json --seed 1

Type a message and press Enter. A line ending in \\ continues on the next line;
a pasted paragraph is one message, and so are lines between two lines of \"\"\".
Empty lines are ignored; Ctrl-D (end of input) or /exit ends the chat. Ctrl-C
stops a reply and returns to the prompt (twice: exits). Each line of piped input
is one message. On a terminal, lines can be edited and recalled (arrow keys).

COMMANDS:
  /clear        start over (the system message stays)
  /system TEXT  set the system message (/system alone removes it)
  /regen        drop the last reply and generate it again
  /save FILE    write the conversation as JSON ({\"messages\": [...]})
  /load FILE    read a conversation written by /save
  /help         list these;  /exit  end the chat
  //TEXT        send a message that starts with /

When the conversation no longer fits the context, the oldest turns after the
system message are dropped, with a note. The model keeps what it has read
between turns, so a turn reads only its new tokens.";

const SERVE_HELP: &str = "\
EXAMPLES:
  lm-cli serve --model smollm2 --parallel 8
  lm-cli serve --model smollm2 --model small=smollm2-q8_0 --idle-unload 600
  curl -s localhost:8080/v1/completions -H 'Content-Type: application/json' \\
       -d '{\"prompt\": \"The capital of France is\", \"max_tokens\": 8, \"temperature\": 0}'

Endpoints: POST /v1/completions, /v1/chat/completions, /tokenize, /detokenize;
GET /v1/models, /health, /metrics. Ctrl-C or SIGTERM stops taking requests and
lets running ones finish for --shutdown-grace seconds. With several --model, a
request's \"model\" picks one (none: the first). See docs/serving.md.";

const COMPLETIONS_HELP: &str = "\
EXAMPLES:
  lm-cli completions bash > ~/.local/share/bash-completion/completions/lm-cli
  lm-cli completions zsh > ~/.zfunc/_lm-cli
  lm-cli completions fish > ~/.config/fish/completions/lm-cli.fish";

/// Which model to use and how to run it: shared by every model subcommand.
#[derive(Debug, Clone, Args)]
pub struct ModelArgs {
    /// The model: toy, count:FILE, FILE.gguf or a known model's NAME (smollm2, gemma3-270m, ...;
    /// see MODELS in `lm-cli --help`); default: the embedded KJV trigram model.
    #[arg(long, short = 'm', value_name = "SPEC")]
    pub model: Option<ModelSpec>,
    /// Override the model's context length (the longest prefix it reads;
    /// llama.cpp's -c/--ctx-size).
    #[arg(long, short = 'c', visible_alias = "ctx-size", value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub context_length: Option<u64>,
    /// Recompute the whole prefix at every step instead of using the cache (slow; same results).
    #[arg(long)]
    pub no_cache: bool,
    /// Worker threads for the model's matrix products (default: all cores).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub threads: Option<u64>,
    /// How the KV cache stores keys and values (llama.cpp's
    /// --cache-type-k/-v): f16 (a GGUF model's default), f32, or q8_0
    /// (8-bit blocks, 53% of f16's bytes: about twice the sequences per
    /// gigabyte). Transformer models only.
    #[arg(long, value_name = "TYPE")]
    pub kv_type: Option<KvType>,
    /// Quantize a Hugging Face directory's matrices while loading
    /// (in-situ; each matrix whose rows split into the type's blocks, the
    /// rest kept): q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k or q6_k.
    #[arg(long, value_name = "TYPE")]
    pub quantize: Option<LoadQuant>,
    /// Map the GGUF file instead of copying it into memory (llama.cpp's
    /// default): its pages are shared with every process mapping it, so two
    /// servers of one file hold it once, but weights stream from 4 KB pages
    /// and no matrix is packed in panels, so prompts read slower.
    #[arg(long)]
    pub mmap: bool,
}

/// The types `--quantize` quantizes to at load: GGML's names, in lower
/// case on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
#[allow(missing_docs, non_camel_case_types)]
pub enum LoadQuant {
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q4_K,
    Q5_K,
    Q6_K,
}

impl LoadQuant {
    /// The GGML type.
    pub fn ggml_type(self) -> lm_model::GgmlType {
        use lm_model::GgmlType as T;
        match self {
            Self::Q8_0 => T::Q8_0,
            Self::Q4_0 => T::Q4_0,
            Self::Q4_1 => T::Q4_1,
            Self::Q5_0 => T::Q5_0,
            Self::Q5_1 => T::Q5_1,
            Self::Q4_K => T::Q4_K,
            Self::Q5_K => T::Q5_K,
            Self::Q6_K => T::Q6_K,
        }
    }
}

/// The KV cache precisions `--kv-type` names (`lm_model::KvPrecision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KvType {
    /// 32-bit floats.
    F32,
    /// 16-bit floats (llama.cpp's default).
    F16,
    /// llama.cpp's q8_0: 32 int8s and an f16 scale per 32 values.
    #[value(name = "q8_0")]
    Q8_0,
}

/// `--temperature` when not given: the model's own distribution.
pub const DEFAULT_TEMPERATURE: f32 = 1.0;

/// `chat`'s `--temperature` when neither the flag nor the model sets one.
pub const CHAT_TEMPERATURE: f32 = 0.7;

/// `chat`'s `--top-p` when neither the flag nor the model sets one.
pub const CHAT_TOP_P: f32 = 0.9;

/// The temperature and the filters after it, in the order the policy chain
/// runs them: shared by `generate` and `probs`, so `probs` shows the
/// distribution `generate` draws from for the same flags.
#[derive(Debug, Clone, Args)]
pub struct FilterArgs {
    /// Sharpen (< 1) or flatten (> 1) the distribution; 0 means greedy (all
    /// mass on the largest logit) [default: 1, or a Hugging Face model
    /// directory's generation_config.json].
    #[arg(long, short = 't', visible_alias = "temp", value_name = "T",
          allow_negative_numbers = true,
          value_parser = setting(|c, t| c.temperature = t))]
    pub temperature: Option<f32>,
    /// Dynamic temperature: the temperature moves within T ± R with the
    /// entropy of the candidates, lower when the model is sure (0: off).
    #[arg(long, value_name = "R", allow_negative_numbers = true,
          value_parser = setting(|c, r| c.dynatemp_range = Some(r)))]
    pub dynatemp_range: Option<f32>,
    /// Dynamic temperature's exponent on the normalised entropy [default: 1].
    #[arg(long, value_name = "E", allow_negative_numbers = true,
          value_parser = setting(|c, e| c.dynatemp_exponent = Some(e)))]
    pub dynatemp_exp: Option<f32>,
    /// Keep only the K most probable tokens (0: all of them, off, as in
    /// llama.cpp and Hugging Face).
    #[arg(long, value_name = "K", value_parser = parse_top_k)]
    pub top_k: Option<usize>,
    /// Keep the fewest most probable tokens whose probabilities add up to P (nucleus sampling).
    #[arg(long, value_name = "P", allow_negative_numbers = true,
          value_parser = setting(|c, p| c.top_p = Some(p)))]
    pub top_p: Option<f32>,
    /// Keep tokens at least P times as probable as the best one.
    #[arg(long, value_name = "P", allow_negative_numbers = true,
          value_parser = setting(|c, p| c.min_p = Some(p)))]
    pub min_p: Option<f32>,
    /// Locally typical sampling: keep the tokens whose surprise is closest to the
    /// entropy, up to probability mass P (1: off; HF's typical_p).
    #[arg(long, visible_alias = "typical-p", value_name = "P", allow_negative_numbers = true,
          value_parser = setting(|c, p| c.typical_p = Some(p)))]
    pub typical: Option<f32>,
    /// Top-n-sigma: keep tokens whose logit is within N standard deviations of the
    /// best (0 or less, such as llama.cpp's default -1, is off).
    #[arg(long, visible_alias = "top-n-sigma", value_name = "N", value_parser = parse_top_n_sigma,
          allow_negative_numbers = true)]
    pub top_nsigma: Option<f32>,
    /// XTC (exclude top choices): at each step, with probability P, remove every
    /// token at least as probable as --xtc-threshold but the least probable of them.
    #[arg(long, value_name = "P", allow_negative_numbers = true,
          value_parser = setting(|c, p| c.xtc_probability = Some(p)))]
    pub xtc_probability: Option<f32>,
    /// XTC's threshold: the probability a token needs to count as a top choice
    /// [default: 0.1].
    #[arg(long, value_name = "T", allow_negative_numbers = true,
          value_parser = setting(|c, t| c.xtc_threshold = Some(t)))]
    pub xtc_threshold: Option<f32>,
    /// Epsilon sampling: remove the tokens less probable than E (HF's
    /// epsilon_cutoff; 0: off).
    #[arg(long, value_name = "E", allow_negative_numbers = true,
          value_parser = setting(|c, e| c.epsilon_cutoff = Some(e)))]
    pub epsilon_cutoff: Option<f32>,
    /// Eta sampling: remove the tokens less probable than min(E, sqrt(E)
    /// exp(-entropy)) (HF's eta_cutoff; 0: off).
    #[arg(long, value_name = "E", allow_negative_numbers = true,
          value_parser = setting(|c, e| c.eta_cutoff = Some(e)))]
    pub eta_cutoff: Option<f32>,
    /// Mirostat 1 or 2: choose among the tokens whose surprise is below a
    /// running bound, steered so the text's surprise stays near
    /// --mirostat-ent (0: off).
    #[arg(long, value_name = "N", value_parser = setting(|c, n| c.mirostat = Some(n)))]
    pub mirostat: Option<u8>,
    /// Mirostat's learning rate: how fast the bound follows the surprise
    /// [default: 0.1].
    #[arg(long, visible_alias = "mirostat-eta", value_name = "ETA", allow_negative_numbers = true,
          value_parser = setting(|c, eta| c.mirostat_eta = Some(eta)))]
    pub mirostat_lr: Option<f32>,
    /// Mirostat's target surprise (entropy) in bits [default: 5].
    #[arg(long, visible_alias = "mirostat-tau", value_name = "TAU", allow_negative_numbers = true,
          value_parser = setting(|c, tau| c.mirostat_tau = Some(tau)))]
    pub mirostat_ent: Option<f32>,
    /// Every filter leaves at least N tokens (HF's min_tokens_to_keep).
    #[arg(long, visible_alias = "min-tokens-to-keep", value_name = "N")]
    pub min_keep: Option<usize>,
    /// The stages to run after the raw logits, in this order, by
    /// llama.cpp's names separated by ; or , (e.g.
    /// "top_k;typ_p;top_p;min_p;xtc;temperature"); a stage not named does
    /// not run [default: penalties;dry;temperature;top_n_sigma;top_k;typ_p;
    /// top_p;min_p;xtc;epsilon_cutoff;eta_cutoff].
    #[arg(long, value_name = "NAMES", value_parser = parse_samplers)]
    pub samplers: Option<SamplerOrder>,
}

impl FilterArgs {
    /// `--top-k`, with 0 (off) as no filter.
    pub fn top_k(&self) -> Option<usize> {
        self.top_k.filter(|&k| k > 0)
    }

    /// The sampling configuration of these flags; every other setting is
    /// lm-decode's default.
    pub fn sampling(&self) -> SamplingConfig {
        SamplingConfig {
            temperature: self.temperature.unwrap_or(DEFAULT_TEMPERATURE),
            top_k: self.top_k(),
            top_p: self.top_p,
            min_p: self.min_p,
            typical_p: self.typical,
            top_n_sigma: self.top_nsigma.filter(|&n| n > 0.0),
            xtc_probability: self.xtc_probability,
            xtc_threshold: self.xtc_threshold,
            min_keep: self.min_keep,
            dynatemp_range: self.dynatemp_range.filter(|&r| r != 0.0),
            dynatemp_exponent: self.dynatemp_exp,
            epsilon_cutoff: self.epsilon_cutoff.filter(|&e| e != 0.0),
            eta_cutoff: self.eta_cutoff.filter(|&e| e != 0.0),
            mirostat: self.mirostat.filter(|&n| n != 0),
            mirostat_tau: self.mirostat_ent,
            mirostat_eta: self.mirostat_lr,
            order: self.samplers.clone(),
            ..SamplingConfig::default()
        }
    }
}

/// The raw-logit stage of the policy: penalties on tokens already in the
/// text and the logit bias (shared by `generate` and `chat`).
#[derive(Debug, Clone, Args)]
pub struct PenaltyArgs {
    /// Make tokens already in the text less likely (HF style; 1 is none, 1.1 is mild).
    #[arg(long, visible_alias = "repeat-penalty", value_name = "R", allow_negative_numbers = true,
          value_parser = setting(|c, r| c.repetition_penalty = Some(r)))]
    pub repetition_penalty: Option<f32>,
    /// Subtract P once from the logit of every token already in the text (OpenAI style).
    #[arg(long, value_name = "P", allow_negative_numbers = true,
          value_parser = setting(|c, p| c.presence_penalty = Some(p)))]
    pub presence_penalty: Option<f32>,
    /// Subtract P times its count from the logit of every token already in the text.
    #[arg(long, value_name = "P", allow_negative_numbers = true,
          value_parser = setting(|c, p| c.frequency_penalty = Some(p)))]
    pub frequency_penalty: Option<f32>,
    /// The penalties look at the last N tokens of the text only (0: no
    /// penalty; -1: the whole text, the default) [llama.cpp's default is 64].
    #[arg(long, value_name = "N", value_parser = parse_repeat_last_n,
          allow_negative_numbers = true)]
    pub repeat_last_n: Option<RepeatLastN>,
    /// Add BIAS to a token's logit: ID=BIAS or TOKEN_TEXT=BIAS (repeatable);
    /// BIAS -inf bans the token.
    #[arg(long, value_name = "TOKEN=BIAS", value_parser = parse_logit_bias,
          allow_hyphen_values = true)]
    pub logit_bias: Vec<LogitBiasArg>,
    /// DRY ("don't repeat yourself"): penalise a token that would extend a
    /// sequence already in the text, by M * base^(length - allowed length)
    /// (0: off).
    #[arg(long, value_name = "M", allow_negative_numbers = true,
          value_parser = setting(|c, m| c.dry_multiplier = Some(m)))]
    pub dry_multiplier: Option<f32>,
    /// DRY's base: how fast the penalty grows with the repeat's length
    /// [default: 1.75].
    #[arg(long, value_name = "B", allow_negative_numbers = true,
          value_parser = setting(|c, b| c.dry_base = Some(b)))]
    pub dry_base: Option<f32>,
    /// DRY leaves repeats up to N tokens long alone [default: 2].
    #[arg(long, value_name = "N", allow_negative_numbers = true,
          value_parser = setting(|c, n| c.dry_allowed_length = Some(n)))]
    pub dry_allowed_length: Option<usize>,
    /// DRY looks for repeats in the last N tokens (-1: the whole text, the
    /// default; 0: off) [llama.cpp's default is 64].
    #[arg(long, value_name = "N", allow_negative_numbers = true,
          value_parser = setting(|c, n| c.dry_penalty_last_n = Some(n)))]
    pub dry_penalty_last_n: Option<i64>,
    /// A text no DRY repeat extends across (repeatable; the first one given
    /// replaces the defaults \n : " *; `none` clears the list, as in
    /// llama.cpp).
    #[arg(long, value_name = "S", value_parser = parse_dry_sequence_breaker,
          allow_hyphen_values = true)]
    pub dry_sequence_breaker: Vec<String>,
    /// Never repeat an N-gram of the text: a token that would complete one
    /// already there is banned (HF's no_repeat_ngram_size; 0: off).
    #[arg(long, value_name = "N", allow_negative_numbers = true,
          value_parser = setting(|c, n| c.no_repeat_ngram_size = Some(n)))]
    pub no_repeat_ngram_size: Option<usize>,
}

impl PenaltyArgs {
    /// `config` with these flags' settings of the raw-logit stage (the
    /// penalties, their window, DRY and `--no-repeat-ngram-size`; the
    /// logit bias needs the model and is resolved by the caller).
    pub fn sampling(&self, config: SamplingConfig) -> SamplingConfig {
        SamplingConfig {
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            penalty_last_n: self.penalty_last_n(),
            dry_multiplier: self.dry_multiplier.filter(|&m| m != 0.0),
            dry_base: self.dry_base,
            dry_allowed_length: self.dry_allowed_length,
            dry_penalty_last_n: self.dry_penalty_last_n,
            dry_sequence_breakers: self.dry_sequence_breakers(),
            no_repeat_ngram_size: self.no_repeat_ngram_size.filter(|&n| n != 0),
            ..config
        }
    }

    /// The breakers of `--dry-sequence-breaker`, as llama.cpp reads them:
    /// none given keeps the default list, the first one given replaces it,
    /// and `none` empties the list so far.
    pub fn dry_sequence_breakers(&self) -> Option<Vec<String>> {
        if self.dry_sequence_breaker.is_empty() {
            return None;
        }
        let mut breakers = Vec::new();
        for breaker in &self.dry_sequence_breaker {
            if breaker == "none" {
                breakers.clear();
            } else {
                breakers.push(breaker.clone());
            }
        }
        Some(breakers)
    }

    /// The penalty window of `--repeat-last-n` (`None`: the whole text).
    pub fn penalty_last_n(&self) -> Option<usize> {
        match self.repeat_last_n {
            Some(RepeatLastN::Last(n)) => Some(n),
            Some(RepeatLastN::Whole) | None => None,
        }
    }
}

/// The policy flags `generate` and `chat` share.
#[derive(Debug, Clone, Copy)]
pub struct SamplingFlags<'a> {
    /// Temperature and the filters.
    pub filters: &'a FilterArgs,
    /// Penalties and the logit bias.
    pub penalties: &'a PenaltyArgs,
    /// `--greedy`.
    pub greedy: bool,
    /// `--seed`.
    pub seed: Option<Seed>,
}

/// `sampling_flags()` for each command that has the policy flags.
macro_rules! sampling_flags {
    ($($command:ty),*) => {$(
        impl $command {
            /// The policy flags.
            pub fn sampling_flags(&self) -> SamplingFlags<'_> {
                SamplingFlags {
                    filters: &self.filters,
                    penalties: &self.penalties,
                    greedy: self.greedy,
                    seed: self.seed,
                }
            }
        }
    )*};
}

sampling_flags!(GenerateArgs, ChatArgs);

/// `--repeat-last-n`: a window, or the whole text (`-1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RepeatLastN {
    /// The last this many tokens.
    Last(usize),
    /// The whole text.
    Whole,
}

fn parse_repeat_last_n(text: &str) -> Result<RepeatLastN, String> {
    match text.trim() {
        "-1" => Ok(RepeatLastN::Whole),
        number => number.parse().map(RepeatLastN::Last).map_err(|_| {
            format!("'{text}' is not a token count (0 or more, or -1 for the whole text)")
        }),
    }
}

/// `lm-cli generate`.
#[derive(Debug, Clone, Args)]
pub struct GenerateArgs {
    /// The model and how to run it.
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text to continue; `-` reads it from stdin. Without --prompt or
    /// --file, the prompt is read from stdin when stdin is not a terminal.
    #[arg(long, short = 'p', value_name = "TEXT", allow_hyphen_values = true)]
    pub prompt: Option<String>,
    /// Read the prompt from this file (one final newline is dropped, as
    /// llama.cpp's -f does).
    #[arg(long, short = 'f', value_name = "FILE", conflicts_with = "prompt")]
    pub file: Option<PathBuf>,
    /// Wrap the prompt as one user message in the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Read escapes in the prompt: \n \t \r \\ \" \' and \xNN (ASCII);
    /// another escape is an error (llama.cpp's -e).
    #[arg(long, short = 'e', visible_alias = "escape")]
    pub prompt_escape: bool,
    /// Keep special-token text (`<|im_start|>`) in the prompt literal, split
    /// as ordinary text, instead of reading it as the control token.
    #[arg(long, conflicts_with = "chat")]
    pub no_parse_special: bool,
    /// The most tokens to generate [default: 20].
    #[arg(long, short = 'n', visible_alias = "n-predict", value_name = "N")]
    pub max_new_tokens: Option<usize>,
    /// Temperature and the filters of the policy.
    #[command(flatten)]
    pub filters: FilterArgs,
    /// Penalties on repeated tokens and the logit bias.
    #[command(flatten)]
    pub penalties: PenaltyArgs,
    /// Do not choose an end token before N tokens are generated (HF's
    /// min_new_tokens).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub min_new_tokens: usize,
    /// Structured output: what the generated text must be.
    #[command(flatten)]
    pub structured: StructuredArgs,
    /// Always take the most probable token (same as --temperature 0).
    #[arg(long)]
    pub greedy: bool,
    /// Beam search with this many beams instead of sampling (1: no beam search).
    #[arg(long, value_name = "B", value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub num_beams: Option<u64>,
    /// Beam search length penalty alpha: score = logprob / ((5 + len) / 6)^alpha.
    #[arg(long, value_name = "ALPHA", default_value_t = 0.6,
          value_parser = parse_finite, allow_negative_numbers = true)]
    pub length_penalty: f32,
    /// Seed of the random draws (sampling only) [default: a fresh random
    /// seed, printed so the run can be replayed; also -1 or random].
    #[arg(long, short = 's', value_name = "N", value_parser = parse_seed,
          allow_negative_numbers = true)]
    pub seed: Option<Seed>,
    /// End generation when this token is chosen (repeatable; replaces the model's end tokens).
    #[arg(long, value_name = "TOKEN")]
    pub end_token: Vec<String>,
    /// Do not stop at any end token (run to a limit).
    #[arg(long, visible_alias = "ignore-eos", conflicts_with = "end_token")]
    pub no_end_token: bool,
    /// End generation when the text contains this string (repeatable).
    #[arg(long, value_name = "TEXT", value_parser = parse_stop_string)]
    pub stop: Vec<String>,
    /// How many independent samples to draw for the prompt.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub num_return_sequences: u64,
    /// Speculative decoding: draft tokens with this drafter and verify them
    /// in one pass of the model: `prompt-lookup` (copy what followed the
    /// latest earlier match of the text's last tokens), a smaller model with
    /// the same vocabulary (`FILE.gguf` or a known model's name), or a count
    /// model (`count:FILE`, an ARPA file or a corpus; its words are mapped to
    /// the model's tokens through the text). The same tokens as without it,
    /// greedy or sampled with the same seed.
    #[arg(long, value_name = "DRAFTER", value_parser = parse_drafter)]
    pub draft: Option<DrafterArg>,
    /// The most tokens --draft proposes per pass (it proposes fewer while
    /// its drafts are rejected).
    #[arg(long, value_name = "K", default_value_t = 8, requires = "draft",
          value_parser = clap::value_parser!(u64).range(1..=64))]
    pub draft_tokens: u64,
    /// Record the N most probable tokens of each step (shown with --json and --trace).
    #[arg(long, visible_alias = "n-probs", value_name = "N", default_value_t = 0)]
    pub top_logprobs: usize,
    /// What to do with a prompt longer than the context: error, or keep-head:N
    /// (keep the first N tokens and the most recent ones, leaving room for
    /// --max-new-tokens, at most half of what the head leaves).
    #[arg(long, value_name = "POLICY", default_value = "error", value_parser = parse_truncation)]
    pub truncate: Truncation,
    /// Print text as it is generated (the default, to a pipe too, so a
    /// reader that closes it stops the run); with --json, print --json-lines.
    #[arg(long, overrides_with = "no_stream")]
    pub stream: bool,
    /// Print the text only at the end (a closed pipe is then seen only at the end).
    #[arg(long)]
    pub no_stream: bool,
    /// Print a table of every step: prefix, chosen token, probabilities (in
    /// token cells a space shows as ␣, a line break as \n, a tab as \t).
    #[arg(long, conflicts_with = "json")]
    pub trace: bool,
    /// Print one JSON object with the ids, steps, stop reason and timing
    /// (each step gives its prefix_len; the prompt's ids are given once).
    /// With --stream: --json-lines.
    #[arg(long)]
    pub json: bool,
    /// Print JSON lines as the run goes: one object per step
    /// ("event": "step"), then the report without its steps ("event": "summary").
    #[arg(long, conflicts_with = "trace")]
    pub json_lines: bool,
    /// Give each JSON step its whole prefix of ids too (large: it grows with
    /// the square of the run's length).
    #[arg(long)]
    pub trace_prefixes: bool,
    /// Leave the timing out of the JSON (so runs compare byte for byte).
    #[arg(long)]
    pub no_timing: bool,
}

/// One `--logit-bias`: the token (an id, or its text) and the bias
/// (`-inf` bans it).
#[derive(Debug, Clone, PartialEq)]
pub struct LogitBiasArg {
    /// The token as typed: digits are an id, anything else the token's text.
    pub token: String,
    /// The bias: finite, or -inf.
    pub bias: f32,
}

/// `lm-cli probs`.
#[derive(Debug, Clone, Args)]
pub struct ProbsArgs {
    /// Comma-separated logits, e.g. 2,1,0 (use -inf to mask a token).
    #[arg(long, short = 'l', value_name = "LIST", value_parser = parse_logits,
          allow_hyphen_values = true)]
    pub logits: Logits,
    /// Temperature and the filters of the policy.
    #[command(flatten)]
    pub filters: FilterArgs,
    /// Print JSON: {"probs": [...]} in input order.
    #[arg(long)]
    pub json: bool,
}

/// A list of logits as typed on the command line.
#[derive(Debug, Clone, PartialEq)]
pub struct Logits(pub Vec<f32>);

const EMBED_HELP: &str = "\
EXAMPLES:
  lm-cli embed --model smollm2 --text \"A cat sat on the mat.\" --text \"A kitten rested.\"
  lm-cli embed --model smollm2 --pooling last --text \"query: what is a cat?\"

The vectors are those `lm-cli serve`'s /v1/embeddings answers (the same --pooling):
the model's final hidden states (after the final norm, before the output
projection), pooled over the text's tokens and divided by their length, so the
dot product of two is their cosine similarity.";

/// `lm-cli embed`.
#[derive(Debug, Clone, Args)]
pub struct EmbedArgs {
    /// The model and how to run it (a transformer).
    #[command(flatten)]
    pub model: ModelArgs,
    /// A text to embed; repeat for several (one vector each, in order).
    #[arg(
        long,
        short = 't',
        value_name = "TEXT",
        required = true,
        allow_hyphen_values = true
    )]
    pub text: Vec<String>,
    /// How the token rows become one vector: mean, last or cls (the first
    /// row; a decoder's first row saw only the first token).
    #[arg(long, value_name = "POOLING", default_value_t = lm::Pooling::Mean)]
    pub pooling: lm::Pooling,
}

/// `lm-cli score`.
#[derive(Debug, Clone, Args)]
pub struct ScoreArgs {
    /// The model and how to run it.
    #[command(flatten)]
    pub model: ModelArgs,
    /// The context the continuation follows [default: none, the
    /// continuation is scored from the document start: BOS, or
    /// <|endoftext|> where BOS opens a chat turn].
    #[arg(
        long,
        short = 'p',
        value_name = "TEXT",
        requires = "continuation",
        allow_hyphen_values = true
    )]
    pub prompt: Option<String>,
    /// The tokens to score.
    #[arg(long, value_name = "TEXT", allow_hyphen_values = true)]
    pub continuation: Option<String>,
    /// A whole sentence to score as KenLM's query does (count models only).
    #[arg(long, value_name = "TEXT", conflicts_with_all = ["prompt", "continuation"],
          required_unless_present_any = ["continuation", "file"], allow_hyphen_values = true)]
    pub text: Option<String>,
    /// The perplexity of a whole file: each line a sentence for a count
    /// model (KenLM's query), the whole text from its first token for any
    /// other (from the document start when the model has one).
    #[arg(long, short = 'f', value_name = "FILE",
          conflicts_with_all = ["prompt", "continuation", "text"])]
    pub file: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `lm-cli enumerate`.
#[derive(Debug, Clone, Args)]
pub struct EnumerateArgs {
    /// The model and how to run it.
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text to continue.
    #[arg(long, short = 'p', value_name = "TEXT", allow_hyphen_values = true)]
    pub prompt: String,
    /// How many tokens each continuation has.
    #[arg(long, value_name = "N")]
    pub steps: usize,
    /// How many of the best continuations to show (0: all).
    #[arg(long, value_name = "M", default_value_t = 10)]
    pub top: usize,
    /// Refuse when there would be more continuations than this.
    #[arg(long, value_name = "N", default_value_t = 1_000_000)]
    pub limit: usize,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `lm-cli tokenize`.
#[derive(Debug, Clone, Args)]
pub struct TokenizeArgs {
    /// The model and how to run it.
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text to split; `-` reads it from stdin, as does no --text when
    /// stdin is not a terminal (one final newline dropped, as `generate`).
    #[arg(long, value_name = "TEXT", allow_hyphen_values = true)]
    pub text: Option<String>,
    /// Split the text as one user message in the model's chat template (the
    /// prompt `generate --chat` reads).
    #[arg(long)]
    pub chat: bool,
    /// Keep special-token text (`<|im_start|>`) in the text literal, split
    /// as ordinary text, instead of reading it as the control token.
    #[arg(long, conflicts_with = "chat")]
    pub no_parse_special: bool,
    /// Print JSON: {"ids": [...], "tokens": [...]}.
    #[arg(long)]
    pub json: bool,
}

/// `lm-cli train`.
#[derive(Debug, Clone, Args)]
pub struct TrainArgs {
    /// The corpus: UTF-8 text, one sentence per line.
    #[arg(long, value_name = "FILE")]
    pub corpus: PathBuf,
    /// The n-gram order: 2 for bigrams, 3 for trigrams, ...
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub order: usize,
    /// How probabilities are estimated from counts.
    #[arg(long, value_enum, default_value_t = SmoothingArg::KneserNey)]
    pub smoothing: SmoothingArg,
    /// The pseudo-count of add-k smoothing.
    #[arg(long, value_name = "K", default_value_t = 1.0, value_parser = parse_finite_f64)]
    pub k: f64,
    /// Use KenLM's fallback discounts when the corpus is too small to estimate them.
    #[arg(long)]
    pub discount_fallback: bool,
    /// Where to write the ARPA file (`-`: stdout). A symlink is followed, a
    /// device or FIFO written through, the corpus itself refused.
    #[arg(long, short = 'o', value_name = "FILE.arpa")]
    pub out: PathBuf,
}

/// The estimators `train` offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SmoothingArg {
    /// Relative frequencies (unseen continuations get probability 0).
    Mle,
    /// Add k to every count (k = 1 is Laplace smoothing).
    AddK,
    /// Interpolated modified Kneser-Ney, as KenLM's lmplz estimates it.
    KneserNey,
}

/// `lm-cli chat`. The policy flags are `generate`'s, with chat defaults
/// where neither the flags nor a Hugging Face directory's
/// generation_config.json set them: temperature 0.7 and top-p 0.9
/// ([`CHAT_TEMPERATURE`], [`CHAT_TOP_P`]).
#[derive(Debug, Clone, Args)]
pub struct ChatArgs {
    /// The model and how to run it.
    #[command(flatten)]
    pub model: ModelArgs,
    /// A system message to start the conversation with (`/system TEXT`
    /// changes it during the chat).
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    /// The most tokens per reply.
    #[arg(
        long,
        short = 'n',
        visible_alias = "n-predict",
        value_name = "N",
        default_value_t = 256
    )]
    pub max_new_tokens: usize,
    /// Temperature and the filters of the policy.
    #[command(flatten)]
    pub filters: FilterArgs,
    /// Penalties on repeated tokens and the logit bias.
    #[command(flatten)]
    pub penalties: PenaltyArgs,
    /// Do not end a reply before N tokens.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub min_new_tokens: usize,
    /// Always take the most probable token (same as --temperature 0).
    #[arg(long)]
    pub greedy: bool,
    /// Seed of the random draws [default: a fresh random seed, printed so
    /// the chat can be replayed; also -1 or random].
    #[arg(long, short = 's', value_name = "N", value_parser = parse_seed,
          allow_negative_numbers = true)]
    pub seed: Option<Seed>,
    /// Read special-token text in your messages (`<|im_start|>`) as control
    /// tokens. Off by default, so a message cannot open a turn of its own.
    #[arg(long)]
    pub parse_special: bool,
    /// Print the conversation as JSON at the end (the replies are not
    /// streamed): each message, and each reply's tokens and stop reason.
    #[arg(long)]
    pub json: bool,
    /// Save the conversation and the model's KV state to FILE after each reply, and resume
    /// from it at start (llama.cpp's --prompt-cache): the first reply reads only the new
    /// message. A file of another model or KV type is refused with a note and left alone.
    #[arg(long, value_name = "FILE")]
    pub session: Option<std::path::PathBuf>,
    /// Structured output: what each reply must be.
    #[command(flatten)]
    pub structured: StructuredArgs,
}

/// `lm-cli serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// The models and how to run them.
    #[command(flatten)]
    pub model: ServeModelArgs,
    /// The address to listen on (loopback by default: reachable only from this machine).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1")]
    pub host: std::net::IpAddr,
    /// The port to listen on (0: any free port, printed at start).
    #[arg(long, value_name = "PORT", default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on every endpoint but /health. The
    /// environment variable LM_API_KEY gives it too, so the key need not
    /// appear in `ps` or the shell history (the flag wins over it).
    #[arg(long, value_name = "KEY", env = "LM_API_KEY", hide_env_values = true,
          value_parser = parse_api_key)]
    pub api_key: Option<String>,
    /// Let browser pages from ORIGIN (`https://app.example`; repeat for more, or `*` for any)
    /// call the API: preflight OPTIONS is answered without the key, and answers carry
    /// Access-Control-Allow-Origin. Off by default.
    #[arg(long, value_name = "ORIGIN", value_parser = parse_cors_origin)]
    pub cors: Vec<String>,
    /// Sequences generated at once, in one batch (a request's `n` counts each).
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub parallel: u64,
    /// Sequences that may wait for a free slot; beyond, requests get 429 with Retry-After.
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub queue: u64,
    /// The largest request body accepted (bytes); a larger one gets 413.
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 20, value_parser = clap::value_parser!(u64).range(1..=(1 << 30)))]
    pub max_body_bytes: u64,
    /// Seconds to let running requests finish after Ctrl-C or SIGTERM.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0, value_parser = parse_grace)]
    pub shutdown_grace: f64,
    /// Read prompts in chunks of this many tokens, one chunk per batch step.
    #[arg(long, value_name = "N", default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub prefill_chunk: u64,
    /// Keep finished sequences' KV states up to this many MiB, least recently used dropped
    /// first: a request whose prompt starts with a kept sequence (the next chat turn) reads only
    /// its new tokens. 0 turns the cache off.
    #[arg(long, value_name = "MIB", default_value_t = 256, value_parser = clap::value_parser!(u64).range(0..=(1 << 20)))]
    pub cache_mb: u64,
    /// Read special-token text in chat message contents (`<|im_start|>`) as control tokens.
    /// Off by default, so a client cannot open a turn of its own.
    #[arg(long)]
    pub parse_special: bool,
    /// Answer requests whatever `model` they name (by default another name is a 404
    /// `model_not_found`).
    #[arg(long)]
    pub any_model: bool,
    /// The most compiled `response_format`s alive at once, kept or used by running requests
    /// (about 100 MB each on Gemma 3, a few MB on SmolLM2); a request needing one more gets 429.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub max_formats: u64,
    /// Do not serve the chat page at / (then / is a 404).
    #[arg(long)]
    pub no_webui: bool,
    /// Keep the prefix cache's KV states in DIR across restarts: read at start (a file of
    /// another model, precision or format is refused with a warning), written on shutdown and
    /// on POST /slots/save. Transformer models only.
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<std::path::PathBuf>,
    /// How /v1/embeddings pools a text's final hidden states: mean, last or
    /// cls (mean by default for these decoder models; see docs/serving.md).
    #[arg(long, value_name = "POOLING", default_value_t = lm::Pooling::Mean)]
    pub pooling: lm::Pooling,
    /// Split a thinking chat template's `<think>...</think>` out of replies into
    /// `reasoning_content` (auto, for templates that write `<think>`), or leave the
    /// text whole in `content` (off).
    #[arg(long, value_name = "MODE", default_value = "auto", value_parser = ["auto", "off"])]
    pub reasoning: String,
    /// Speculative decoding for every request: `prompt-lookup` drafts the tokens that
    /// followed the latest earlier match of a sequence's last tokens, and the model verifies
    /// them in one pass; greedy answers keep their ids, sampled ones their distribution
    /// (a draft model is `generate --draft`'s only).
    #[arg(long, value_name = "DRAFTER", value_parser = parse_drafter)]
    pub draft: Option<DrafterArg>,
    /// The most tokens --draft proposes per pass (it proposes fewer while its drafts are
    /// rejected).
    #[arg(long, value_name = "K", default_value_t = 8, requires = "draft",
          value_parser = clap::value_parser!(u64).range(1..=64))]
    pub draft_tokens: u64,
    /// Unload a model no request has used for SECONDS (its weights and caches freed); the next
    /// request naming it loads it again and waits for the load. Off by default.
    #[arg(long, value_name = "SECONDS",
          value_parser = clap::value_parser!(u64).range(1..=MAX_IDLE_UNLOAD_SECONDS))]
    pub idle_unload: Option<u64>,
}

/// The longest `--idle-unload`: 30 days.
const MAX_IDLE_UNLOAD_SECONDS: u64 = 30 * 24 * 3600;

/// `serve`'s models: [`ModelArgs`] with `--model` repeatable, each value a
/// model as `--model` names one, or `ID=SPEC` to serve it as ID.
#[derive(Debug, Clone)]
pub struct ServeModelArgs {
    /// The models in the order given (empty: the default model).
    pub models: Vec<ServedModelArg>,
    /// The other model flags, the same for every model (`model` is `None`).
    pub options: ModelArgs,
}

/// One `serve --model` value.
#[derive(Debug, Clone, PartialEq)]
pub struct ServedModelArg {
    /// The id `ID=SPEC` gives; `None`: the server's own (a name, or a file's stem).
    pub id: Option<String>,
    /// The model.
    pub spec: ModelSpec,
}

impl ServeModelArgs {
    /// Each model's flags: `options` with its `--model`, and the id given.
    pub fn each(&self) -> Vec<(Option<String>, ModelArgs)> {
        let with = |spec: Option<ModelSpec>| ModelArgs {
            model: spec,
            ..self.options.clone()
        };
        if self.models.is_empty() {
            return vec![(None, with(None))];
        }
        self.models
            .iter()
            .map(|served| (served.id.clone(), with(Some(served.spec.clone()))))
            .collect()
    }
}

impl clap::FromArgMatches for ServeModelArgs {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        Self::from_arg_matches_mut(&mut matches.clone())
    }

    fn from_arg_matches_mut(matches: &mut clap::ArgMatches) -> Result<Self, clap::Error> {
        let models = matches
            .remove_many::<ServedModelArg>("model")
            .map(Iterator::collect)
            .unwrap_or_default();
        let options = ModelArgs::from_arg_matches_mut(matches)?;
        Ok(Self { models, options })
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl Args for ServeModelArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        ModelArgs::augment_args(cmd).mut_arg("model", serve_model_arg)
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        ModelArgs::augment_args_for_update(cmd).mut_arg("model", serve_model_arg)
    }
}

/// `--model` as `serve` takes it: repeatable, `[ID=]SPEC`.
fn serve_model_arg(arg: clap::Arg) -> clap::Arg {
    arg.action(clap::ArgAction::Append)
        .value_parser(parse_served_model)
        .value_name("[ID=]SPEC")
        .help(
            "The model: toy, count:FILE, FILE.gguf or a known model's NAME (see MODELS in \
             `lm-cli --help`); default: the embedded KJV trigram model. Repeat to serve several, \
             each as its NAME or file stem, or as ID with ID=SPEC; a request's `model` picks one \
             (none: the first)",
        )
}

/// A `serve --model` value: `ID=SPEC` when there is an `=` with no path
/// before it and the whole is no file, else a SPEC alone.
fn parse_served_model(text: &str) -> Result<ServedModelArg, String> {
    let named = text
        .split_once('=')
        .filter(|(id, _)| !id.is_empty() && !id.contains(std::path::is_separator))
        .filter(|_| !std::path::Path::new(text).exists());
    let (id, spec) = match named {
        Some((id, spec)) => (Some(id.to_owned()), spec),
        None => (None, text),
    };
    let spec = spec.parse::<ModelSpec>().map_err(|e| e.to_string())?;
    Ok(ServedModelArg { id, spec })
}

/// `--api-key` and `LM_API_KEY`: any text but the empty one (which would
/// let a bare `Bearer` in; unset the variable to serve without a key).
fn parse_api_key(text: &str) -> Result<String, String> {
    non_empty(
        text,
        "the API key must not be empty (unset LM_API_KEY to serve without one)",
    )
}

/// `text`, or `refusal` when it is empty.
fn non_empty(text: &str, refusal: &str) -> Result<String, String> {
    if text.is_empty() {
        Err(refusal.to_owned())
    } else {
        Ok(text.to_owned())
    }
}

/// `--cors`: `*` or an origin as browsers send it (`https://app.example`).
fn parse_cors_origin(text: &str) -> Result<String, String> {
    if lm_serve::is_cors_origin(text) {
        Ok(text.to_owned())
    } else {
        Err("expected '*' or an origin: scheme://host[:port], without a path".to_owned())
    }
}

/// `--shutdown-grace`: a finite number of seconds, 0 or more.
fn parse_grace(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if s.is_finite() && (0.0..=86_400.0).contains(&s) => Ok(s),
        _ => Err(format!(
            "'{text}' is not a number of seconds between 0 and 86400"
        )),
    }
}

/// `lm-cli completions`.
#[derive(Debug, Clone, Args)]
pub struct CompletionsArgs {
    /// The shell to write the script for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// `--seed`: a number to replay a run, or a fresh random seed (`-1` or
/// `random`, as llama.cpp's `-1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seed {
    /// This seed.
    Fixed(u64),
    /// A seed drawn at start.
    Random,
}

impl Seed {
    /// The seed to run with: the fixed one, or a fresh one
    /// ([`SamplingConfig::fresh_seed`]).
    pub fn resolve(self) -> u64 {
        match self {
            Self::Fixed(seed) => seed,
            Self::Random => SamplingConfig::fresh_seed(),
        }
    }
}

fn parse_seed(text: &str) -> Result<Seed, String> {
    match text.trim() {
        "-1" | "random" => Ok(Seed::Random),
        number => number.parse().map(Seed::Fixed).map_err(|_| {
            format!("'{text}' is not a seed (a number from 0 to 2^64 - 1, -1 or random)")
        }),
    }
}

/// Flags that cannot be used together, or a flag the chosen model cannot
/// honour: a usage error (exit code 2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsageError {
    /// A structured-output format the engine refuses (its message quoted).
    #[error("{flag}: {message}")]
    OutputFormat {
        /// The flag that gave the format.
        flag: &'static str,
        /// What was wrong, in the engine's words.
        message: String,
    },

    /// `--stop` with `--num-beams`.
    #[error("--stop does not work with --num-beams (beam search has no text to watch)")]
    StopWithBeams,
    /// `--draft` with `--num-beams`.
    #[error(
        "--draft does not work with --num-beams (speculative decoding verifies one sequence's drafts)"
    )]
    DraftWithBeams,
    /// `--num-return-sequences` with `--num-beams`.
    #[error("--num-return-sequences does not work with --num-beams (every beam is reported)")]
    SequencesWithBeams,
    /// A sampling flag with `--num-beams`: beam search draws nothing and
    /// ranks hypotheses by their log-probability under the model, after the
    /// penalties and logit bias (which it applies, as `--top-logprobs`).
    #[error(
        "{flag} does not work with --num-beams (beam search draws nothing: it ranks hypotheses by their log-probability, after the penalties and logit bias)"
    )]
    FlagIgnoredByBeams {
        /// The flag given.
        flag: &'static str,
    },
    /// `--trace-prefixes` without JSON output.
    #[error("--trace-prefixes needs --json or --json-lines")]
    PrefixesWithoutJson,
    /// `score --text` with a model that is not a count model.
    #[error(
        "--text scores a sentence with a count model (count:FILE or the default); \
         for the {model} model use --prompt and --continuation"
    )]
    TextNeedsCountModel {
        /// The kind of model given.
        model: &'static str,
    },
    /// `--prompt-escape` met an escape it does not know.
    #[error("--prompt-escape: {0}")]
    PromptEscape(crate::text::EscapeError),
    /// `tokenize` without --text or text on stdin.
    #[error("no text: give --text TEXT, or pipe text on stdin")]
    NoText,
    /// `generate` without --prompt, --file or text on stdin.
    #[error("no prompt: give --prompt TEXT, --file FILE, or pipe text on stdin")]
    NoPrompt,
    /// A `--logit-bias` token the model does not have.
    #[error(
        "--logit-bias: '{token}' is not one token of the {model} model (vocabulary size {vocab_size})"
    )]
    UnknownBiasToken {
        /// The token as typed.
        token: String,
        /// The kind of model.
        model: &'static str,
        /// The model's vocabulary size.
        vocab_size: usize,
    },
    /// `train --order` outside 1..=MAX_ORDER.
    #[error("--order must be between 1 and {max}, got {order}")]
    InvalidOrder {
        /// The order given.
        order: usize,
        /// The largest order supported.
        max: usize,
    },
}

fn parse_number<T: std::str::FromStr>(text: &str) -> Result<T, String> {
    text.trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a number"))
}

/// Parses a number and checks it with [`SamplingConfig::validate`] as the
/// setting `set` writes it, so the CLI rejects exactly what the library
/// rejects, with the library's message.
fn parse_setting<T>(text: &str, set: impl Fn(&mut SamplingConfig, T)) -> Result<T, String>
where
    T: std::str::FromStr + Copy,
{
    let value = parse_number(text)?;
    check_setting(|config| set(config, value))?;
    Ok(value)
}

/// The value parser of a policy flag that is one setting of
/// [`SamplingConfig`]: [`parse_setting`] with the setting `set` writes
/// (`setting(|c, p| c.top_p = Some(p))`), so each such flag names its field
/// where it is declared instead of through a parser of its own.
fn setting<T>(
    set: fn(&mut SamplingConfig, T),
) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static
where
    T: std::str::FromStr + Copy + 'static,
{
    move |text| parse_setting(text, set)
}

/// Checks the setting `set` writes with [`SamplingConfig::validate`].
fn check_setting(set: impl FnOnce(&mut SamplingConfig)) -> Result<(), String> {
    let mut config = SamplingConfig::default();
    set(&mut config);
    config.validate().map_err(|refused| refused.to_string())
}

/// A `--top-k`: 0 is off (kept as 0 here, no filter in [`FilterArgs::top_k`]).
fn parse_top_k(text: &str) -> Result<usize, String> {
    match parse_number::<usize>(text)? {
        0 => Ok(0),
        _ => parse_setting(text, |config, k| config.top_k = Some(k)),
    }
}

/// A `--top-nsigma`: 0 or less is off (kept here, no filter in
/// [`FilterArgs::sampling`]), as in llama.cpp (whose default is -1).
fn parse_top_n_sigma(text: &str) -> Result<f32, String> {
    match parse_number::<f32>(text)? {
        n if n <= 0.0 && n.is_finite() => Ok(n),
        _ => parse_setting(text, |config, n| config.top_n_sigma = Some(n)),
    }
}

/// A `--samplers` order: each name known, none twice, the raw-logit
/// stages first.
fn parse_samplers(text: &str) -> Result<SamplerOrder, String> {
    let Ok(order) = text.parse::<SamplerOrder>();
    check_setting(|config| config.order = Some(order.clone()))?;
    Ok(order)
}

/// A `--dry-sequence-breaker`: any text but the empty one (`none` is
/// kept, and read by [`PenaltyArgs::dry_sequence_breakers`]).
fn parse_dry_sequence_breaker(text: &str) -> Result<String, String> {
    check_setting(|config| config.dry_sequence_breakers = Some(vec![text.to_owned()]))?;
    Ok(text.to_owned())
}

/// Parses `ID=BIAS` or `TOKEN_TEXT=BIAS` (split at the last `=`, so a
/// token text may contain one); the bias is finite or `-inf`.
fn parse_logit_bias(text: &str) -> Result<LogitBiasArg, String> {
    let (token, bias) = text
        .rsplit_once('=')
        .ok_or_else(|| format!("'{text}' is not TOKEN=BIAS (e.g. 42=-2.5 or hello=-inf)"))?;
    if token.is_empty() {
        return Err(format!("'{text}' names no token (expected TOKEN=BIAS)"));
    }
    let bias: f32 = parse_number(bias)?;
    if bias.is_nan() || bias == f32::INFINITY {
        return Err(format!("the bias must be finite or -inf, got {bias}"));
    }
    Ok(LogitBiasArg {
        token: token.to_owned(),
        bias,
    })
}

/// A stop string: an empty one would match before any text, so it is a
/// usage error here, before anything is printed.
fn parse_stop_string(text: &str) -> Result<String, String> {
    non_empty(
        text,
        "a stop string must not be empty (it would match before any text)",
    )
}

fn parse_finite(text: &str) -> Result<f32, String> {
    let value: f32 = parse_number(text)?;
    if value.is_finite() {
        Ok(value)
    } else {
        Err(format!("must be a finite number, got {value}"))
    }
}

fn parse_finite_f64(text: &str) -> Result<f64, String> {
    let value: f64 = parse_number(text)?;
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(format!("must be a positive finite number, got {value}"))
    }
}

/// Parses `2,1,0` (spaces allowed; `-inf` masks a token).
fn parse_logits(text: &str) -> Result<Logits, String> {
    let mut logits = Vec::new();
    for (index, item) in text.split(',').enumerate() {
        let item = item.trim();
        let value: f32 = item.parse().map_err(|_| {
            format!(
                "logit {} is '{item}', not a number (expected a list like 2,1,0)",
                index + 1
            )
        })?;
        if value.is_nan() || value == f32::INFINITY {
            return Err(format!(
                "logit {} is {value}; logits must be finite or -inf",
                index + 1
            ));
        }
        logits.push(value);
    }
    Ok(Logits(logits))
}

/// A `--draft` drafter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrafterArg {
    /// `prompt-lookup`: lm-decode's `PromptLookup`.
    PromptLookup,
    /// A draft model, by the same specs as `--model` (a GGUF file, a known
    /// model, `count:FILE`).
    Model(ModelSpec),
}

impl std::fmt::Display for DrafterArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::PromptLookup => f.write_str("prompt-lookup"),
            Self::Model(spec) => write!(f, "{spec}"),
        }
    }
}

/// Parses a `--draft` drafter: `prompt-lookup` or a model spec.
fn parse_drafter(text: &str) -> Result<DrafterArg, String> {
    if text == "prompt-lookup" {
        return Ok(DrafterArg::PromptLookup);
    }
    text.parse().map(DrafterArg::Model).map_err(|_| {
        format!("'{text}' is not a drafter (expected prompt-lookup, FILE.gguf, a known model or count:FILE)")
    })
}

/// Parses `error` or `keep-head:N`.
fn parse_truncation(text: &str) -> Result<Truncation, String> {
    if text == "error" {
        return Ok(Truncation::Refuse);
    }
    let n_head = text.strip_prefix("keep-head:").ok_or_else(|| {
        format!("'{text}' is not a truncation policy (expected error or keep-head:N)")
    })?;
    let n_head = n_head
        .parse()
        .map_err(|_| format!("keep-head:{n_head}: '{n_head}' is not a token count"))?;
    Ok(Truncation::KeepHead { n_head })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn logits_parse_and_name_the_bad_item() {
        assert_eq!(parse_logits("2, 1,0"), Ok(Logits(vec![2.0, 1.0, 0.0])));
        assert_eq!(
            parse_logits("-inf,1").map(|l| l.0[0]),
            Ok(f32::NEG_INFINITY)
        );
        let error = parse_logits("2,x").unwrap_err();
        assert!(error.contains("logit 2 is 'x'"), "{error}");
        assert!(parse_logits("1,nan").is_err());
        assert!(parse_logits("").is_err());
    }

    #[test]
    fn logit_biases_parse_with_bans_and_token_texts() {
        let bias = |token: &str, bias: f32| {
            Ok(LogitBiasArg {
                token: token.to_owned(),
                bias,
            })
        };
        assert_eq!(parse_logit_bias("42=-2.5"), bias("42", -2.5));
        assert_eq!(parse_logit_bias("a=b=1"), bias("a=b", 1.0));
        assert_eq!(parse_logit_bias("the=-inf"), bias("the", f32::NEG_INFINITY));
        assert!(parse_logit_bias("42").unwrap_err().contains("TOKEN=BIAS"));
        assert!(
            parse_logit_bias("=1")
                .unwrap_err()
                .contains("names no token")
        );
        assert!(
            parse_logit_bias("1=inf")
                .unwrap_err()
                .contains("finite or -inf")
        );
        assert!(parse_logit_bias("1=nan").is_err());
    }

    /// Each setting of the policy with a value the CLI takes and one it
    /// refuses; a new setting must be added here.
    fn cli_examples(field: &str) -> Option<(&'static str, &'static str)> {
        Some(match field {
            "repetition_penalty" => ("1.1", "0"),
            "presence_penalty" => ("0.5", "inf"),
            "frequency_penalty" => ("0.5", "nan"),
            "penalty_last_n" => ("16", "-2"),
            "logit_bias" => ("1=0.5", "1=inf"),
            "banned_tokens" => ("1=-inf", "1=nan"),
            "temperature" => ("0.7", "-1"),
            "top_k" => ("40", "-1"),
            "top_p" => ("0.9", "1.5"),
            "min_p" => ("0.05", "1.5"),
            "typical_p" => ("0.9", "1.5"),
            "top_n_sigma" => ("1.5", "nan"),
            "xtc_probability" => ("0.5", "1.5"),
            "xtc_threshold" => ("0.1", "-0.5"),
            "min_keep" => ("2", "-1"),
            "dry_multiplier" => ("0.8", "-1"),
            "dry_base" => ("1.75", "0.5"),
            "dry_allowed_length" => ("2", "-1"),
            "dry_penalty_last_n" => ("-1", "-2"),
            "dry_sequence_breakers" => ("none", ""),
            "no_repeat_ngram_size" => ("3", "-1"),
            "dynatemp_range" => ("0.5", "-0.5"),
            "dynatemp_exponent" => ("1.5", "-1"),
            "epsilon_cutoff" => ("0.0003", "1"),
            "eta_cutoff" => ("0.002", "1.5"),
            "mirostat" => ("2", "3"),
            "mirostat_tau" => ("5", "-1"),
            "mirostat_eta" => ("0.1", "-0.1"),
            "order" => ("top_k;typ_p;temperature", "top_k;top_k"),
            "seed" => ("7", "x"),
            _ => return None,
        })
    }

    #[test]
    fn every_sampling_setting_has_a_flag_in_generate_and_chat() {
        let mut cli = Cli::command();
        for command in ["generate", "chat"] {
            let help = cli
                .find_subcommand_mut(command)
                .unwrap()
                .render_long_help()
                .to_string();
            for field in SamplingConfig::FIELDS {
                assert!(
                    help.contains(field.flag),
                    "{command} --help has no {} (for {})",
                    field.flag,
                    field.name
                );
                let (good, bad) = cli_examples(field.name)
                    .unwrap_or_else(|| panic!("no CLI example for {}: add one", field.name));
                let parse = |value| Cli::try_parse_from(["lm-cli", command, field.flag, value]);
                assert!(parse(good).is_ok(), "{command} {} {good}", field.flag);
                assert!(parse(bad).is_err(), "{command} {} {bad}", field.flag);
            }
        }
    }

    #[test]
    fn truncation_policies_parse() {
        assert_eq!(parse_truncation("error"), Ok(Truncation::Refuse));
        assert_eq!(
            parse_truncation("keep-head:3"),
            Ok(Truncation::KeepHead { n_head: 3 })
        );
        assert!(parse_truncation("keep-head:x").is_err());
        assert!(parse_truncation("drop").is_err());
    }
}

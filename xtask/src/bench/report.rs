//! The bench's report: per model, the machine (with its read bandwidth),
//! a table of ours and llama.cpp's speeds with their ratio and decode's
//! share of its bandwidth bound, and the peak RSS against issue 35's
//! budget; with several models, each one's speed over the first's.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Result;

use super::bandwidth;
use super::footprint::{Footprint, RSS_MARGIN};
use super::{Metric, N_DECODE_NEW, Options, PREFILL_PIECE, Row, Samples, machine, median};

/// Bytes in the report's megabytes.
const MB: f64 = 1e6;

/// One model's section: the machine and the date, speeds with ratios and
/// decode against its bound, peak RSS against the budget.
pub(super) fn report(
    model: &Path,
    options: &Options,
    with_peer: bool,
    rows: &[Row],
) -> Result<String> {
    let mut out = String::new();
    let footprint = Footprint::of(model)?;
    writeln!(
        out,
        "\nmodel {} ({:.1} MB); {}",
        model.file_name().unwrap_or_default().to_string_lossy(),
        footprint.file_bytes as f64 / MB,
        utc_date(),
    )?;
    let ours_system = rows
        .iter()
        .map(|r| r.ours.system.as_str())
        .find(|s| !s.is_empty());
    let peer_system = rows
        .iter()
        .map(|r| r.peer.system.as_str())
        .find(|s| !s.is_empty());
    out.push_str(&machine::describe(
        ours_system,
        peer_system.filter(|_| with_peer),
        bandwidth_line(rows).as_deref(),
    ));
    writeln!(
        out,
        "median of {} interleaved rounds; decode: {N_DECODE_NEW} tokens after the prompt; prefill: the prompt into an empty cache, read in pieces of {PREFILL_PIECE}",
        options.rounds.runs
    )?;
    let experts = match footprint.config.options.moe {
        Some(moe) => format!(
            ", of the experts the {} a token runs of {}",
            moe.n_expert_used, moe.n_expert
        ),
        None => String::new(),
    };
    writeln!(
        out,
        "decode bound: read bandwidth / bytes per token ({:.1} MB of weights: {}{experts}; + the KV cache attended to at the middle token)\n",
        footprint.weight_bytes_per_token as f64 / MB,
        if footprint.config.tied_output {
            "every tensor, the token embedding table read whole as the tied output"
        } else {
            "all but the token embedding table, of which one row"
        }
    )?;
    writeln!(
        out,
        "| threads | phase   | prompt | lm tok/s | llama.cpp tok/s | ratio | lm / bound |"
    )?;
    writeln!(
        out,
        "|--------:|---------|-------:|---------:|----------------:|------:|-----------:|"
    )?;
    for row in rows {
        for metric in options.metrics() {
            out.push_str(&table_line(row, metric, &footprint));
        }
    }
    out.push_str(&rss_lines(&footprint, options, with_peer, rows));
    Ok(out)
}

/// The read bandwidth's line: each row's readings, one per round.
fn bandwidth_line(rows: &[Row]) -> Option<String> {
    let buffer_bytes = rows.iter().flat_map(|r| &r.bandwidth).next()?.buffer_bytes;
    let readings: Vec<(usize, Vec<f64>)> = rows
        .iter()
        .map(|row| (row.n_threads, row_rates(row)))
        .collect();
    Some(bandwidth::readings_line(&readings, buffer_bytes))
}

/// The read bandwidth at `row`'s thread count in each round, bytes per
/// second.
fn row_rates(row: &Row) -> Vec<f64> {
    row.bandwidth
        .iter()
        .filter_map(|b| b.at(row.n_threads))
        .collect()
}

/// One line of the table: `row`'s figures at `metric`.
fn table_line(row: &Row, metric: Metric, footprint: &Footprint) -> String {
    let (ours, peer) = (row.ours.tok_per_s(metric), row.peer.tok_per_s(metric));
    let cell = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
    let ratio = ours
        .zip(peer)
        .map_or("-".to_owned(), |(a, b)| format!("{:.2}x", a / b));
    let (phase, prompt) = metric.phase_and_prompt();
    let of_bound = match metric {
        Metric::Decode(n_prompt) => {
            let bytes = footprint.bytes_per_token(n_prompt + N_DECODE_NEW / 2) as f64;
            share_of_bound(&row.ours, metric, &row_rates(row), bytes)
        }
        Metric::Prefill(_) => None,
    };
    let of_bound = of_bound.map_or("-".to_owned(), |(share, bound)| {
        format!("{:.0}% of {bound:.1}", 100.0 * share)
    });
    format!(
        "| {} | {phase:<7} | {prompt} | {} | {} | {ratio} | {of_bound} |\n",
        row.n_threads,
        cell(ours),
        cell(peer)
    )
}

/// Decode's share of its bound (`rates` bytes per second, one reading per
/// round, over `bytes` per token), round by round, and the bound: the
/// medians over the rounds. Each round's run is set against the reading
/// taken just before it, so a host whose bandwidth drifts between rounds
/// moves the bound with the speed.
fn share_of_bound(ours: &Samples, metric: Metric, rates: &[f64], bytes: f64) -> Option<(f64, f64)> {
    let seconds = ours.seconds.get(&metric.key())?;
    let bounds: Vec<f64> = rates.iter().map(|rate| rate / bytes).collect();
    let shares: Vec<f64> = seconds
        .iter()
        .zip(&bounds)
        .map(|(seconds, bound)| metric.n_tokens() as f64 / seconds / bound)
        .collect();
    Some((median(&shares)?, median(&bounds)?))
}

/// Our peak RSS against the budget for the longest run (and llama.cpp's).
fn rss_lines(footprint: &Footprint, options: &Options, with_peer: bool, rows: &[Row]) -> String {
    let mut out = String::new();
    let n_positions = options.longest_run();
    let kv_bytes = footprint.kv_bytes_stored(n_positions);
    let budget = footprint.rss_budget(n_positions);
    if let Some(rss) = rows.iter().filter_map(|r| r.ours.max_rss_bytes()).max() {
        out.push_str(&format!(
            "\npeak RSS: lm {:.1} MB, {} the budget of {:.1} MB = {RSS_MARGIN} x (file {:.1} MB + KV cache {:.1} MB: {}, {n_positions} positions)\n",
            rss as f64 / MB,
            if (rss as f64) <= budget {
                "within"
            } else {
                "OVER"
            },
            budget / MB,
            footprint.file_bytes as f64 / MB,
            kv_bytes as f64 / MB,
            footprint.kv_type(),
        ));
    }
    let peer_rss = rows.iter().filter_map(|r| r.peer.max_rss_bytes()).max();
    if let Some(rss) = peer_rss.filter(|_| with_peer) {
        out.push_str(&format!(
            "peak RSS: llama.cpp {:.1} MB (python process with numpy and llama-cpp-python)\n",
            rss as f64 / MB
        ));
    }
    out
}

/// Each model's speed over the first model's, ours and llama.cpp's, at each
/// thread count and metric: the median over rounds of the ratio within a
/// round (the models of a round run back to back, so a host's slow drift
/// cancels; issue 12 asks Q4_K_M decode within 10% of Q4_1's).
pub(super) fn between_models(
    models: &[PathBuf],
    rows: &[Vec<Row>],
    metrics: &[Metric],
) -> Result<String> {
    let name = |model: &PathBuf| {
        model
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned()
    };
    let mut out = String::new();
    writeln!(
        out,
        "\nspeed over {} (median of each round's ratio)\n",
        name(&models[0])
    )?;
    writeln!(out, "| model | threads | phase | prompt | lm | llama.cpp |")?;
    writeln!(out, "|---|--:|---|--:|--:|--:|")?;
    for (model, model_rows) in models.iter().zip(rows).skip(1) {
        for (base, row) in rows[0].iter().zip(model_rows) {
            for &metric in metrics {
                let cell = |base: &Samples, other: &Samples| {
                    speed_ratio(base, other, metric).map_or("-".to_owned(), |r| format!("{r:.2}x"))
                };
                let (phase, prompt) = metric.phase_and_prompt();
                writeln!(
                    out,
                    "| {} | {} | {phase} | {prompt} | {} | {} |",
                    name(model),
                    row.n_threads,
                    cell(&base.ours, &row.ours),
                    cell(&base.peer, &row.peer),
                )?;
            }
        }
    }
    Ok(out)
}

/// The median over rounds of `other`'s speed over `base`'s at `metric`
/// (round `r` of one against round `r` of the other).
fn speed_ratio(base: &Samples, other: &Samples, metric: Metric) -> Option<f64> {
    let key = metric.key();
    let ratios: Vec<f64> = base
        .seconds
        .get(&key)?
        .iter()
        .zip(other.seconds.get(&key)?)
        .map(|(base, other)| base / other)
        .collect();
    median(&ratios)
}

/// Today's date in UTC as `YYYY-MM-DD`.
fn utc_date() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    date_of_unix_seconds(secs)
}

/// The UTC date `YYYY-MM-DD` of a Unix time (civil-from-days, proleptic Gregorian).
fn date_of_unix_seconds(secs: u64) -> String {
    let days = (secs / 86_400) as i64 + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::bench::Measurement;

    #[test]
    fn model_speed_ratios_pair_rounds_and_take_the_median() {
        let samples = |seconds: &[f64]| {
            let mut samples = Samples::default();
            for &s in seconds {
                samples.push(Measurement {
                    seconds: BTreeMap::from([(Metric::Decode(11).key(), s)]),
                    ..Measurement::default()
                });
            }
            samples
        };
        // Rounds drift 4x; within each round the other model takes 1.25x
        // the time of the base, except an outlier round.
        let base = samples(&[1.0, 2.0, 4.0, 4.0, 1.0]);
        let other = samples(&[1.25, 2.5, 5.0, 1.0, 1.25]);
        let ratio = speed_ratio(&base, &other, Metric::Decode(11)).unwrap();
        assert!((ratio - 0.8).abs() < 1e-12, "{ratio}");
        assert_eq!(speed_ratio(&base, &other, Metric::Prefill(128)), None);
    }

    #[test]
    fn decode_is_set_against_the_bandwidth_read_beside_it() {
        let mut ours = Samples::default();
        // 128 tokens in 4 s, 2 s and 2 s: 32, 64 and 64 tok/s.
        for s in [4.0, 2.0, 2.0] {
            ours.push(Measurement {
                seconds: BTreeMap::from([(Metric::Decode(11).key(), s)]),
                ..Measurement::default()
            });
        }
        // Bounds of 40, 80 and 100 tok/s at 1e9 bytes per token: shares
        // 0.8, 0.8 and 0.64, and their median 0.8 (against the median
        // bound's 64 / 80 for the median speed).
        let rates = [40e9, 80e9, 100e9];
        let (share, bound) = share_of_bound(&ours, Metric::Decode(11), &rates, 1e9).unwrap();
        assert!((share - 0.8).abs() < 1e-12, "{share}");
        assert!((bound - 80.0).abs() < 1e-9, "{bound}");
        assert_eq!(
            share_of_bound(&ours, Metric::Prefill(128), &rates, 1e9),
            None
        );
    }

    #[test]
    fn dates_of_known_unix_times() {
        assert_eq!(date_of_unix_seconds(0), "1970-01-01");
        // 2000-02-29T00:00:00Z, a leap day in a year divisible by 400.
        assert_eq!(date_of_unix_seconds(951_782_400), "2000-02-29");
        assert_eq!(date_of_unix_seconds(951_782_400 + 86_399), "2000-02-29");
        assert_eq!(date_of_unix_seconds(1_735_689_600), "2025-01-01");
    }
}

//! [`QMatrix`]: a borrowed, row-major matrix of GGML blocks and its products.
//!
//! ```text
//! data: | row 0: n_cols / block_size blocks | row 1 | ... | row n_rows - 1 |
//!         each row takes ty.row_bytes(n_cols) bytes; W is n_rows x n_cols
//! ```
//!
//! Products never dequantize the whole matrix: each row is multiplied block by
//! block. Quantized weights are multiplied with activations quantized to 8-bit
//! blocks (as llama.cpp does); [`QMatrix::matvec_exact`] keeps the activations
//! in f32 and is the accuracy reference.

use std::cell::RefCell;

use rayon::prelude::*;

use super::activation::Activations;
use super::activation::{ActivationBuffers, QuantizedInput};
use super::packed::{self, PANEL_ROWS};
use super::{GgmlType, QuantError, block};
use crate::kernels::dispatch::{Dispatch, Kernel};
use crate::kernels::dot::portable;
use crate::kernels::panel::{LINE_BYTES, PanelInput, PanelProduct};
use crate::thread_scratch::with_thread_scratch;

/// Matrices with fewer weights than this are multiplied on the calling thread:
/// below it, handing rows to rayon costs more than it saves.
const PARALLEL_MIN_WEIGHTS: usize = 1 << 16;

/// Batched results below this many are moved back to input-major order on
/// the calling thread.
const PARALLEL_MIN_OUTPUTS: usize = 1 << 16;

/// About the most batched results held before they are moved back to
/// input-major order (4 MiB of f32): a batch's products are computed in
/// bands of rows that fit, so this scratch does not grow with the
/// matrices' heights times the batch (a 512-token piece through a 1B
/// model's gate and up projections held 34 MB).
const TRANSPOSED_MAX_VALUES: usize = 1 << 20;

/// The most weight bytes a thread multiplies as one piece of a product
/// with up to [`PIECE_MAX_INPUTS`] inputs (decode), before it looks for
/// whether another thread is idle. Rayon otherwise splits a product only a
/// few times on the thread that starts it (pieces of a quarter of its rows
/// at two threads), and a thread that ends its share early waits for the
/// other's piece to end. At two threads on the Xeon, 1B decode ran 3-8%
/// faster with pieces of 16, 64 or 256 KB than without a bound
/// (interleaved rounds of `lm-cli`; docs/performance.md).
const PIECE_MAX_BYTES: usize = 64 << 10;

/// The most inputs of a product whose pieces are bounded by
/// [`PIECE_MAX_BYTES`]: a prefill's batch keeps rayon's split, which ran
/// 126 tokens of 1B Q4_K_M about 3% faster at two threads.
const PIECE_MAX_INPUTS: usize = 2;

/// Rows of W handed to one rayon task.
const ROWS_PER_TASK: usize = 16;
const _: () = assert!(ROWS_PER_TASK == PANEL_ROWS, "a task's rows are one panel");

/// A borrowed matrix of `n_rows x n_cols` weights stored as GGML type `ty`.
#[derive(Debug, Clone, Copy)]
pub struct QMatrix<'a> {
    ty: GgmlType,
    n_rows: usize,
    n_cols: usize,
    row_bytes: usize,
    data: &'a [u8],
    dispatch: Dispatch,
    /// Whether `data` is in panels ([`packed`]) rather than row-major.
    packed: bool,
}

/// Per-thread buffers reused across products, so steady-state calls do not allocate.
#[derive(Debug, Default)]
struct Scratch {
    /// The activations quantized to 8-bit blocks of the weight type's family.
    activations: ActivationBuffers,
    /// Batched results in `n_rows x n` order before they are transposed.
    transposed: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Runs `f` with this thread's scratch buffers (see [`with_thread_scratch`]).
fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    with_thread_scratch(&SCRATCH, f)
}

impl<'a> QMatrix<'a> {
    /// Views `data` as `n_rows` rows of `n_cols` weights of type `ty`.
    ///
    /// Errors if `n_cols` is not a multiple of the block size or `data` is not
    /// exactly `n_rows * ty.row_bytes(n_cols)` bytes. Products use the
    /// fastest [`Kernel`] this CPU supports, or the one `LM_KERNEL` names
    /// ([`Kernel::configured`]).
    ///
    /// ```
    /// use lm_model::{GgmlType, QMatrix};
    /// // 2 x 2 identity in f32.
    /// let data: Vec<u8> = [1.0f32, 0.0, 0.0, 1.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    /// let w = QMatrix::new(GgmlType::F32, 2, 2, &data).unwrap();
    /// let mut y = [0.0; 2];
    /// w.matvec(&[3.0, 4.0], &mut y).unwrap();
    /// assert_eq!(y, [3.0, 4.0]);
    /// ```
    pub fn new(
        ty: GgmlType,
        n_rows: usize,
        n_cols: usize,
        data: &'a [u8],
    ) -> Result<QMatrix<'a>, QuantError> {
        let row_bytes = ty.row_bytes(n_cols)?;
        let expected = n_rows
            .checked_mul(row_bytes)
            .ok_or(QuantError::SizeOverflow { n_rows, n_cols })?;
        if data.len() != expected {
            return Err(QuantError::DataLength {
                ty,
                n_rows,
                n_cols,
                expected,
                actual: data.len(),
            });
        }
        Ok(QMatrix::checked_before(
            ty,
            n_rows,
            n_cols,
            data,
            Dispatch::detect(),
        ))
    }

    /// A view whose shape and data length were checked by [`QMatrix::new`]
    /// before (a file-backed weight, at each product), multiplying with
    /// `dispatch`.
    pub(crate) fn checked_before(
        ty: GgmlType,
        n_rows: usize,
        n_cols: usize,
        data: &'a [u8],
        dispatch: Dispatch,
    ) -> QMatrix<'a> {
        let row_bytes = n_cols / ty.block_size() * ty.block_bytes();
        debug_assert!(n_cols.is_multiple_of(ty.block_size()), "whole blocks");
        debug_assert_eq!(data.len(), n_rows * row_bytes, "data length");
        QMatrix {
            ty,
            n_rows,
            n_cols,
            row_bytes,
            data,
            dispatch,
            packed: false,
        }
    }

    /// The same view of data packed in panels (see [`packed`]; the type
    /// and shape pack).
    pub(crate) fn in_panels(self) -> QMatrix<'a> {
        debug_assert!(packed::has_panels(self.ty, self.n_rows));
        QMatrix {
            packed: true,
            ..self
        }
    }

    /// The same matrix using `kernel` for its products; errors if this CPU lacks it.
    pub fn with_kernel(self, kernel: Kernel) -> Result<QMatrix<'a>, QuantError> {
        let dispatch = Dispatch::new(kernel).ok_or(QuantError::KernelUnavailable { kernel })?;
        Ok(QMatrix { dispatch, ..self })
    }

    /// The element type.
    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    /// Number of rows (outputs of [`QMatrix::matvec`]).
    pub fn n_rows(&self) -> usize {
        self.n_rows
    }

    /// Number of columns (inputs of [`QMatrix::matvec`]).
    pub fn n_cols(&self) -> usize {
        self.n_cols
    }

    /// The raw bytes of all rows.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// The raw bytes of row `row_idx`, or `None` past the last row.
    pub fn row_data(&self, row_idx: usize) -> Option<&'a [u8]> {
        if self.packed {
            return None;
        }
        let start = row_idx.checked_mul(self.row_bytes)?;
        self.data.get(start..start.checked_add(self.row_bytes)?)
    }

    /// Writes row `row_idx` as f32 into `out` (`n_cols` long), bit-exactly as GGML dequantizes it.
    pub fn dequantize_row(&self, row_idx: usize, out: &mut [f32]) -> Result<(), QuantError> {
        check_len("output row", self.n_cols, out.len())?;
        if row_idx >= self.n_rows {
            return Err(QuantError::RowOutOfRange {
                row_idx,
                n_rows: self.n_rows,
            });
        }
        self.dequantize_row_checked(row_idx, out);
        Ok(())
    }

    /// [`QMatrix::dequantize_row`] with the index and length checked by the caller.
    pub(crate) fn dequantize_row_checked(&self, row_idx: usize, out: &mut [f32]) {
        debug_assert_eq!(out.len(), self.n_cols, "output row");
        if self.packed {
            // The largest packed block: Q6_K's 210 bytes.
            let mut bytes = [0u8; 256];
            let bytes = &mut bytes[..self.ty.block_bytes()];
            let values = out.chunks_exact_mut(self.ty.block_size());
            for (b, values) in values.enumerate() {
                packed::unpack_block(self.ty, self.data, self.row_bytes, row_idx, b, bytes);
                block::dequantize_row(self.ty, bytes, values);
            }
            return;
        }
        let start = row_idx * self.row_bytes;
        block::dequantize_row(self.ty, &self.data[start..start + self.row_bytes], out);
    }

    /// The whole matrix as f32, row-major (for small tensors such as norm weights).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.n_rows * self.n_cols];
        if self.packed {
            for (row_idx, dst) in out.chunks_exact_mut(self.n_cols).enumerate() {
                self.dequantize_row_checked(row_idx, dst);
            }
        } else if self.n_cols > 0 {
            for (row, dst) in self
                .data
                .chunks_exact(self.row_bytes)
                .zip(out.chunks_exact_mut(self.n_cols))
            {
                block::dequantize_row(self.ty, row, dst);
            }
        }
        out
    }

    /// `y = W x`: `x` has `n_cols` values, `y` receives `n_rows`.
    ///
    /// Quantized weights are multiplied with `x` quantized to 8-bit blocks,
    /// as llama.cpp does: the error, relative to `Σ_j |W_rj x_j|`, is below
    /// 5e-3 (measured 3e-3 on random rows with outliers and 4e-4 on SmolLM2's
    /// rows; tests `quant_kernels` and `gguf_real_model`). Large matrices are
    /// split across rayon's threads by rows.
    pub fn matvec(&self, x: &[f32], y: &mut [f32]) -> Result<(), QuantError> {
        check_len("input vector", self.n_cols, x.len())?;
        check_len("output vector", self.n_rows, y.len())?;
        self.matvec_checked(x, y);
        Ok(())
    }

    /// [`QMatrix::matvec`] with the lengths checked by the caller.
    fn matvec_checked(&self, x: &[f32], y: &mut [f32]) {
        Self::matmul_each_checked(&mut [(*self, y)], x, 1);
    }

    /// `y = W x` with `x` kept in f32, dequantizing one block at a time:
    /// slower than [`QMatrix::matvec`], and the reference for its accuracy.
    pub fn matvec_exact(&self, x: &[f32], y: &mut [f32]) -> Result<(), QuantError> {
        check_len("input vector", self.n_cols, x.len())?;
        check_len("output vector", self.n_rows, y.len())?;
        if self.packed {
            let mut row = vec![0.0; self.n_cols];
            for (row_idx, y) in y.iter_mut().enumerate() {
                self.dequantize_row_checked(row_idx, &mut row);
                *y = row.iter().zip(x).map(|(w, x)| w * x).sum();
            }
            return Ok(());
        }
        self.fill_rows(y, 1, |rows, out| {
            for (o, row) in out.iter_mut().zip(rows.chunks_exact(self.row_bytes)) {
                *o = portable::dot_row_exact(self.ty, row, x);
            }
        });
        Ok(())
    }

    /// Batched product for prefill: `xs` holds `n` inputs of `n_cols` values
    /// (row-major, `n x n_cols`); `ys` receives `n x n_rows`, input-major, so
    /// `ys[i * n_rows + r] = W[r] · xs[i]`.
    ///
    /// Rows of W are the outer loop, so each weight block is read from memory
    /// once per batch rather than once per input, and the SIMD kernel unpacks
    /// each block once for four inputs at a time. Each result has the same
    /// bits as [`QMatrix::matvec`] on its input alone.
    pub fn matmul(&self, xs: &[f32], n: usize, ys: &mut [f32]) -> Result<(), QuantError> {
        Self::matmul_each(&mut [(*self, ys)], xs, n)
    }

    /// `ys_j = W_j xs` for every `(W_j, ys_j)` of `products`: several
    /// matrices reading the same `n` inputs (`xs`, `n x n_cols`; each `ys_j`
    /// is `n x n_rows` of its matrix, input-major), as a layer's query, key
    /// and value projections do, or its gate and up projections.
    ///
    /// The inputs are quantized once per activation kind the matrices need,
    /// not once per matrix, and the matrices' rows are split across rayon's
    /// threads as one piece of work, so a small matrix (SmolLM2's 192-row
    /// key and value projections, which alone run little faster on two
    /// threads than on one) does not pay a hand-off of its own. Each `ys_j`
    /// has the bits of `W_j.matmul(xs, n, ys_j)`.
    ///
    /// Errors if a matrix's width is not the inputs' or an output's length
    /// is not `n` times its matrix's rows.
    pub fn matmul_each(
        products: &mut [(QMatrix<'_>, &mut [f32])],
        xs: &[f32],
        n: usize,
    ) -> Result<(), QuantError> {
        for (w, ys) in products.iter() {
            let n_inputs = n.checked_mul(w.n_cols).ok_or(QuantError::SizeOverflow {
                n_rows: n,
                n_cols: w.n_cols,
            })?;
            let n_outputs = n.checked_mul(w.n_rows).ok_or(QuantError::SizeOverflow {
                n_rows: n,
                n_cols: w.n_rows,
            })?;
            check_len("input matrix", n_inputs, xs.len())?;
            check_len("output matrix", n_outputs, ys.len())?;
        }
        Self::matmul_each_checked(products, xs, n);
        Ok(())
    }

    /// [`QMatrix::matmul`] with the lengths checked by the caller: `xs` is
    /// `n x n_cols`, `ys` is `n x n_rows`.
    pub(crate) fn matmul_checked(&self, xs: &[f32], n: usize, ys: &mut [f32]) {
        Self::matmul_each_checked(&mut [(*self, ys)], xs, n);
    }

    /// [`QMatrix::matmul_each`] with the lengths checked by the caller.
    pub(crate) fn matmul_each_checked(
        products: &mut [(QMatrix<'_>, &mut [f32])],
        xs: &[f32],
        n: usize,
    ) {
        debug_assert!(
            products
                .iter()
                .all(|(w, ys)| (xs.len(), ys.len()) == (n * w.n_cols, n * w.n_rows)),
            "{n} inputs through every matrix"
        );
        let Some(dispatch) = products.first().map(|(w, _)| w.dispatch) else {
            return;
        };
        if n == 0 {
            return;
        }
        with_scratch(|scratch| {
            let Scratch {
                activations,
                transposed,
            } = scratch;
            let kinds = products.iter().map(|(w, _)| w.ty.activation_kind());
            let input = activations.quantize_each(dispatch, kinds, xs);
            if n == 1 {
                // One input: each matrix's results are its output as they are.
                fill_products(products, input, 1, &mut []);
                return;
            }
            // Bands of at most `band_rows` rows of every matrix at a time,
            // so the transposed results stay near `TRANSPOSED_MAX_VALUES`
            // however tall the matrices and long the batch.
            let band_rows = (TRANSPOSED_MAX_VALUES / (n * products.len().max(1)))
                .next_multiple_of(PANEL_ROWS)
                .max(PANEL_ROWS);
            let max_rows = products.iter().map(|(w, _)| w.n_rows).max().unwrap_or(0);
            for first_row in (0..max_rows).step_by(band_rows) {
                let mut bands: Vec<(QMatrix<'_>, &mut [f32])> = products
                    .iter()
                    .filter(|(w, _)| first_row < w.n_rows)
                    .map(|(w, _)| {
                        (
                            w.band(first_row..w.n_rows.min(first_row + band_rows)),
                            &mut [][..],
                        )
                    })
                    .collect();
                transposed.clear();
                transposed.resize(bands.iter().map(|(w, _)| w.n_rows * n).sum(), 0.0);
                fill_products(&mut bands, input, n, transposed);
                let mut parts = &transposed[..];
                let outputs = products.iter_mut().filter(|(w, _)| first_row < w.n_rows);
                for ((band, _), (w, ys)) in bands.iter().zip(outputs) {
                    let (part, rest) = parts.split_at(band.n_rows * n);
                    let place = Placement {
                        n,
                        n_rows: w.n_rows,
                        first_row,
                    };
                    if w.packed {
                        panels_to_input_major(part, place, ys);
                    } else {
                        to_input_major(part, place, ys);
                    }
                    parts = rest;
                }
            }
        });
    }

    /// Rows `rows` as a matrix of their own: whole panels when packed
    /// (`rows.start` a multiple of [`PANEL_ROWS`], as is `rows.end` unless
    /// it is the last row).
    fn band(&self, rows: std::ops::Range<usize>) -> QMatrix<'a> {
        debug_assert!(rows.start.is_multiple_of(PANEL_ROWS) && rows.end <= self.n_rows);
        QMatrix {
            n_rows: rows.len(),
            data: &self.data[rows.start * self.row_bytes..rows.end * self.row_bytes],
            ..*self
        }
    }

    /// Fills `out` (`n_rows x n`, row-major) by calling `dot(rows, results)`
    /// on blocks of up to [`ROWS_PER_TASK`] rows (their bytes) and their
    /// `rows x n` results, in parallel over the blocks when the matrix is
    /// large.
    fn fill_rows(&self, out: &mut [f32], n: usize, dot: impl Fn(&[u8], &mut [f32]) + Sync) {
        if self.row_bytes == 0 || n == 0 {
            out.fill(0.0);
            return;
        }
        let out_block = ROWS_PER_TASK.saturating_mul(n);
        let row_block = ROWS_PER_TASK.saturating_mul(self.row_bytes);
        let fill_block = |(results, rows): (&mut [f32], &[u8])| dot(rows, results);
        let n_weights = self.n_rows.saturating_mul(self.n_cols).saturating_mul(n);
        if n_weights >= PARALLEL_MIN_WEIGHTS && rayon::current_num_threads() > 1 {
            let tasks_per_piece = if n <= PIECE_MAX_INPUTS {
                (PIECE_MAX_BYTES / row_block).max(1)
            } else {
                usize::MAX
            };
            out.par_chunks_mut(out_block)
                .zip(self.data.par_chunks(row_block))
                .with_max_len(tasks_per_piece)
                .for_each(fill_block);
        } else {
            out.chunks_mut(out_block)
                .zip(self.data.chunks(row_block))
                .for_each(fill_block);
        }
    }

    /// [`fill_rows`](Self::fill_rows) for a packed matrix: a task's 16 rows
    /// are one panel (`ROWS_PER_TASK`), multiplied with the `n` inputs `xq`
    /// (and their blocks' `sums`).
    fn fill_panels<A: PanelInput + Sync>(&self, out: &mut [f32], n: usize, xq: &[A], sums: &[i32]) {
        let n_blocks = self.n_cols / self.ty.block_size();
        let prefetch_stride = if self.dispatch.prefetches_panels(self.ty) {
            LINE_BYTES
        } else {
            0
        };
        self.fill_rows(out, n, |panels, out| {
            let product = PanelProduct {
                panels,
                n_blocks,
                xq,
                sums,
                n,
                prefetch_stride,
            };
            self.dispatch.dot_panels(self.ty, product, out);
        });
    }
}

/// The results of every product of [`QMatrix::matmul_each_checked`]
/// (`n_rows x n` each, row-major): in each product's own output when `n ==
/// 1`, else in its part of `transposed` (the products' parts one after the
/// other). Several products run as halves of a `rayon::join` when the
/// work is worth the threads, so the pool takes their rows as one job.
fn fill_products(
    products: &mut [(QMatrix<'_>, &mut [f32])],
    input: QuantizedInput<'_>,
    n: usize,
    transposed: &mut [f32],
) {
    match products {
        [] => {}
        [(w, ys)] => {
            let out = if n == 1 { &mut **ys } else { transposed };
            let x = input.get(w.ty.activation_kind());
            match x {
                Activations::Q8(xq) if w.packed => {
                    w.fill_panels(out, n, xq, input.q8_sums());
                }
                Activations::Q8K(xq) if w.packed => {
                    w.fill_panels(out, n, xq, &[]);
                }
                _ => w.fill_rows(out, n, |rows, out| {
                    w.dispatch
                        .dot_rows(w.ty, rows, w.row_bytes, w.n_cols, x, n, out);
                }),
            }
        }
        _ => {
            let n_weights = products.iter().fold(0usize, |sum, (w, _)| {
                let weights = w.n_rows.saturating_mul(w.n_cols).saturating_mul(n);
                sum.saturating_add(weights)
            });
            let (first, rest) = products.split_at_mut(products.len() / 2);
            let first_results = if n == 1 {
                0
            } else {
                first.iter().map(|(w, _)| w.n_rows * n).sum()
            };
            let (first_out, rest_out) = transposed.split_at_mut(first_results);
            if n_weights >= PARALLEL_MIN_WEIGHTS && rayon::current_num_threads() > 1 {
                rayon::join(
                    || fill_products(first, input, n, first_out),
                    || fill_products(rest, input, n, rest_out),
                );
            } else {
                fill_products(first, input, n, first_out);
                fill_products(rest, input, n, rest_out);
            }
        }
    }
}

/// Where a band of a batched product's results goes: `n` inputs' rows
/// `first_row..` of a matrix of `n_rows` rows, whose outputs are
/// input-major (`ys[i * n_rows + r]`).
#[derive(Clone, Copy)]
struct Placement {
    n: usize,
    n_rows: usize,
    first_row: usize,
}

/// `ys[i * n_rows + first_row + 16 p + l] = panels[(p * n + i) * 16 + l]`:
/// a packed band's results (each panel's sixteen rows per input) back to
/// input-major order.
fn panels_to_input_major(panels: &[f32], place: Placement, ys: &mut [f32]) {
    let Placement {
        n,
        n_rows,
        first_row,
    } = place;
    for (p, panel) in panels.chunks_exact(n * PANEL_ROWS).enumerate() {
        for (i, rows) in panel.chunks_exact(PANEL_ROWS).enumerate() {
            ys[i * n_rows + first_row + p * PANEL_ROWS..][..PANEL_ROWS].copy_from_slice(rows);
        }
    }
}

/// `ys[i * n_rows + first_row + r] = transposed[r * n + i]`: a band's
/// batched results back to input-major order, in parallel over the inputs
/// when there is enough to copy (handing a short batch's copy to rayon
/// costs more than the copy: a third of a one-input product for 2).
fn to_input_major(transposed: &[f32], place: Placement, ys: &mut [f32]) {
    let Placement {
        n,
        n_rows,
        first_row,
    } = place;
    let band_rows = transposed.len() / n.max(1);
    let copy_input = |(input_idx, y): (usize, &mut [f32])| {
        for (row_idx, dst) in y[first_row..first_row + band_rows].iter_mut().enumerate() {
            *dst = transposed[row_idx * n + input_idx];
        }
    };
    let chunk = n_rows.max(1);
    if transposed.len() >= PARALLEL_MIN_OUTPUTS && rayon::current_num_threads() > 1 {
        ys.par_chunks_mut(chunk).enumerate().for_each(copy_input);
    } else {
        ys.chunks_mut(chunk).enumerate().for_each(copy_input);
    }
}

/// Errors unless a buffer has the length the matrix's shape requires.
fn check_len(what: &'static str, expected: usize, actual: usize) -> Result<(), QuantError> {
    if expected == actual {
        Ok(())
    } else {
        Err(QuantError::ShapeMismatch {
            what,
            expected,
            actual,
        })
    }
}

#[cfg(test)]
mod panel_tests {
    use super::*;

    /// `n_rows x n_cols` random blocks of `ty`, scales in 1e-3..1.1e-2.
    fn random_matrix(ty: GgmlType, n_rows: usize, n_cols: usize, seed: u64) -> Vec<u8> {
        let mut state = seed;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u32
        };
        let row_bytes = ty.row_bytes(n_cols).expect("whole blocks");
        let mut data = vec![0u8; n_rows * row_bytes];
        // The f16 fields: Q4_K's d and dmin, Q6_K's d, the others' d.
        let f16_at: &[usize] = match ty {
            GgmlType::Q4_K => &[0, 2],
            GgmlType::Q6_K => &[208],
            _ => &[0],
        };
        for block in data.chunks_exact_mut(ty.block_bytes()) {
            for b in block.iter_mut() {
                *b = next() as u8;
            }
            for &at in f16_at {
                let d = half::f16::from_f32(0.001 + (next() % 1000) as f32 * 1e-5);
                block[at..at + 2].copy_from_slice(&d.to_le_bytes());
            }
        }
        data
    }

    /// A batch whose results outgrow [`TRANSPOSED_MAX_VALUES`] goes through
    /// the matrices in bands of rows, with the bits of each input's own
    /// product: two products (one packed, one row-major and shorter, so it
    /// ends inside the second of three bands) and 300 inputs.
    #[test]
    fn batches_too_large_for_the_scratch_go_in_bands_with_the_same_bits() {
        let (n_cols, n) = (64, 300);
        let (tall, short) = (4096, 2000);
        let band_rows = (TRANSPOSED_MAX_VALUES / (n * 2)).next_multiple_of(PANEL_ROWS);
        assert!(short > band_rows && short < 2 * band_rows && tall > 2 * band_rows);
        let ty = GgmlType::Q8_0;
        let row_bytes = ty.row_bytes(n_cols).expect("whole blocks");
        let mut tall_data = random_matrix(ty, tall, n_cols, 3);
        packed::pack_in_place(ty, &mut tall_data, row_bytes);
        let short_data = random_matrix(GgmlType::Q4_0, short, n_cols, 5);
        let dispatch = Dispatch::detect();
        let w_tall = QMatrix::checked_before(ty, tall, n_cols, &tall_data, dispatch).in_panels();
        let w_short = QMatrix::checked_before(GgmlType::Q4_0, short, n_cols, &short_data, dispatch);
        let xs: Vec<f32> = (0..n * n_cols)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) / 13.0)
            .collect();
        let (mut ys_tall, mut ys_short) = (vec![0.0; n * tall], vec![0.0; n * short]);
        QMatrix::matmul_each(
            &mut [(w_tall, &mut ys_tall[..]), (w_short, &mut ys_short[..])],
            &xs,
            n,
        )
        .expect("shapes");
        for (i, x) in xs.chunks_exact(n_cols).enumerate() {
            for (w, ys) in [(w_tall, &ys_tall), (w_short, &ys_short)] {
                let mut one = vec![0.0; w.n_rows()];
                w.matvec(x, &mut one).expect("shapes");
                assert_eq!(one, ys[i * w.n_rows()..][..w.n_rows()], "input {i}");
            }
        }
    }

    /// Packed products against the row-major ones and f32 arithmetic, on
    /// every kernel this CPU runs: the same bits on each, for one input
    /// and for a batch (tiles of 8 and a remainder), and within the
    /// quantized product's error of the exact one.
    #[test]
    fn panel_products_agree_across_kernels_batches_and_layouts() {
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
        ] {
            let (n_rows, n_cols, n) = (48, 512, 19);
            let data = random_matrix(ty, n_rows, n_cols, 7);
            let mut packed_data = data.clone();
            let row_bytes = ty.row_bytes(n_cols).expect("whole blocks");
            packed::pack_in_place(ty, &mut packed_data, row_bytes);
            let xs: Vec<f32> = (0..n * n_cols)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
                .collect();
            let mut reference = None;
            for dispatch in Dispatch::every_available() {
                let w = QMatrix::checked_before(ty, n_rows, n_cols, &data, dispatch);
                let p =
                    QMatrix::checked_before(ty, n_rows, n_cols, &packed_data, dispatch).in_panels();
                let mut batch = vec![0.0; n * n_rows];
                p.matmul(&xs, n, &mut batch).expect("shapes");
                for (i, x) in xs.chunks_exact(n_cols).enumerate() {
                    let mut one = vec![0.0; n_rows];
                    p.matvec(x, &mut one).expect("shapes");
                    assert_eq!(one, batch[i * n_rows..][..n_rows], "{ty} input {i}");
                    let (mut rows, mut exact) = (vec![0.0; n_rows], vec![0.0; n_rows]);
                    w.matvec(x, &mut rows).expect("shapes");
                    w.matvec_exact(x, &mut exact).expect("shapes");
                    let mut dense = vec![0.0; n_cols];
                    for r in 0..n_rows {
                        p.dequantize_row(r, &mut dense).expect("row");
                        let mut original = vec![0.0; n_cols];
                        w.dequantize_row(r, &mut original).expect("row");
                        assert_eq!(dense, original, "{ty} row {r}");
                        let magnitude: f32 = dense.iter().zip(x).map(|(w, x)| (w * x).abs()).sum();
                        assert!(
                            (one[r] - exact[r]).abs() <= 5e-3 * magnitude,
                            "{ty} row {r}"
                        );
                        assert!((one[r] - rows[r]).abs() <= 1e-5 * magnitude, "{ty} row {r}");
                    }
                }
                match &reference {
                    None => reference = Some(batch),
                    Some(reference) => assert_eq!(&batch, reference, "{ty} on {dispatch:?}"),
                }
            }
        }
    }
}

//! A weight matrix `W` of shape `[n_rows (outputs)][n_cols (inputs)]` and
//! the products a forward pass needs: `y = W x` for a batch of rows
//! (`ys[i] = W xs[i]`), and the lookup of one row (token embeddings).
//!
//! This is the one place that knows how a weight is stored: as a dense f32
//! ndarray (the toy decoder), or as GGML blocks in a model file (llama),
//! multiplied on the blocks without a dequantised copy. A file-backed weight
//! holds the shared [`GgufFile`] and the byte range of its tensor, and builds
//! a borrowed [`QMatrix`] view at each product (a few field copies), so the
//! model never borrows from itself.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

use ndarray::{Array2, ArrayView2, ArrayViewMut2, linalg::general_mat_mul};

use super::TransformerError;
use crate::gguf::GgufFile;
use crate::kernels::dispatch::Dispatch;
use crate::quant::{GgmlType, QMatrix};

/// A weight matrix, `[n_rows][n_cols]`, applied as `y = W x`.
#[derive(Debug, Clone)]
pub struct Linear {
    storage: Storage,
}

#[derive(Debug, Clone)]
enum Storage {
    /// f32 values, `[n_rows][n_cols]`.
    Dense(Array2<f32>),
    /// A tensor of a GGUF file (any [`GgmlType`]: F32, F16, BF16, Q8_0,
    /// Q4_0, Q4_1), checked at construction.
    File(FileMatrix),
}

/// Where a file-backed weight lives.
#[derive(Debug, Clone)]
struct FileMatrix {
    file: Arc<GgufFile>,
    ty: GgmlType,
    n_rows: usize,
    n_cols: usize,
    /// Byte range of the tensor's data within the file ([`GgufFile::data`]).
    bytes: Range<usize>,
    /// Whether the data is packed in panels ([`GgufFile::pack_tensors`]).
    packed: bool,
}

impl FileMatrix {
    /// The borrowed view, multiplying with `dispatch`'s kernel. The shape
    /// and byte range were checked by [`Linear::from_gguf`].
    fn view(&self, dispatch: Dispatch) -> QMatrix<'_> {
        let data = self.file.data(self.bytes.clone());
        let view = QMatrix::checked_before(self.ty, self.n_rows, self.n_cols, data, dispatch);
        if self.packed { view.in_panels() } else { view }
    }
}

impl Linear {
    /// A dense f32 matrix `[n_rows][n_cols]`.
    pub fn dense(weight: Array2<f32>) -> Self {
        Self {
            storage: Storage::Dense(weight),
        }
    }

    /// The 2-d tensor `name` of `file` as a matrix: `n_cols = dims[0]` (the
    /// row length in ggml order), `n_rows = dims[1]`.
    pub fn from_gguf(file: &Arc<GgufFile>, name: &str) -> Result<Self, TransformerError> {
        let view = file.tensor(name)?;
        let info = view.info;
        let [n_cols, n_rows] = info.dims[..] else {
            return Err(TransformerError::TensorRank {
                name: name.to_owned(),
                dims: info.dims.clone(),
            });
        };
        // The view's data is a sub-slice of the file's bytes: its offset
        // is the data section's plus the tensor's.
        let start = file.data_offset() + info.offset;
        let bytes = start..start + view.data.len();
        view.matrix()?;
        Ok(Self {
            storage: Storage::File(FileMatrix {
                file: Arc::clone(file),
                ty: info.ggml_type,
                n_rows,
                n_cols,
                bytes,
                packed: view.packed,
            }),
        })
    }

    /// The 3-d tensor `name` of `file` (ggml dims `[n_cols, n_rows,
    /// n_expert]`: a mixture of experts' `ffn_{gate,up,down}_exps`) as one
    /// matrix per expert, each a view of its own byte range of the tensor:
    /// nothing is copied, and an expert's bytes are read only when it runs.
    pub(crate) fn experts_from_gguf(
        file: &Arc<GgufFile>,
        name: &str,
    ) -> Result<Vec<Self>, TransformerError> {
        let view = file.tensor(name)?;
        let info = view.info;
        let [n_cols, n_rows, n_expert] = info.dims[..] else {
            return Err(TransformerError::TensorRank {
                name: name.to_owned(),
                dims: info.dims.clone(),
            });
        };
        // The whole tensor is a matrix of n_expert * n_rows rows (checked
        // like any weight); each expert is a run of n_rows of them.
        view.matrix()?;
        let expert_bytes = view.data.len() / n_expert.max(1);
        let start = file.data_offset() + info.offset;
        Ok((0..n_expert)
            .map(|e| Self {
                storage: Storage::File(FileMatrix {
                    file: Arc::clone(file),
                    ty: info.ggml_type,
                    n_rows,
                    n_cols,
                    bytes: start + e * expert_bytes..start + (e + 1) * expert_bytes,
                    // Packing takes 2-d tensors only.
                    packed: false,
                }),
            })
            .collect())
    }

    /// Rows `rows` of the 2-d tensor `name` of `file` as a matrix of their
    /// own: one part of a fused tensor (phi3's `attn_qkv` and `ffn_up`),
    /// a view of its byte range, nothing copied. The tensor must not be
    /// packed (the loader leaves fused tensors unpacked).
    pub(crate) fn rows_from_gguf(
        file: &Arc<GgufFile>,
        name: &str,
        rows: Range<usize>,
    ) -> Result<Self, TransformerError> {
        let whole = Self::from_gguf(file, name)?;
        let Storage::File(m) = whole.storage else {
            unreachable!("from_gguf makes a file-backed matrix")
        };
        if m.packed || rows.start > rows.end || rows.end > m.n_rows {
            return Err(TransformerError::TensorShape {
                name: name.to_owned(),
                expected: vec![m.n_cols, rows.end],
                found: vec![m.n_cols, m.n_rows],
            });
        }
        let row_bytes = m.bytes.len() / m.n_rows.max(1);
        let start = m.bytes.start;
        Ok(Self {
            storage: Storage::File(FileMatrix {
                n_rows: rows.len(),
                bytes: start + rows.start * row_bytes..start + rows.end * row_bytes,
                ..m
            }),
        })
    }

    /// Output width (rows of `W`).
    pub fn n_rows(&self) -> usize {
        match &self.storage {
            Storage::Dense(w) => w.nrows(),
            Storage::File(m) => m.n_rows,
        }
    }

    /// Input width (columns of `W`).
    pub fn n_cols(&self) -> usize {
        match &self.storage {
            Storage::Dense(w) => w.ncols(),
            Storage::File(m) => m.n_cols,
        }
    }

    /// `ys[i] = W xs[i]` for the `n` rows of `xs` (`[n][n_cols]`, row-major)
    /// into `ys` (`[n][n_rows]`), with `dispatch`'s kernel. Quantized weights
    /// multiply activations quantized to 8-bit blocks, as llama.cpp does.
    ///
    /// The slices have exactly those lengths: the decoder sizes them from
    /// the configuration it checked every weight against, so another length
    /// is a bug and panics.
    pub(crate) fn matmul(&self, dispatch: Dispatch, xs: &[f32], n: usize, ys: &mut [f32]) {
        Self::matmul_each(dispatch, xs, n, [(self, ys)]);
    }

    /// Panics unless `xs` is `n` inputs and `ys` `n` outputs of this weight.
    fn assert_product_shape(&self, xs: &[f32], ys: &[f32], n: usize) {
        assert_eq!(
            (xs.len(), ys.len()),
            (n * self.n_cols(), n * self.n_rows()),
            "matmul of {n} rows through a {} x {} weight",
            self.n_rows(),
            self.n_cols()
        );
    }

    /// [`Linear::matmul`] of the same `n` rows `xs` through each weight of
    /// `products` into its output: a layer's query, key and value
    /// projections, or its gate and up projections. File-backed weights go
    /// through [`QMatrix::matmul_each`], which quantizes the input once for
    /// all of them and splits all their rows across the threads as one
    /// piece of work; each output has the bits of its own `matmul`.
    pub(crate) fn matmul_each<const N: usize>(
        dispatch: Dispatch,
        xs: &[f32],
        n: usize,
        products: [(&Linear, &mut [f32]); N],
    ) {
        for (w, ys) in &products {
            w.assert_product_shape(xs, ys, n);
        }
        if products
            .iter()
            .all(|(w, _)| matches!(w.storage, Storage::File(_)))
        {
            let mut views = products.map(|(w, ys)| match &w.storage {
                Storage::File(m) => (m.view(dispatch), ys),
                Storage::Dense(_) => unreachable!("every weight is file-backed"),
            });
            QMatrix::matmul_each_checked(&mut views, xs, n);
            return;
        }
        for (w, ys) in products {
            match &w.storage {
                Storage::File(m) => m.view(dispatch).matmul_checked(xs, n, ys),
                Storage::Dense(w) => {
                    let x = ArrayView2::from_shape((n, w.ncols()), xs).expect("length asserted");
                    let mut y =
                        ArrayViewMut2::from_shape((n, w.nrows()), ys).expect("length asserted");
                    general_mat_mul(1.0, &x, &w.t(), 0.0, &mut y);
                }
            }
        }
    }

    /// [`Linear::matmul_each`] for any number of products, all
    /// file-backed (a mixture of experts' chosen gate and up projections,
    /// which read the same token).
    pub(crate) fn matmul_each_file(
        dispatch: Dispatch,
        xs: &[f32],
        n: usize,
        products: Vec<(&Linear, &mut [f32])>,
    ) {
        let mut views: Vec<(QMatrix<'_>, &mut [f32])> = products
            .into_iter()
            .map(|(w, ys)| {
                w.assert_product_shape(xs, ys, n);
                match &w.storage {
                    Storage::File(m) => (m.view(dispatch), ys),
                    Storage::Dense(_) => panic!("matmul_each_file of a dense weight"),
                }
            })
            .collect();
        QMatrix::matmul_each_checked(&mut views, xs, n);
    }

    /// Whether the weight is a tensor of a model file.
    pub(crate) fn is_file_backed(&self) -> bool {
        matches!(self.storage, Storage::File(_))
    }

    /// Copies row `row_idx` of `W` (an embedding vector) into `out`
    /// (`n_cols` long). The decoder checks token ids against the vocabulary
    /// first, so a row beyond the matrix is a bug and panics.
    pub(crate) fn row(&self, row_idx: usize, out: &mut [f32]) {
        assert!(
            row_idx < self.n_rows() && out.len() == self.n_cols(),
            "row {row_idx} of a {} x {} weight into {} values",
            self.n_rows(),
            self.n_cols(),
            out.len()
        );
        match &self.storage {
            // Dequantizing runs no dot kernel, so any dispatch will do.
            Storage::File(m) => m
                .view(Dispatch::PORTABLE)
                .dequantize_row_checked(row_idx, out),
            Storage::Dense(w) => {
                for (o, &v) in out.iter_mut().zip(w.row(row_idx)) {
                    *o = v;
                }
            }
        }
    }

    /// The whole matrix as f32 values: borrowed when dense, dequantised row
    /// by row otherwise. For the reference path and tests only; the forward
    /// pass never makes this copy.
    pub(crate) fn to_dense(&self) -> Cow<'_, Array2<f32>> {
        match &self.storage {
            Storage::Dense(w) => Cow::Borrowed(w),
            Storage::File(m) => {
                let values = m.view(Dispatch::PORTABLE).to_f32_vec();
                Cow::Owned(
                    Array2::from_shape_vec((m.n_rows, m.n_cols), values)
                        .expect("a view holds n_rows x n_cols values"),
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn dense_products_by_hand() {
        let w = Linear::dense(array![[1.0, 2.0, 3.0], [0.0, -1.0, 1.0]]);
        let mut ys = [0.0; 4];
        w.matmul(
            Dispatch::detect(),
            &[1.0, 1.0, 1.0, 2.0, 0.0, 1.0],
            2,
            &mut ys,
        );
        assert_eq!(ys, [6.0, 0.0, 5.0, 1.0]);
        let mut row = [0.0; 3];
        w.row(1, &mut row);
        assert_eq!(row, [0.0, -1.0, 1.0]);
    }
}

//! [`Error`]: every failure of lm-model, one variant per part of the crate.

use crate::catalog::CatalogError;
use crate::gguf::GgufError;
use crate::ngram::NgramError;
use crate::quant::QuantError;
use crate::transformer::TransformerError;

/// Any failure of lm-model: the typed error of the part that failed.
///
/// Each part's functions return their own enum (the precise detail to
/// match on); `?` turns any of them into this one. A failure has one
/// variant: a GGUF failure while loading a transformer is [`Error::Gguf`],
/// as it is when opening the file alone.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A malformed GGUF file, or a metadata or tensor lookup that failed.
    #[error(transparent)]
    Gguf(GgufError),
    /// A transformer configuration or weights that disagree with it.
    #[error(transparent)]
    Transformer(TransformerError),
    /// Bad input to n-gram training, estimation or the model readers.
    #[error(transparent)]
    Ngram(#[from] NgramError),
    /// Bad input to a quantized-matrix routine.
    #[error(transparent)]
    Quant(#[from] QuantError),
    /// A model known by name that could not be found.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
}

impl From<GgufError> for Error {
    fn from(error: GgufError) -> Self {
        Error::Gguf(error)
    }
}

impl From<TransformerError> for Error {
    /// A transformer error that only wraps a GGUF one becomes [`Error::Gguf`].
    fn from(error: TransformerError) -> Self {
        match error {
            TransformerError::Gguf(error) => Error::Gguf(error),
            error => Error::Transformer(error),
        }
    }
}

/// The result type of lm-model.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gguf_failure_has_one_variant_whichever_part_saw_it() {
        let missing = || GgufError::MissingKey { key: "k".into() };
        assert!(matches!(
            Error::from(missing()),
            Error::Gguf(GgufError::MissingKey { .. })
        ));
        assert!(matches!(
            Error::from(TransformerError::Gguf(missing())),
            Error::Gguf(GgufError::MissingKey { .. })
        ));
        assert!(matches!(
            Error::from(TransformerError::MissingPositionEmbedding),
            Error::Transformer(TransformerError::MissingPositionEmbedding)
        ));
    }
}

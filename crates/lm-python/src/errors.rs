//! The Python exceptions: `lm.LmError` and its subclasses, each raised with
//! the Rust error's whole message (its sources joined by ": ").
//!
//! ```text
//! LmError ─┬─ ModelFileError    a path that loads no model (missing, not GGUF, bad weights or metadata)
//!          ├─ InvalidArgument   a setting, id, prompt or message the engine refuses
//!          │   └─ FormatError   a json_schema / regex / grammar / choice the grammar engine refuses
//!          ├─ TokenizerError    text or ids the tokenizer cannot convert
//!          └─ TemplateError     no chat template, or one that fails to render
//! ```
//!
//! An error that means a bug in the engine (a model that wrote the wrong
//! number of logits) is a plain `LmError`.

use std::error::Error as StdError;

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    lm,
    LmError,
    PyException,
    "Every error of the lm engine; the message is the Rust error's."
);
create_exception!(
    lm,
    ModelFileError,
    LmError,
    "A path that gives no model: missing, not GGUF, or weights or metadata that build none."
);
create_exception!(
    lm,
    InvalidArgument,
    LmError,
    "A setting, token id, prompt or message that the engine refuses."
);
create_exception!(
    lm,
    FormatError,
    InvalidArgument,
    "A structured-output format (json_schema, regex, grammar, choice) the grammar engine refuses."
);
create_exception!(
    lm,
    TokenizerError,
    LmError,
    "Text or ids that the model's tokenizer cannot convert."
);
create_exception!(
    lm,
    TemplateError,
    LmError,
    "A chat asked of a model without a chat template, or a template that fails to render."
);

/// Adds the exception classes to the module.
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add("LmError", py.get_type::<LmError>())?;
    module.add("ModelFileError", py.get_type::<ModelFileError>())?;
    module.add("InvalidArgument", py.get_type::<InvalidArgument>())?;
    module.add("FormatError", py.get_type::<FormatError>())?;
    module.add("TokenizerError", py.get_type::<TokenizerError>())?;
    module.add("TemplateError", py.get_type::<TemplateError>())?;
    Ok(())
}

/// The error's message followed by each of its sources.
pub fn message(error: &dyn StdError) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        let inner_text = inner.to_string();
        // `#[error(transparent)]` wrappers repeat their source's text.
        if !text.ends_with(&inner_text) {
            text.push_str(": ");
            text.push_str(&inner_text);
        }
        source = inner.source();
    }
    text
}

/// An `InvalidArgument` with this message (a check of this crate's own).
pub fn invalid(text: impl Into<String>) -> PyErr {
    InvalidArgument::new_err(text.into())
}

/// A chat template's or the tokenizer's error.
pub fn from_text(error: lm::TextError) -> PyErr {
    match error {
        lm::TextError::Tokenize(inner) => from_tokenize(inner),
        other => TemplateError::new_err(message(&other)),
    }
}

/// The tokenizer's error (a template's failures are template errors).
pub fn from_tokenize(error: lm_tokenize::TokenizeError) -> PyErr {
    use lm_tokenize::TokenizeError as E;
    match error {
        E::TemplateSyntax { .. }
        | E::TemplateRender { .. }
        | E::TemplateTooCostly { .. }
        | E::CannotContinueMessage => TemplateError::new_err(message(&error)),
        E::MarkerInMessage { .. } => InvalidArgument::new_err(message(&error)),
        _ => TokenizerError::new_err(message(&error)),
    }
}

/// The facade's error: a file that gives no model, or a call it refused.
pub fn from_lm(error: lm::Error) -> PyErr {
    use lm::Error as E;
    match error {
        E::FileMissing { .. }
        | E::Open { .. }
        | E::Model { .. }
        | E::Hf { .. }
        | E::HfTokenizer { .. }
        | E::Text { .. } => ModelFileError::new_err(message(&error)),
        E::Tokenize(inner) => from_tokenize(inner),
        E::Chat(inner) => from_text(inner),
        E::Format(inner) => FormatError::new_err(message(&inner)),
        E::Decode(inner) => from_decode(inner),
        E::Setting(_) | E::NothingToScore { .. } => InvalidArgument::new_err(message(&error)),
        _ => LmError::new_err(message(&error)),
    }
}

/// A decoding error: the caller's settings or input, unless it can only
/// come from a faulty model.
pub fn from_decode(error: lm_decode::Error) -> PyErr {
    use lm_decode::Error as E;
    match error {
        E::Core(inner) => from_core(inner),
        E::LogitsLength { .. }
        | E::LogitsRows { .. }
        | E::DraftDistributionLength { .. }
        | E::DraftTokenNotInDistribution { .. } => LmError::new_err(message(&error)),
        _ => InvalidArgument::new_err(message(&error)),
    }
}

/// A core error: bad input (ids, temperature, context) or a faulty model.
pub fn from_core(error: lm_core::Error) -> PyErr {
    use lm_core::Error as E;
    match error {
        E::EmptyLogits | E::InvalidLogit { .. } | E::ConstraintEngine { .. } => {
            LmError::new_err(message(&error))
        }
        _ => InvalidArgument::new_err(message(&error)),
    }
}

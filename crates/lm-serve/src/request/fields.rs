//! The typed reader of a request body's fields: each getter checks the
//! field's type and range, and its error is a 400 naming the field.

use serde_json::{Map, Value};

use crate::error::ApiError;

/// A request body's fields, each read with its type checked.
pub(crate) struct Fields<'a>(pub(crate) &'a Map<String, Value>);

impl<'a> Fields<'a> {
    pub(crate) fn of(body: &'a Value) -> Result<Self, ApiError> {
        body.as_object()
            .map(Fields)
            .ok_or_else(|| ApiError::invalid("body", "the request body must be a JSON object"))
    }

    /// The field, absent or `null` as `None`.
    pub(crate) fn get(&self, name: &str) -> Option<&'a Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    pub(crate) fn number(&self, name: &str) -> Result<Option<f64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                ApiError::invalid(name, format!("'{name}' must be a number, got {v}"))
            }),
        }
    }

    /// A number in `[lo, hi]`.
    pub(crate) fn f32_in(&self, name: &str, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
        match self.number(name)? {
            Some(x) if !(lo..=hi).contains(&x) => Err(ApiError::invalid(
                name,
                format!("'{name}' must be between {lo} and {hi}, got {x}"),
            )),
            x => Ok(x.map(|x| x as f32)),
        }
    }

    /// A whole number in `[lo, hi]`.
    pub(crate) fn integer_in(&self, name: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => {
                let x = v.as_i64().ok_or_else(|| {
                    ApiError::invalid(name, format!("'{name}' must be an integer, got {v}"))
                })?;
                if (lo..=hi).contains(&x) {
                    Ok(Some(x))
                } else {
                    Err(ApiError::invalid(
                        name,
                        format!("'{name}' must be between {lo} and {hi}, got {x}"),
                    ))
                }
            }
        }
    }

    /// A number in `[0, 1)` (HF's cutoffs; 0 is off).
    pub(crate) fn f32_below_one(&self, name: &str) -> Result<Option<f32>, ApiError> {
        match self.f32_in(name, 0.0, 1.0)? {
            Some(x) if x >= 1.0 => Err(ApiError::invalid(
                name,
                format!("'{name}' must be at least 0 and less than 1, got {x}"),
            )),
            x => Ok(x),
        }
    }

    pub(crate) fn string(&self, name: &str) -> Result<Option<&'a str>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| {
                ApiError::invalid(name, format!("'{name}' must be a string, got {v}"))
            }),
        }
    }

    pub(crate) fn boolean(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| {
                ApiError::invalid(name, format!("'{name}' must be a boolean, got {v}"))
            }),
        }
    }
}

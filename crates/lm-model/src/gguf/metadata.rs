//! Metadata values: the thirteen GGUF value types, including nested arrays.
//!
//! ```text
//! key/value pair: | key: string | type: u32 | value |
//! string:         | len: u64 | len bytes of UTF-8 |
//! array:          | element type: u32 | count: u64 | count values |
//! type ids:       0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool,
//!                 8 string, 9 array, 10 u64, 11 i64, 12 f64
//! ```

use std::fmt;

use super::GgufError;
use super::cursor::Cursor;

/// Arrays nested deeper than this are rejected (real files nest at most once).
pub const MAX_ARRAY_DEPTH: usize = 8;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetadataValue {
    /// Type 0.
    U8(u8),
    /// Type 1.
    I8(i8),
    /// Type 2.
    U16(u16),
    /// Type 3.
    I16(i16),
    /// Type 4.
    U32(u32),
    /// Type 5.
    I32(i32),
    /// Type 10.
    U64(u64),
    /// Type 11.
    I64(i64),
    /// Type 6.
    F32(f32),
    /// Type 12.
    F64(f64),
    /// Type 7, stored as one byte 0 or 1.
    Bool(bool),
    /// Type 8.
    String(String),
    /// Type 9: values of one element type (arrays may nest).
    Array(Vec<MetadataValue>),
}

impl MetadataValue {
    /// The GGUF name of this value's type (`"u32"`, `"string"`, `"array"`, ...).
    pub fn type_name(&self) -> &'static str {
        match self {
            MetadataValue::U8(_) => "u8",
            MetadataValue::I8(_) => "i8",
            MetadataValue::U16(_) => "u16",
            MetadataValue::I16(_) => "i16",
            MetadataValue::U32(_) => "u32",
            MetadataValue::I32(_) => "i32",
            MetadataValue::U64(_) => "u64",
            MetadataValue::I64(_) => "i64",
            MetadataValue::F32(_) => "f32",
            MetadataValue::F64(_) => "f64",
            MetadataValue::Bool(_) => "bool",
            MetadataValue::String(_) => "string",
            MetadataValue::Array(_) => "array",
        }
    }

    /// The GGUF type id of this value.
    pub fn type_id(&self) -> u32 {
        match self {
            MetadataValue::U8(_) => 0,
            MetadataValue::I8(_) => 1,
            MetadataValue::U16(_) => 2,
            MetadataValue::I16(_) => 3,
            MetadataValue::U32(_) => 4,
            MetadataValue::I32(_) => 5,
            MetadataValue::F32(_) => 6,
            MetadataValue::Bool(_) => 7,
            MetadataValue::String(_) => 8,
            MetadataValue::Array(_) => 9,
            MetadataValue::U64(_) => 10,
            MetadataValue::I64(_) => 11,
            MetadataValue::F64(_) => 12,
        }
    }

    /// The value as an integer, if it is one of the eight integer types.
    pub fn as_integer(&self) -> Option<i128> {
        match *self {
            MetadataValue::U8(v) => Some(v.into()),
            MetadataValue::I8(v) => Some(v.into()),
            MetadataValue::U16(v) => Some(v.into()),
            MetadataValue::I16(v) => Some(v.into()),
            MetadataValue::U32(v) => Some(v.into()),
            MetadataValue::I32(v) => Some(v.into()),
            MetadataValue::U64(v) => Some(v.into()),
            MetadataValue::I64(v) => Some(v.into()),
            _ => None,
        }
    }

    /// The value as f64, if it is F32 or F64.
    pub fn as_float(&self) -> Option<f64> {
        match *self {
            MetadataValue::F32(v) => Some(v.into()),
            MetadataValue::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The string, if the value is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetadataValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The elements, if the value is an array.
    pub fn as_array(&self) -> Option<&[MetadataValue]> {
        match self {
            MetadataValue::Array(items) => Some(items),
            _ => None,
        }
    }

    /// Writes the value, showing at most `max_items` elements of each array
    /// and at most `max_chars` characters of each string (`None`: everything).
    pub(crate) fn write_shortened(
        &self,
        f: &mut fmt::Formatter<'_>,
        max_items: Option<usize>,
        max_chars: Option<usize>,
    ) -> fmt::Result {
        match self {
            MetadataValue::U8(v) => write!(f, "{v}"),
            MetadataValue::I8(v) => write!(f, "{v}"),
            MetadataValue::U16(v) => write!(f, "{v}"),
            MetadataValue::I16(v) => write!(f, "{v}"),
            MetadataValue::U32(v) => write!(f, "{v}"),
            MetadataValue::I32(v) => write!(f, "{v}"),
            MetadataValue::U64(v) => write!(f, "{v}"),
            MetadataValue::I64(v) => write!(f, "{v}"),
            MetadataValue::F32(v) => write!(f, "{v}"),
            MetadataValue::F64(v) => write!(f, "{v}"),
            MetadataValue::Bool(v) => write!(f, "{v}"),
            MetadataValue::String(s) => match max_chars {
                Some(max) if s.chars().count() > max => {
                    let head: String = s.chars().take(max).collect();
                    write!(f, "{head:?}... ({} bytes)", s.len())
                }
                _ => write!(f, "{s:?}"),
            },
            MetadataValue::Array(items) => {
                f.write_str("[")?;
                let shown = max_items.unwrap_or(items.len()).min(items.len());
                for (idx, item) in items.iter().take(shown).enumerate() {
                    if idx > 0 {
                        f.write_str(", ")?;
                    }
                    item.write_shortened(f, max_items, max_chars)?;
                }
                if shown < items.len() {
                    write!(f, ", ... ({} items)", items.len())?;
                }
                f.write_str("]")
            }
        }
    }
}

impl fmt::Display for MetadataValue {
    /// The whole value: numbers plain, strings quoted and escaped, arrays in brackets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_shortened(f, None, None)
    }
}

/// The smallest encoding of a value of type `type_id` (unknown ids: 1, so that
/// the type is rejected when the first element is read, not by a count check).
fn min_value_bytes(type_id: u32) -> u64 {
    match type_id {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 12,
        _ => 1,
    }
}

/// Reads a value of type `type_id` at the cursor; `depth` counts enclosing arrays.
pub(crate) fn read_value(
    cursor: &mut Cursor<'_>,
    type_id: u32,
    type_offset: usize,
    depth: usize,
) -> Result<MetadataValue, GgufError> {
    Ok(match type_id {
        0 => MetadataValue::U8(u8::from_le_bytes(cursor.array("u8 value")?)),
        1 => MetadataValue::I8(i8::from_le_bytes(cursor.array("i8 value")?)),
        2 => MetadataValue::U16(u16::from_le_bytes(cursor.array("u16 value")?)),
        3 => MetadataValue::I16(i16::from_le_bytes(cursor.array("i16 value")?)),
        4 => MetadataValue::U32(u32::from_le_bytes(cursor.array("u32 value")?)),
        5 => MetadataValue::I32(i32::from_le_bytes(cursor.array("i32 value")?)),
        6 => MetadataValue::F32(f32::from_le_bytes(cursor.array("f32 value")?)),
        7 => {
            let offset = cursor.pos() as u64;
            match cursor.array::<1>("bool value")? {
                [0] => MetadataValue::Bool(false),
                [1] => MetadataValue::Bool(true),
                [value] => return Err(GgufError::InvalidBool { value, offset }),
            }
        }
        8 => MetadataValue::String(cursor.string("string value")?.to_owned()),
        9 => {
            let array_offset = cursor.pos() as u64;
            if depth >= MAX_ARRAY_DEPTH {
                return Err(GgufError::NestingTooDeep {
                    max_depth: MAX_ARRAY_DEPTH,
                    offset: array_offset,
                });
            }
            let element_type_offset = cursor.pos();
            let element_type = cursor.u32("array element type")?;
            check_value_type(element_type, element_type_offset)?;
            let count = cursor.count("array element", min_value_bytes(element_type))?;
            // `count` items of at least one byte each fit in the file.
            let mut items = Vec::with_capacity(count);
            for _ in 0..count {
                items.push(read_value(
                    cursor,
                    element_type,
                    element_type_offset,
                    depth + 1,
                )?);
            }
            MetadataValue::Array(items)
        }
        10 => MetadataValue::U64(u64::from_le_bytes(cursor.array("u64 value")?)),
        11 => MetadataValue::I64(i64::from_le_bytes(cursor.array("i64 value")?)),
        12 => MetadataValue::F64(f64::from_le_bytes(cursor.array("f64 value")?)),
        _ => {
            return Err(GgufError::UnknownValueType {
                type_id,
                offset: type_offset as u64,
            });
        }
    })
}

/// Errors unless `type_id` is one of the thirteen value types.
pub(crate) fn check_value_type(type_id: u32, offset: usize) -> Result<(), GgufError> {
    if type_id <= 12 {
        Ok(())
    } else {
        Err(GgufError::UnknownValueType {
            type_id,
            offset: offset as u64,
        })
    }
}

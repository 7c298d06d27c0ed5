//! A test-only GGUF writer, independent of the reader: whole files from
//! metadata pairs and tensors, or any byte sequence (a hostile header, a
//! truncated string) written field by field.

use lm_model::MetadataValue;

/// GGML tensor type id of f32.
pub const F32: u32 = 0;
/// GGML tensor type id of f16.
pub const F16: u32 = 1;
/// GGML tensor type id of bf16.
pub const BF16: u32 = 30;

/// GGUF's metadata value types in the order of their ids, spelled out here
/// apart from the reader's table.
const VALUE_TYPES_BY_ID: [&str; 13] = [
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
];

/// The GGUF type id of a metadata value.
pub fn type_id(value: &MetadataValue) -> u32 {
    let name = value.type_name();
    let idx = VALUE_TYPES_BY_ID
        .iter()
        .position(|&known| known == name)
        .unwrap_or_else(|| panic!("no GGUF type id for {name}"));
    u32::try_from(idx).expect("13 ids")
}

/// Little-endian GGUF bytes, built by chained calls.
#[derive(Debug, Default, Clone)]
pub struct GgufWriter(Vec<u8>);

impl GgufWriter {
    /// Magic, version, tensor count, metadata count.
    pub fn header(version: u32, n_tensors: u64, n_kv: u64) -> Self {
        GgufWriter::default()
            .raw(b"GGUF")
            .u32(version)
            .u64(n_tensors)
            .u64(n_kv)
    }
    pub fn u8(self, v: u8) -> Self {
        self.raw(&[v])
    }
    pub fn u32(self, v: u32) -> Self {
        self.raw(&v.to_le_bytes())
    }
    pub fn u64(self, v: u64) -> Self {
        self.raw(&v.to_le_bytes())
    }
    pub fn raw(mut self, bytes: &[u8]) -> Self {
        self.0.extend_from_slice(bytes);
        self
    }
    /// A GGUF string: u64 byte length, then the bytes (not necessarily UTF-8).
    pub fn str(self, s: impl AsRef<[u8]>) -> Self {
        let s = s.as_ref();
        self.u64(s.len() as u64).raw(s)
    }
    /// A metadata value without its type id (arrays carry their element's).
    pub fn value(self, value: &MetadataValue) -> Self {
        use MetadataValue as V;
        match value {
            V::U8(v) => self.u8(*v),
            V::I8(v) => self.raw(&v.to_le_bytes()),
            V::U16(v) => self.raw(&v.to_le_bytes()),
            V::I16(v) => self.raw(&v.to_le_bytes()),
            V::U32(v) => self.u32(*v),
            V::I32(v) => self.raw(&v.to_le_bytes()),
            V::U64(v) => self.u64(*v),
            V::I64(v) => self.raw(&v.to_le_bytes()),
            V::F32(v) => self.raw(&v.to_le_bytes()),
            V::F64(v) => self.raw(&v.to_le_bytes()),
            V::Bool(v) => self.u8(u8::from(*v)),
            V::String(s) => self.str(s),
            V::Array(items) => {
                // The element type of the first item (u8 for an empty array).
                let element_type = items.first().map_or(0, type_id);
                items.iter().fold(
                    self.u32(element_type).u64(items.len() as u64),
                    |out, item| out.value(item),
                )
            }
        }
    }
    /// A metadata pair: key, type id, value.
    pub fn kv(self, key: &str, value: &MetadataValue) -> Self {
        self.str(key).u32(type_id(value)).value(value)
    }
    /// A tensor info: name, dims (ggml order), GGML type id, data offset.
    pub fn tensor_info(self, name: &str, dims: &[u64], type_id: u32, offset: u64) -> Self {
        dims.iter()
            .fold(self.str(name).u32(dims.len() as u32), |out, &dim| {
                out.u64(dim)
            })
            .u32(type_id)
            .u64(offset)
    }
    /// Zero bytes up to a multiple of `alignment`.
    pub fn pad_to(mut self, alignment: usize) -> Self {
        self.0.resize(self.0.len().next_multiple_of(alignment), 0);
        self
    }
    /// The bytes written.
    pub fn finish(self) -> Vec<u8> {
        self.0
    }
}

/// A tensor to write: name, dims in ggml order (`[n_cols, n_rows]`, or `[n]`
/// for a vector), GGML type id, data bytes.
#[derive(Debug, Clone)]
pub struct GgufTensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub type_id: u32,
    pub data: Vec<u8>,
}

impl GgufTensor {
    /// An f32 tensor.
    pub fn f32(name: &str, dims: Vec<u64>, values: &[f32]) -> GgufTensor {
        GgufTensor {
            name: name.to_owned(),
            dims,
            type_id: F32,
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }
}

/// A file with no metadata and one tensor info, then `n_data_bytes` zero
/// bytes of data: for the ways a tensor table can be wrong.
pub fn one_tensor_file(
    name: &str,
    dims: &[u64],
    type_id: u32,
    offset: u64,
    n_data_bytes: usize,
) -> Vec<u8> {
    GgufWriter::header(3, 1, 0)
        .tensor_info(name, dims, type_id, offset)
        .pad_to(32)
        .raw(&vec![0; n_data_bytes])
        .finish()
}

/// The metadata of a file that has none (for [`gguf_file`]).
pub const NO_METADATA: &[(&str, MetadataValue)] = &[];

/// A whole, well-formed GGUF file: header, metadata pairs, tensor infos,
/// then each tensor's data, every section padded to `alignment`.
pub fn gguf_file(
    version: u32,
    alignment: usize,
    kvs: &[(impl AsRef<str>, MetadataValue)],
    tensors: &[GgufTensor],
) -> Vec<u8> {
    let mut out = GgufWriter::header(version, tensors.len() as u64, kvs.len() as u64);
    for (key, value) in kvs {
        out = out.kv(key.as_ref(), value);
    }
    let mut offset = 0;
    for tensor in tensors {
        out = out.tensor_info(&tensor.name, &tensor.dims, tensor.type_id, offset as u64);
        offset += tensor.data.len().next_multiple_of(alignment);
    }
    out = out.pad_to(alignment);
    for tensor in tensors {
        out = out.raw(&tensor.data).pad_to(alignment);
    }
    out.finish()
}

//! GGUF parsing on tiny files built in memory: a round trip through the
//! test-only writer of `common::gguf_writer`, and one regression test per
//! way a file can be malformed.

use lm_model::GgmlType;
use lm_model::{GgufError, GgufFile, MetadataValue};
use proptest::prelude::*;

use crate::common::gguf_writer::{GgufTensor, GgufWriter, NO_METADATA, gguf_file, one_tensor_file};

fn parse_err(bytes: Vec<u8>) -> GgufError {
    match GgufFile::from_bytes(bytes) {
        Ok(file) => panic!("expected an error, parsed {file:?}"),
        Err(err) => err,
    }
}

/// Parses `bytes`, asserts that the error matches the pattern (by
/// reference, as `matches!(&err, ...)`), and returns the error.
macro_rules! parse_err_matching {
    ($bytes:expr, $($pattern:tt)+) => {{
        let err = parse_err($bytes);
        assert!(matches!(&err, $($pattern)+), "{err:?}");
        err
    }};
}

/// One f32 tensor `t` of 2 elements, for tests that only vary the header.
fn small_tensor() -> GgufTensor {
    GgufTensor::f32("t", vec![2], &[1.5, -2.0])
}

fn every_value_type() -> Vec<(&'static str, MetadataValue)> {
    use MetadataValue as V;
    vec![
        ("t.u8", V::U8(200)),
        ("t.i8", V::I8(-100)),
        ("t.u16", V::U16(60000)),
        ("t.i16", V::I16(-30000)),
        ("t.u32", V::U32(4_000_000_000)),
        ("t.i32", V::I32(-2_000_000_000)),
        ("t.u64", V::U64(u64::MAX)),
        ("t.i64", V::I64(i64::MIN)),
        ("t.f32", V::F32(1e-5)),
        ("t.f64", V::F64(-2.5e300)),
        ("t.bool", V::Bool(true)),
        ("t.string", V::String("héllo ✓".into())),
        ("t.empty_string", V::String(String::new())),
        (
            "t.strings",
            V::Array(vec![V::String("a".into()), V::String("Ġb".into())]),
        ),
        ("t.i32s", V::Array(vec![V::I32(3), V::I32(-1)])),
        ("t.empty_array", V::Array(vec![])),
        (
            "t.nested",
            V::Array(vec![
                V::Array(vec![V::U8(1), V::U8(2)]),
                V::Array(vec![V::F32(0.5)]),
            ]),
        ),
    ]
}

// ---------------------------------------------------------------------------
// Valid files.
// ---------------------------------------------------------------------------

#[test]
fn round_trip_every_value_type_and_tensor_type_in_versions_2_and_3() {
    let q4_0_block: Vec<u8> = (0..18u8).collect();
    let tensors = vec![
        small_tensor(),
        GgufTensor {
            name: "half".into(),
            dims: vec![3],
            type_id: 1,
            data: vec![0, 0x3c, 0, 0xc0, 0, 0],
        },
        GgufTensor {
            name: "q4".into(),
            dims: vec![32, 2],
            type_id: 2,
            data: [q4_0_block.clone(), q4_0_block].concat(),
        },
        GgufTensor {
            name: "q8".into(),
            dims: vec![32],
            type_id: 8,
            data: vec![7; 34],
        },
        GgufTensor {
            name: "q41".into(),
            dims: vec![32],
            type_id: 3,
            data: vec![9; 20],
        },
        GgufTensor {
            name: "bf".into(),
            dims: vec![1, 1, 1, 2],
            type_id: 30,
            data: vec![1, 2, 3, 4],
        },
    ];
    let kvs = every_value_type();
    for version in [2, 3] {
        let file = GgufFile::from_bytes(gguf_file(version, 32, &kvs, &tensors)).unwrap();
        assert_eq!(file.version(), version);
        assert_eq!(file.alignment(), 32);
        let read: Vec<(&str, &MetadataValue)> = file
            .metadata()
            .iter()
            .map(|(k, v)| (k.as_str(), v))
            .collect();
        let expected: Vec<(&str, &MetadataValue)> = kvs.iter().map(|(k, v)| (*k, v)).collect();
        assert_eq!(read, expected);
        assert_eq!(file.get("t.u16"), Some(&MetadataValue::U16(60000)));
        assert_eq!(file.get("absent"), None);

        let names: Vec<&str> = file.tensors().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["t", "half", "q4", "q8", "q41", "bf"]);
        for spec in &tensors {
            let view = file.tensor(&spec.name).unwrap();
            assert_eq!(view.data, spec.data.as_slice(), "{}", spec.name);
            assert_eq!(view.info.n_bytes, spec.data.len());
            assert_eq!(view.info.ggml_type.id(), spec.type_id);
            let dims: Vec<u64> = view.info.dims.iter().map(|&d| d as u64).collect();
            assert_eq!(dims, spec.dims);
            assert_eq!(view.info.offset % 32, 0);
        }
        assert_eq!(file.tensor("t").unwrap().to_f32_vec().unwrap(), [1.5, -2.0]);
        assert_eq!(
            file.tensor("half").unwrap().to_f32_vec().unwrap(),
            [1.0, -2.0, 0.0]
        );
        assert_eq!(file.tensor("bf").unwrap().info.n_rows(), 2);
        assert_eq!(file.tensor("q4").unwrap().matrix().unwrap().n_rows(), 2);
    }
}

#[test]
fn typed_getters_accept_any_integer_width_that_fits() {
    let file = GgufFile::from_bytes(gguf_file(3, 32, &every_value_type(), &[])).unwrap();
    assert_eq!(file.get_u32("t.u8").unwrap(), 200);
    assert_eq!(file.get_u32("t.u16").unwrap(), 60000);
    assert_eq!(file.get_u32("t.u32").unwrap(), 4_000_000_000);
    assert_eq!(file.get_u64("t.u64").unwrap(), u64::MAX);
    assert_eq!(file.get_i32("t.i8").unwrap(), -100);
    assert_eq!(file.get_f32("t.f32").unwrap(), 1e-5);
    assert_eq!(file.get_f32("t.f64").unwrap(), f32::NEG_INFINITY); // -2.5e300 rounds to -inf
    assert!(file.get_bool("t.bool").unwrap());
    assert_eq!(file.get_str("t.string").unwrap(), "héllo ✓");
    assert_eq!(file.get_string_array("t.strings").unwrap(), ["a", "Ġb"]);
    assert_eq!(file.get_i32_array("t.i32s").unwrap(), [3, -1]);
    assert_eq!(
        file.get_i32_array("t.empty_array").unwrap(),
        Vec::<i32>::new()
    );
}

#[test]
fn typed_getter_on_wrong_type_names_key_and_both_types() {
    let file = GgufFile::from_bytes(gguf_file(3, 32, &every_value_type(), &[])).unwrap();
    let err = file.get_u32("t.string").unwrap_err();
    assert!(
        matches!(&err, GgufError::WrongType { key, expected: "an integer", found: "string" } if key == "t.string"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "metadata key \"t.string\" holds string, expected an integer"
    );
    assert!(matches!(
        file.get_str("t.u8"),
        Err(GgufError::WrongType { found: "u8", .. })
    ));
    assert!(matches!(
        file.get_bool("t.u8"),
        Err(GgufError::WrongType { found: "u8", .. })
    ));
    assert!(matches!(
        file.get_f32("t.u32"),
        Err(GgufError::WrongType { found: "u32", .. })
    ));
    assert!(matches!(
        file.get_string_array("t.i32s"),
        Err(GgufError::WrongType {
            found: "an array of i32",
            ..
        })
    ));
    assert!(matches!(
        file.get_i32_array("t.strings"),
        Err(GgufError::WrongType {
            found: "an array of string",
            ..
        })
    ));
    assert!(matches!(
        file.get_string_array("t.u32"),
        Err(GgufError::WrongType { found: "u32", .. })
    ));
}

#[test]
fn typed_getter_on_value_that_does_not_fit_reports_the_value() {
    let file = GgufFile::from_bytes(gguf_file(3, 32, &every_value_type(), &[])).unwrap();
    let err = file.get_u32("t.i8").unwrap_err();
    assert!(
        matches!(&err, GgufError::ValueOutOfRange { key, value: -100, expected: "u32" } if key == "t.i8"),
        "{err:?}"
    );
    assert!(matches!(
        file.get_u32("t.u64"),
        Err(GgufError::ValueOutOfRange { value, .. }) if value == i128::from(u64::MAX)
    ));
    assert!(matches!(
        file.get_i32("t.u32"),
        Err(GgufError::ValueOutOfRange {
            value: 4_000_000_000,
            ..
        })
    ));
}

#[test]
fn missing_key_and_missing_tensor_are_named() {
    let file = GgufFile::from_bytes(gguf_file(3, 32, NO_METADATA, &[small_tensor()])).unwrap();
    let err = file.get_u32("llama.block_count").unwrap_err();
    assert!(matches!(&err, GgufError::MissingKey { key } if key == "llama.block_count"));
    assert_eq!(
        err.to_string(),
        "metadata key \"llama.block_count\" not found"
    );
    let err = file.tensor("output.weight").unwrap_err();
    assert!(matches!(&err, GgufError::MissingTensor { name } if name == "output.weight"));
}

#[test]
fn alignment_key_moves_the_data_section() {
    let kvs = [("general.alignment", MetadataValue::U32(64))];
    let tensors = [
        small_tensor(),
        GgufTensor {
            name: "second".into(),
            dims: vec![1],
            type_id: 0,
            data: 7.0f32.to_le_bytes().to_vec(),
        },
    ];
    let file = GgufFile::from_bytes(gguf_file(3, 64, &kvs, &tensors)).unwrap();
    assert_eq!(file.alignment(), 64);
    assert_eq!(file.data_offset() % 64, 0);
    assert_eq!(file.tensor("second").unwrap().info.offset, 64);
    assert_eq!(file.tensor("second").unwrap().to_f32_vec().unwrap(), [7.0]);
}

#[test]
fn header_only_file_has_no_data_section() {
    let file = GgufFile::from_bytes(GgufWriter::header(3, 0, 0).finish()).unwrap();
    assert!(file.metadata().is_empty());
    assert!(file.tensors().is_empty());
}

#[test]
fn open_reads_and_map_maps_the_same_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let bytes = gguf_file(3, 32, &every_value_type(), &[small_tensor()]);
    std::fs::write(&path, &bytes).unwrap();
    for file in [
        GgufFile::open(&path).unwrap(),
        GgufFile::map(&path).unwrap(),
    ] {
        // `open` rounds its buffer up to a huge page; the file is what it read.
        assert_eq!(file.bytes(), &bytes[..]);
        assert_eq!(file.get_u32("t.u8").unwrap(), 200);
        assert_eq!(file.tensor("t").unwrap().to_f32_vec().unwrap(), [1.5, -2.0]);
    }

    let missing = dir.path().join("absent.gguf");
    for err in [
        GgufFile::open(&missing).unwrap_err(),
        GgufFile::map(&missing).unwrap_err(),
    ] {
        assert!(matches!(&err, GgufError::Io { path, .. } if *path == missing));
    }

    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert!(matches!(
        GgufFile::open(&empty).unwrap_err(),
        GgufError::BadMagic { found } if found.is_empty()
    ));
}

/// `open` puts the data section on a 64-byte line in memory wherever the
/// file starts it (GGUF aligns it to 32 bytes), so the kernels' 64-byte
/// loads of a tensor never straddle two lines.
#[test]
fn open_puts_the_data_section_on_a_cache_line() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = [
        GgufTensor::f32("line", vec![16], &[0.5; 16]),
        small_tensor(),
    ];
    let mut past_a_line = Vec::new();
    // Metadata strings 0 to 56 bytes long move the data section over every
    // multiple of 32 within a line.
    for pad in (0..8).map(|i| "x".repeat(8 * i)) {
        let kvs = [("pad", MetadataValue::String(pad.clone()))];
        let bytes = gguf_file(3, 32, &kvs, &tensors);
        let path = dir.path().join(format!("pad{}.gguf", pad.len()));
        std::fs::write(&path, &bytes).unwrap();
        let file = GgufFile::open(&path).unwrap();
        assert_eq!(file.bytes(), &bytes[..]);
        past_a_line.push(file.data_offset() % 64);
        let line = file.tensor("line").unwrap();
        assert_eq!(
            line.data.as_ptr() as usize % 64,
            0,
            "data section at {}",
            file.data_offset()
        );
        assert_eq!(line.to_f32_vec().unwrap(), [0.5; 16]);
        assert_eq!(file.tensor("t").unwrap().to_f32_vec().unwrap(), [1.5, -2.0]);
    }
    assert!(
        past_a_line.contains(&0) && past_a_line.contains(&32),
        "{past_a_line:?}"
    );
}

#[test]
fn summary_shortens_long_arrays_and_strings() {
    let tokens = MetadataValue::Array(
        (0..100)
            .map(|i| MetadataValue::String(format!("t{i}")))
            .collect(),
    );
    let kvs = [
        (
            "general.architecture",
            MetadataValue::String("llama".into()),
        ),
        ("tokenizer.ggml.tokens", tokens),
        ("long", MetadataValue::String("x".repeat(100))),
    ];
    let file = GgufFile::from_bytes(gguf_file(3, 32, &kvs, &[small_tensor()])).unwrap();
    let summary = file.summary().to_string();
    let lines: Vec<&str> = summary.lines().collect();
    assert_eq!(
        lines,
        [
            "gguf v3, 3 metadata pairs, 1 tensors, alignment 32",
            "general.architecture = \"llama\"",
            "tokenizer.ggml.tokens = [\"t0\", \"t1\", \"t2\", \"t3\", \"t4\", \"t5\", \"t6\", \"t7\", ... (100 items)]",
            &format!("long = \"{}\"... (100 bytes)", "x".repeat(60)),
            "tensors: 1 f32",
        ]
    );
    // Display of a value is never shortened.
    assert_eq!(
        MetadataValue::Array(vec![MetadataValue::U8(1), MetadataValue::Bool(false)]).to_string(),
        "[1, false]"
    );
}

// ---------------------------------------------------------------------------
// Malformed files: one regression test per error.
// ---------------------------------------------------------------------------

#[test]
fn wrong_magic_is_rejected_with_the_bytes_found() {
    let mut bytes = GgufWriter::header(3, 0, 0).finish();
    bytes[..4].copy_from_slice(b"GGML");
    parse_err_matching!(bytes, GgufError::BadMagic { found } if found == b"GGML");
    assert!(matches!(parse_err(b"GG".to_vec()), GgufError::BadMagic { found } if found == b"GG"));
    assert!(matches!(parse_err(Vec::new()), GgufError::BadMagic { .. }));
}

#[test]
fn a_bad_magic_is_named_in_hex_and_as_text() {
    let message = |bytes: &[u8]| parse_err(bytes.to_vec()).to_string();
    assert_eq!(
        message(b"GGML\x03\0\0\0"),
        "not a gguf file: magic is 0x47474d4c (\"GGML\"), expected 0x47475546 (\"GGUF\")"
    );
    assert_eq!(
        message(b"\x7fELF\x02\x01"),
        "not a gguf file: magic is 0x7f454c46 (\".ELF\"), expected 0x47475546 (\"GGUF\")"
    );
    assert_eq!(
        message(b"GG"),
        "not a gguf file: magic is 0x4747 (\"GG\"), expected 0x47475546 (\"GGUF\")"
    );
    assert_eq!(
        message(b""),
        "not a gguf file: the file is empty (expected the magic \"GGUF\")"
    );
}

#[test]
fn a_directory_or_a_fifo_is_refused_without_being_read_or_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("model.gguf");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    // Opening the FIFO would wait for a writer forever: refused first.
    for path in [dir.path().to_path_buf(), fifo] {
        for result in [GgufFile::open(&path), GgufFile::map(&path)] {
            let err = result.unwrap_err();
            assert!(
                matches!(&err, GgufError::NotRegularFile { path: p } if *p == path),
                "{err:?}"
            );
            assert!(err.to_string().ends_with("not a regular file"), "{err}");
        }
    }
}

#[test]
fn versions_other_than_2_and_3_are_unsupported() {
    for version in [0, 1, 4, u32::MAX] {
        let err = parse_err(GgufWriter::header(version, 0, 0).finish());
        assert!(
            matches!(err, GgufError::UnsupportedVersion { version: v } if v == version),
            "{err:?}"
        );
    }
}

#[test]
fn every_truncation_of_a_valid_file_is_an_error() {
    let bytes = gguf_file(3, 32, &every_value_type(), &[small_tensor()]);
    let file = GgufFile::from_bytes(bytes.clone()).unwrap();
    // The padding after the last tensor's data may go: everything before it may not.
    let data_end = file.data_offset() + 8;
    assert_eq!(bytes.len(), file.data_offset() + 32);
    for len in 0..data_end {
        let result = GgufFile::from_bytes(bytes[..len].to_vec());
        assert!(result.is_err(), "prefix of {len} bytes parsed");
    }
    for len in data_end..=bytes.len() {
        assert!(GgufFile::from_bytes(bytes[..len].to_vec()).is_ok());
    }
}

#[test]
fn truncation_names_the_field_and_offset() {
    // Header claims one pair; the key is there, the type id is cut after 2 bytes.
    let bytes = GgufWriter::header(3, 0, 1)
        .str(b"abcde")
        .u8(4)
        .u8(0)
        .finish();
    let err = parse_err_matching!(
        bytes,
        GgufError::Truncated {
            what: "metadata value type",
            offset: 37,
            needed: 4,
            available: 2
        }
    );
    assert_eq!(
        err.to_string(),
        "file truncated reading metadata value type at offset 37: need 4 bytes, 2 left"
    );
    parse_err_matching!(
        GgufWriter::header(3, 0, 1)
            .str(b"k")
            .u32(10)
            .u32(1)
            .finish(),
        GgufError::Truncated {
            what: "u64 value",
            offset: 37,
            ..
        }
    );
}

#[test]
fn metadata_count_beyond_file_is_rejected_before_allocating() {
    parse_err_matching!(
        GgufWriter::header(3, 0, u64::MAX).finish(),
        GgufError::CountBeyondFile {
            what: "metadata pair",
            count: u64::MAX,
            offset: 16,
            remaining: 0,
            ..
        }
    );
    let err = parse_err(GgufWriter::header(3, 1 << 60, 0).finish());
    assert!(
        matches!(err, GgufError::CountBeyondFile { what: "tensor info", count, .. } if count == 1 << 60),
        "{err:?}"
    );
}

#[test]
fn string_length_beyond_file_is_rejected() {
    let bytes = GgufWriter::header(3, 0, 1)
        .u64(1 << 50)
        .raw(&[b'a'; 16])
        .finish();
    let err = parse_err(bytes);
    assert!(
        matches!(err, GgufError::StringBeyondFile { what: "metadata key", len, offset: 32, remaining: 16 } if len == 1 << 50),
        "{err:?}"
    );
    let bytes = GgufWriter::header(3, 0, 1)
        .str(b"k")
        .u32(8)
        .u64(u64::MAX)
        .finish();
    assert!(matches!(
        parse_err(bytes),
        GgufError::StringBeyondFile {
            what: "string value",
            len: u64::MAX,
            ..
        }
    ));
}

#[test]
fn invalid_utf8_in_key_and_value_is_rejected() {
    let bytes = GgufWriter::header(3, 0, 1)
        .str([0x66, 0xff])
        .u32(0)
        .u8(1)
        .finish();
    parse_err_matching!(
        bytes,
        GgufError::InvalidUtf8 {
            what: "metadata key",
            offset: 32
        }
    );
    let bytes = GgufWriter::header(3, 0, 1)
        .str(b"k")
        .u32(8)
        .str([0xc3])
        .finish();
    assert!(matches!(
        parse_err(bytes),
        GgufError::InvalidUtf8 {
            what: "string value",
            offset: 45
        }
    ));
    let bytes = GgufWriter::header(3, 1, 0)
        .tensor_info("\u{0}", &[1], 0, 0)
        .finish();
    let mut bad_name = bytes.clone();
    bad_name[32] = 0x80;
    assert!(matches!(
        parse_err(bad_name),
        GgufError::InvalidUtf8 {
            what: "tensor name",
            ..
        }
    ));
}

#[test]
fn array_of_2_pow_40_elements_is_rejected_without_allocating() {
    let bytes = GgufWriter::header(3, 0, 1)
        .str(b"big")
        .u32(9)
        .u32(0)
        .u64(1 << 40)
        .raw(&[0; 64])
        .finish();
    let err = parse_err(bytes);
    assert!(
        matches!(err, GgufError::CountBeyondFile { what: "array element", count, min_item_bytes: 1, remaining: 64, .. } if count == 1 << 40),
        "{err:?}"
    );
    // Strings take at least 8 bytes each: 9 of them cannot fit in 64 bytes.
    let bytes = GgufWriter::header(3, 0, 1)
        .str(b"s")
        .u32(9)
        .u32(8)
        .u64(9)
        .raw(&[0; 64])
        .finish();
    assert!(matches!(
        parse_err(bytes),
        GgufError::CountBeyondFile {
            count: 9,
            min_item_bytes: 8,
            ..
        }
    ));
}

#[test]
fn unknown_value_type_invalid_bool_and_deep_nesting_are_rejected() {
    parse_err_matching!(
        GgufWriter::header(3, 0, 1).str(b"k").u32(13).u8(0).finish(),
        GgufError::UnknownValueType {
            type_id: 13,
            offset: 33
        }
    );
    parse_err_matching!(
        GgufWriter::header(3, 0, 1)
            .str(b"k")
            .u32(9)
            .u32(99)
            .u64(0)
            .finish(),
        GgufError::UnknownValueType {
            type_id: 99,
            offset: 37
        }
    );
    parse_err_matching!(
        GgufWriter::header(3, 0, 1).str(b"k").u32(7).u8(2).finish(),
        GgufError::InvalidBool {
            value: 2,
            offset: 37
        }
    );
    // 100 nested single-element arrays: rejected at depth 8, no stack overflow.
    let mut b = GgufWriter::header(3, 0, 1).str(b"k").u32(9);
    for _ in 0..100 {
        b = b.u32(9).u64(1);
    }
    let err = parse_err(b.u32(0).u64(0).finish());
    assert!(
        matches!(err, GgufError::NestingTooDeep { max_depth: 8, .. }),
        "{err:?}"
    );
}

#[test]
fn duplicate_key_is_rejected() {
    let bytes = GgufWriter::header(3, 0, 2)
        .kv("a", &MetadataValue::U32(1))
        .kv("a", &MetadataValue::U32(2))
        .finish();
    parse_err_matching!(bytes, GgufError::DuplicateKey { key } if key == "a");
}

#[test]
fn duplicate_tensor_name_is_rejected() {
    let bytes = gguf_file(3, 32, NO_METADATA, &[small_tensor(), small_tensor()]);
    parse_err_matching!(bytes, GgufError::DuplicateTensor { name } if name == "t");
}

#[test]
fn alignment_zero_or_not_a_power_of_two_is_rejected() {
    for alignment in [0u32, 3, 48] {
        let bytes = GgufWriter::header(3, 0, 1)
            .kv("general.alignment", &MetadataValue::U32(alignment))
            .finish();
        let err = parse_err(bytes);
        assert!(
            matches!(err, GgufError::BadAlignment { alignment: a } if a == u64::from(alignment)),
            "{err:?}"
        );
    }
    let bytes = GgufWriter::header(3, 0, 1)
        .str(b"general.alignment")
        .u32(8)
        .str(b"32")
        .finish();
    assert!(matches!(
        parse_err(bytes),
        GgufError::WrongType {
            found: "string",
            ..
        }
    ));
}

#[test]
fn dims_product_overflow_is_rejected() {
    let bytes = GgufWriter::header(3, 1, 0)
        .tensor_info("huge", &[1 << 32, 1 << 32, 1 << 8], 0, 0)
        .finish();
    parse_err_matching!(bytes, GgufError::DimsOverflow { name, dims }
        if name == "huge" && dims == &[1 << 32, 1 << 32, 1 << 8]);
}

#[test]
fn a_row_whose_byte_size_overflows_is_rejected() {
    // One Q8_0 row (type 8, 34 bytes per 32 values) of 2^64 - 32 values:
    // its block count fits in u64, its byte count does not.
    let row_len = u64::MAX - 31;
    let bytes = GgufWriter::header(3, 1, 0)
        .tensor_info("wide", &[row_len], 8, 0)
        .finish();
    parse_err_matching!(bytes, GgufError::DimsOverflow { name, dims }
        if name == "wide" && dims == &[row_len]);
}

#[test]
fn dimension_count_outside_1_to_4_is_rejected() {
    for n_dims in [0u32, 5] {
        let bytes = GgufWriter::header(3, 1, 0)
            .str(b"x")
            .u32(n_dims)
            .raw(&[0; 64])
            .finish();
        let err = parse_err(bytes);
        assert!(
            matches!(err, GgufError::BadDimCount { n_dims: n, .. } if n == n_dims),
            "{err:?}"
        );
    }
}

#[test]
fn unknown_tensor_type_is_rejected_with_its_name() {
    // 31 is Q4_0_4_4: a GGML type that GGUF files no longer hold.
    let bytes = one_tensor_file("w", &[256], 31, 0, 144);
    let err = parse_err_matching!(bytes, GgufError::UnknownTensorType { name, type_id: 31 }
        if name == "w");
    assert!(
        err.to_string()
            .starts_with("tensor \"w\": Q4_0_4_4 (type 31) is not supported; supported: f32, f16"),
        "{err}"
    );
}

#[test]
fn quantized_row_not_a_whole_number_of_blocks_is_rejected() {
    check_row_not_block_multiple(2, GgmlType::Q4_0, 40, 32, 64);
}

/// SmolLM2's width 576 is a whole number of 32-blocks but not of the
/// K-quants' 256-weight super-blocks (which is why llama.cpp falls back to
/// other types for those rows).
#[test]
fn k_quant_row_not_a_whole_number_of_super_blocks_is_rejected() {
    check_row_not_block_multiple(12, GgmlType::Q4_K, 576, 256, 2 * 144 * 2);
}

/// A file of one tensor of `type_id` with two rows of `row_len` weights
/// (`data_len` bytes) is refused: the rows are not whole blocks of `ty`'s
/// `block_size` weights.
fn check_row_not_block_multiple(
    type_id: u32,
    ty: GgmlType,
    row_len: u64,
    block_size: usize,
    data_len: usize,
) {
    let bytes = one_tensor_file("w", &[row_len, 2], type_id, 0, data_len);
    let err = parse_err(bytes);
    let expected = (ty, row_len, block_size);
    assert!(
        matches!(&err, GgufError::RowNotBlockMultiple { ty, row_len, block_size, .. }
            if (*ty, *row_len, *block_size) == expected),
        "{err:?}"
    );
}

#[test]
fn tensor_data_outside_the_data_section_is_rejected() {
    // 4 f32 = 16 bytes declared, 8 present.
    let bytes = one_tensor_file("w", &[4], 0, 0, 8);
    parse_err_matching!(bytes, GgufError::TensorOutOfBounds { name, offset: 0, n_bytes: 16, data_len: 8 }
        if name == "w");
    // An offset near u64::MAX must not wrap around.
    let bytes = one_tensor_file("w", &[4], 0, u64::MAX - 31, 64);
    assert!(matches!(
        parse_err(bytes),
        GgufError::TensorOutOfBounds { .. }
    ));
}

#[test]
fn misaligned_tensor_offset_is_rejected() {
    let bytes = one_tensor_file("w", &[1], 0, 4, 8);
    parse_err_matching!(bytes, GgufError::TensorMisaligned { name, offset: 4, alignment: 32 }
        if name == "w");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Corrupting bytes of a valid file never panics: it parses or errors.
    #[test]
    fn corrupted_files_never_panic(flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6)) {
        let mut bytes = gguf_file(3, 32, &every_value_type(), &[small_tensor()]);
        for (idx, value) in flips {
            let i = idx.index(bytes.len());
            bytes[i] = value;
        }
        if let Ok(file) = GgufFile::from_bytes(bytes) {
            // Whatever parsed must be readable without panicking.
            for info in file.tensors() {
                let view = file.tensor(&info.name).unwrap();
                prop_assert_eq!(view.data.len(), info.n_bytes);
            }
            let _ = file.summary().to_string();
        }
    }
}

/// `open` asks for huge pages (the `hg` flag of the bytes' mapping in
/// `/proc/self/smaps`) wherever the kernel has transparent huge pages;
/// whether the kernel then grants them depends on its free memory.
#[cfg(target_os = "linux")]
#[test]
fn open_advises_huge_pages_for_the_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("padded.gguf");
    // Longer than a huge page (only whole huge pages are advised).
    let mut bytes = gguf_file(3, 32, &every_value_type(), &[small_tensor()]);
    bytes.resize(3 << 20, 0);
    std::fs::write(&path, &bytes).unwrap();
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(file.bytes(), &bytes[..]);
    let address = file.bytes().as_ptr() as usize;

    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut in_mapping = false;
    let mut flags = None;
    for line in smaps.lines() {
        if let Some((range, _)) = line.split_once(' ')
            && let Some((start, end)) = range.split_once('-')
            && let (Ok(start), Ok(end)) = (
                usize::from_str_radix(start, 16),
                usize::from_str_radix(end, 16),
            )
        {
            in_mapping = (start..end).contains(&address);
        } else if in_mapping && let Some(rest) = line.strip_prefix("VmFlags:") {
            flags = Some(
                rest.split_whitespace()
                    .map(str::to_owned)
                    .collect::<Vec<_>>(),
            );
        }
    }
    let flags = flags.expect("the bytes lie in a mapping of /proc/self/smaps");
    let kernel_has_thp = std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists();
    assert_eq!(
        flags.iter().any(|flag| flag == "hg"),
        kernel_has_thp,
        "VmFlags {flags:?}"
    );
}

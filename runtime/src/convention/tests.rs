use super::*;

#[test]
fn unknown_presets_and_missing_files_are_errors() {
    let err = named_or_file("qualcomm").unwrap_err().to_string();
    assert!(err.contains("presets"), "{err}");
    assert_eq!(named_or_file("aihub").unwrap().name, "aihub");
}

#[test]
fn rope_tables_rotate_like_the_model_rope() {
    let cfg = model::RopeConfig {
        theta: 10000.0,
        scaling: Some(model::Llama3Scaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_context: 64,
        }),
        pairing: model::RopePairing::HalfSplit,
        ..model::RopeConfig::default()
    };
    let width = 4;
    let rope = model::ops::Rope::new(2 * width, &cfg);
    let positions = [0, 3, 17];
    let spec = quant::QuantSpec::float(quant::DataType::F32).unwrap();
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    rope_table(&rope, &positions, false, &spec, &mut cos).unwrap();
    rope_table(&rope, &positions, true, &spec, &mut sin).unwrap();
    let f = |b: &[u8], i: usize| f32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap());
    for (row, &p) in positions.iter().enumerate() {
        // Rotating the unit vector of each pair gives (cos, sin) of that pair's angle.
        for k in 0..width {
            let mut head = vec![0.0f32; 2 * width];
            head[k] = 1.0;
            rope.rotate(&mut head, p as usize);
            assert_eq!(head[k], f(&cos, row * width + k), "cos pos {p} pair {k}");
            assert_eq!(
                head[k + width],
                f(&sin, row * width + k),
                "sin pos {p} pair {k}"
            );
        }
    }
    // Fixed-point tables are the same numbers quantized.
    let u16spec = quant::QuantSpec::per_tensor(
        quant::DataType::U16,
        quant::ScaleOffset::new(2.0 / 65535.0, -32768).unwrap(),
    )
    .unwrap();
    let mut q = Vec::new();
    rope_table(&rope, &positions, false, &u16spec, &mut q).unwrap();
    assert_eq!(q.len(), positions.len() * width * 2);
    let mut back = vec![0.0; positions.len() * width];
    quant::decode_bytes_to_f32(&q, &u16spec, &mut back).unwrap();
    for (i, v) in back.iter().enumerate() {
        assert!((v - f(&cos, i)).abs() < 1e-4, "{i}: {v}");
    }
}

#[test]
fn attend_max_masks_use_the_type_extremes() {
    let values = [0.0, f32::NEG_INFINITY, 0.0, -50.0];
    let mut out = vec![0u8; 8];
    attend_max_mask(&values, quant::DataType::U16, &mut out).unwrap();
    let got: Vec<u16> = out
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    assert_eq!(got, [65535, 0, 65535, 0]);
    let mut out = vec![0u8; 4];
    attend_max_mask(&values, quant::DataType::U8, &mut out).unwrap();
    assert_eq!(out, [255, 0, 255, 0]);
    // A wrong-sized buffer is an error, not a panic.
    assert!(attend_max_mask(&values, quant::DataType::U8, &mut [0u8; 3]).is_err());
}

//! The W8A16 matrix product ([`qnn_compile::emit::Emitter::fully_connected_w8`]) on Qualcomm's
//! real `libQnnHtp.so` (fetched by `scripts/fetch-qnn.sh`; skipped when absent, a failure under
//! `CI`), against the product computed here in f64 from the same i8 values, scales and u16 input
//! grid: the HTP must read the weights per output channel and the encodings as QNN defines them
//! (`real = (q + offset) * scale`).

use qnn_compile::Fixed;
use qnn_compile::emit::Emitter;
use qnn_compile::w8a16::{BlockMultipliers, W8Matrix, output_encoding};
use qnn_ffi::bindings as b;
use qnn_ffi::{
    Backend, ClientBuffer, Context, Device, GraphBuilder, GraphOptions, HtpTarget, Precision,
    QnnLibrary, QnnSystemLibrary, SystemContext, TensorData,
};

const N: usize = 3;

fn weights(rows: usize, cols: usize) -> W8Matrix {
    // Rows of very different magnitudes: one shared scale would crush the small ones.
    let q: Vec<i8> = (0..rows * cols)
        .map(|i| ((i * 73 + 11) % 255) as i32 - 127)
        .map(|v| v as i8)
        .collect();
    let scales: Vec<f32> = (0..rows)
        .map(|r| 1e-3 * 4f32.powi((r % 6) as i32))
        .collect();
    let u16 = b::QNN_DATATYPE_UFIXED_POINT_16;
    W8Matrix {
        rows,
        cols,
        q,
        scales,
        blocks: None,
        input: Fixed {
            dtype: u16,
            scale: 3.0 / 65535.0,
            offset: -32768,
        },
        output: output_encoding((-400.0, 400.0)),
    }
}

fn input(cols: usize) -> Vec<f32> {
    (0..N * cols)
        .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
        .collect()
}

/// `x` on the input's u16 grid times the dequantized weights, in f64.
fn expected(w: &W8Matrix, x: &[f32]) -> Vec<f64> {
    let e = w.input;
    let grid = |v: f32| {
        let q = ((v / e.scale).round() as i64 - i64::from(e.offset)).clamp(0, 65535);
        (q + i64::from(e.offset)) as f64 * f64::from(e.scale)
    };
    let mut y = vec![0.0; N * w.rows];
    for r in 0..N {
        for o in 0..w.rows {
            y[r * w.rows + o] = (0..w.cols)
                .map(|c| {
                    grid(x[r * w.cols + c]) * f64::from(w.q[o * w.cols + c]) * weight_scale(w, o, c)
                })
                .sum();
        }
    }
    y
}

/// The scale of weight `(o, c)`: its row's, times its block's multiplier with `blocks`.
fn weight_scale(w: &W8Matrix, o: usize, c: usize) -> f64 {
    let m = w
        .blocks
        .as_ref()
        .map_or(1.0, |b| f64::from(b.m[o * (w.cols / b.size) + c / b.size]));
    f64::from(w.scales[o]) * m
}

#[test]
fn the_w8a16_product_on_the_real_htp_matches_the_same_arithmetic_in_f64() {
    let Some(libs) = test_support::fetched::qnn_libs("w8a16_product") else {
        return;
    };
    check_on_htp((&libs.backend(), &libs.system()), &weights(6, 40));
}

/// QNN's blockwise expansion (AI Hub's "LPBQ") on the real HTP: 4-bit values in [-8, 7] held
/// one per byte, a multiplier per block of 8 inputs, read as `real = q * scale * multiplier`.
///
/// Measured while writing this test: with values outside [-8, 7] the same graph composes and
/// runs but computes unrelated numbers (ratios to the f64 product from -52 to 145), so the HTP
/// reads blockwise-expansion weights as 4-bit values, and 8-bit weights cannot use it. QNN's
/// other block encoding (a float scale per block, `QNN_QUANTIZATION_ENCODING_BLOCK`, blocks of
/// 1 x 8) fails at `graphFinalize` on this backend: "no properties registered for
/// q::QNN_FullyConnected_w_blk_scale". On this HTP, 8-bit weights have per-channel scales only.
///
/// The second shape has more rows than columns: the HTP computes only the first `cols` output
/// channels of such a product (the rest read 0), so the emitter splits it
/// ([`W8Matrix::row_parts`]); this shape fails without the split.
#[test]
fn the_blockwise_expansion_w4a16_product_on_the_real_htp_matches_f64() {
    let Some(libs) = test_support::fetched::qnn_libs("w4a16_lpbq_product") else {
        return;
    };
    for (rows, cols, size) in [(6, 40, 8), (192, 64, 32)] {
        let w = lpbq_weights(rows, cols, size);
        check_on_htp((&libs.backend(), &libs.system()), &w);
        // The multipliers matter: without them the product differs.
        let plain = W8Matrix {
            blocks: None,
            ..w.clone()
        };
        let x = input(w.cols);
        let (a, b) = (expected(&w, &x), expected(&plain, &x));
        assert!(
            a.iter()
                .zip(&b)
                .any(|(x, y)| (x - y).abs() > 0.1 * y.abs().max(1.0))
        );
    }
}

/// [`weights`] on the blockwise-expansion grid: values in [-8, 7], a multiplier in [1, 15] per
/// block of `size` inputs.
fn lpbq_weights(rows: usize, cols: usize, size: usize) -> W8Matrix {
    let mut w = weights(rows, cols);
    w.q.iter_mut()
        .for_each(|q| *q = (i32::from(*q).rem_euclid(16) - 8) as i8);
    let m: Vec<u8> = (0..rows * cols / size)
        .map(|i| (i * 7 % 15 + 1) as u8)
        .collect();
    w.blocks = Some(BlockMultipliers { size, bits: 4, m });
    w
}

/// Runs `x · wᵀ` on the HTP and holds every output to the f64 product.
fn check_on_htp(libs: (&std::path::Path, &std::path::Path), w: &W8Matrix) {
    let xs = input(w.cols);
    let out = run(libs, w);
    check(w, &xs, &out);
}

/// `x · wᵀ` composed for `w`, run on the HTP backend at `backend`.
fn run((backend, system): (&std::path::Path, &std::path::Path), w: &W8Matrix) -> Vec<f32> {
    let lib = QnnLibrary::load(backend).unwrap();
    let backend = Backend::new(&lib, None).unwrap();
    let target = HtpTarget {
        soc_model: 60,
        arch: 75,
    };
    let device = Device::with_htp_target(&backend, target).unwrap();
    let context = Context::create(&backend, device.as_ref()).unwrap();
    let options = GraphOptions {
        precision: Precision::Fp16,
        optimization: None,
    };
    let g = GraphBuilder::new(&context, "w8", options).unwrap();
    let mut e = Emitter::new(g);
    let x = e
        .input("x", b::QNN_DATATYPE_FLOAT_32, &[N as u32, w.cols as u32])
        .unwrap();
    let y = e.fully_connected_w8(&x, w).unwrap();
    e.reshape(&y, &[N as u32, w.rows as u32], Some("y"))
        .unwrap();
    e.into_graph().finalize().unwrap();
    let binary = context.binary().unwrap();

    let system = QnnSystemLibrary::load(system).unwrap();
    let info = SystemContext::new(&system)
        .unwrap()
        .binary_info(&binary)
        .unwrap();
    let gi = info.graph("w8").unwrap().clone();
    let loaded = Context::from_binary(&backend, device.as_ref(), &binary).unwrap();
    let graph = loaded.graph("w8", gi.inputs, gi.outputs).unwrap();
    let xs = input(w.cols);
    let mut out = vec![0f32; N * w.rows];
    let xb: &[u8] = bytemuck::cast_slice(&xs);
    let ob: &mut [u8] = bytemuck::cast_slice_mut(&mut out);
    graph
        .execute(
            &[TensorData::Client(ClientBuffer::input(xb))],
            &[TensorData::Client(ClientBuffer::output(ob))],
        )
        .unwrap();
    out
}

/// Every output within one output grid step (plus fp16 rounding) of the f64 product.
fn check(w: &W8Matrix, xs: &[f32], out: &[f32]) {
    let want = expected(w, xs);
    let step = f64::from(w.output.scale);
    for (i, (&got, &want)) in out.iter().zip(&want).enumerate() {
        // One output grid step, plus fp16's rounding of the dequantized value.
        let tol = 1.5 * step + want.abs() * 1e-3;
        assert!(
            (f64::from(got) - want).abs() <= tol,
            "row {} channel {}: HTP {got}, expected {want} (tolerance {tol})",
            i / w.rows,
            i % w.rows
        );
    }
    // The channels span 4^5: a per-tensor weight scale would have lost the small ones.
    assert!(want[0].abs() < want[w.rows - 1].abs() / 100.0, "{want:?}");
}

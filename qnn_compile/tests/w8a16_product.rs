//! The W8A16 matrix product ([`qnn_compile::emit::Emitter::fully_connected_w8`]) on Qualcomm's
//! real `libQnnHtp.so` (fetched by `scripts/fetch-qnn.sh`; skipped when absent, a failure under
//! `CI`), against the product computed here in f64 from the same i8 values, scales and u16 input
//! grid: the HTP must read the weights per output channel and the encodings as QNN defines them
//! (`real = (q + offset) * scale`).

use qnn_compile::Fixed;
use qnn_compile::emit::Emitter;
use qnn_compile::w8a16::{W8Matrix, output_encoding};
use qnn_ffi::bindings as b;
use qnn_ffi::{
    Backend, ClientBuffer, Context, Device, GraphBuilder, GraphOptions, HtpTarget, Precision,
    QnnLibrary, QnnSystemLibrary, SystemContext, TensorData,
};

const N: usize = 3;
const IN: usize = 40;
const OUT: usize = 6;

fn weights() -> W8Matrix {
    // Rows of very different magnitudes: one shared scale would crush the small ones.
    let q: Vec<i8> = (0..OUT * IN)
        .map(|i| ((i * 73 + 11) % 255) as i32 - 127)
        .map(|v| v as i8)
        .collect();
    let scales: Vec<f32> = (0..OUT).map(|r| 1e-3 * 4f32.powi(r as i32)).collect();
    let u16 = b::QNN_DATATYPE_UFIXED_POINT_16;
    W8Matrix {
        rows: OUT,
        cols: IN,
        q,
        scales,
        input: Fixed {
            dtype: u16,
            scale: 3.0 / 65535.0,
            offset: -32768,
        },
        output: output_encoding((-400.0, 400.0)),
    }
}

fn input() -> Vec<f32> {
    (0..N * IN)
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
    let mut y = vec![0.0; N * OUT];
    for r in 0..N {
        for o in 0..OUT {
            y[r * OUT + o] = (0..IN)
                .map(|c| grid(x[r * IN + c]) * f64::from(w.q[o * IN + c]) * f64::from(w.scales[o]))
                .sum();
        }
    }
    y
}

#[test]
fn the_w8a16_product_on_the_real_htp_matches_the_same_arithmetic_in_f64() {
    let Some(libs) = test_support::fetched::qnn_libs("w8a16_product") else {
        return;
    };
    let lib = QnnLibrary::load(libs.backend()).unwrap();
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
    let w = weights();
    let x = e
        .input("x", b::QNN_DATATYPE_FLOAT_32, &[N as u32, IN as u32])
        .unwrap();
    let y = e.fully_connected_w8(&x, &w).unwrap();
    e.reshape(&y, &[N as u32, OUT as u32], Some("y")).unwrap();
    e.into_graph().finalize().unwrap();
    let binary = context.binary().unwrap();

    let system = QnnSystemLibrary::load(libs.system()).unwrap();
    let info = SystemContext::new(&system)
        .unwrap()
        .binary_info(&binary)
        .unwrap();
    let gi = info.graph("w8").unwrap().clone();
    let loaded = Context::from_binary(&backend, device.as_ref(), &binary).unwrap();
    let graph = loaded.graph("w8", gi.inputs, gi.outputs).unwrap();
    let xs = input();
    let mut out = vec![0f32; N * OUT];
    let xb: &[u8] = bytemuck::cast_slice(&xs);
    let ob: &mut [u8] = bytemuck::cast_slice_mut(&mut out);
    graph
        .execute(
            &[TensorData::Client(ClientBuffer::input(xb))],
            &[TensorData::Client(ClientBuffer::output(ob))],
        )
        .unwrap();
    let want = expected(&w, &xs);
    let step = f64::from(w.output.scale);
    for (i, (&got, &want)) in out.iter().zip(&want).enumerate() {
        // One output grid step, plus fp16's rounding of the dequantized value.
        let tol = 1.5 * step + want.abs() * 1e-3;
        assert!(
            (f64::from(got) - want).abs() <= tol,
            "row {} channel {}: HTP {got}, expected {want} (tolerance {tol})",
            i / OUT,
            i % OUT
        );
    }
    // The channels span 4^5: a per-tensor weight scale would have lost the small ones.
    assert!(want[0].abs() < want[OUT - 1].abs() / 100.0, "{want:?}");
}

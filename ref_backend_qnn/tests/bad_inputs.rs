// Its own binary: .ci/run runs the two FFI test binaries (ffi_roundtrip, bad_inputs) under valgrind, alone and small.
//! Bad inputs through the FFI path: each gives a typed error (or a QNN error code at the raw
//! C boundary), never a crash.

use std::path::Path;
use std::sync::Arc;

use qnn_ffi::bindings as b;
use qnn_ffi::{
    Backend, ClientBuffer, Context, MemDescriptor, OwnedRawTensor, QnnError, QnnLibrary,
    QnnSystemLibrary, SystemContext, TensorData,
};

fn qnn_code(e: &QnnError) -> u64 {
    match e {
        QnnError::Qnn { code, .. } => *code,
        other => panic!("expected a QNN error code, got {other:?}"),
    }
}

#[test]
fn a_program_is_not_a_library_and_the_loader_says_why() {
    let err = QnnLibrary::load("/bin/ls").unwrap_err();
    assert!(err.to_string().contains("cannot dynamically load"), "{err}");
}

#[test]
fn missing_library_is_library_not_found() {
    let path = Path::new("/nonexistent/libQnnNothing.so");
    match QnnLibrary::load(path) {
        Err(e @ QnnError::LibraryNotFound { .. }) => {
            // The reason said once: the check before dlopen cannot open the file (not
            // libloading's bare "dlopen failed").
            assert_eq!(
                e.to_string(),
                "cannot load QNN library /nonexistent/libQnnNothing.so: cannot open it: No such \
                 file or directory (os error 2)"
            );
        }
        other => panic!("expected LibraryNotFound, got {other:?}"),
    }
    assert!(matches!(
        QnnSystemLibrary::load(path),
        Err(QnnError::LibraryNotFound { .. })
    ));
}

#[test]
fn library_without_the_entry_point_is_symbol_missing() {
    match QnnLibrary::load("libc.so.6") {
        Err(QnnError::SymbolMissing { symbol, .. }) => {
            assert_eq!(symbol, "QnnInterface_getProviders")
        }
        other => panic!("expected SymbolMissing, got {other:?}"),
    }
    match QnnSystemLibrary::load("libc.so.6") {
        Err(QnnError::SymbolMissing { symbol, .. }) => {
            assert_eq!(symbol, "QnnSystemInterface_getProviders")
        }
        other => panic!("expected SymbolMissing, got {other:?}"),
    }
}

#[test]
fn wrong_api_versions_are_no_compatible_provider() {
    let lib = test_support::files::built_library("libqnn_ffi_testlib.so");
    match QnnLibrary::load(&lib) {
        Err(QnnError::NoCompatibleProvider { found, needed, .. }) => {
            let versions: Vec<String> = found.iter().map(|p| p.api.to_string()).collect();
            assert_eq!(versions, ["1.99.0", "3.0.0"]);
            assert!(needed.contains("2.x"), "{needed}");
        }
        other => panic!("expected NoCompatibleProvider, got {other:?}"),
    }
    match QnnSystemLibrary::load(&lib) {
        Err(QnnError::NoCompatibleProvider { found, .. }) => {
            assert_eq!(found.len(), 1);
            assert_eq!(found[0].api.major, 2);
        }
        other => panic!("expected NoCompatibleProvider, got {other:?}"),
    }
}

#[test]
fn explicit_path_beats_the_environment_and_absence_is_typed() {
    let p = qnn_ffi::resolve_path(
        Some(Path::new("/x/lib.so")),
        "HTPKV_TEST_UNSET_VARIABLE",
        "backend",
    )
    .unwrap();
    assert_eq!(p, Path::new("/x/lib.so"));
    match qnn_ffi::resolve_path(None, "HTPKV_TEST_UNSET_VARIABLE", "backend") {
        Err(QnnError::NoLibraryPath { env_var, .. }) => {
            assert_eq!(env_var, "HTPKV_TEST_UNSET_VARIABLE")
        }
        other => panic!("expected NoLibraryPath, got {other:?}"),
    }
}

struct Setup {
    lib: Arc<QnnLibrary>,
    backend: Arc<Backend>,
    bytes: Vec<u8>,
    info: qnn_ffi::BinaryInfo,
}

fn setup() -> Setup {
    let (ckpt, tok) = test_support::stories::stories260k_loaded();
    let (_, bytes) = test_support::compile::compiled_ar1(&ckpt, &tok, 16);
    let system = QnnSystemLibrary::load(test_support::files::ref_qnn_library()).expect("system");
    let info = SystemContext::new(&system)
        .expect("sysctx")
        .binary_info(&bytes)
        .expect("info");
    let lib = QnnLibrary::load(test_support::files::ref_qnn_library()).expect("backend lib");
    let backend = Backend::new(&lib, None).expect("backend");
    Setup {
        lib,
        backend,
        bytes,
        info,
    }
}

#[test]
fn corrupted_and_truncated_binaries_are_rejected() {
    let s = setup();
    let system = QnnSystemLibrary::load(test_support::files::ref_qnn_library()).expect("system");
    let truncated = &s.bytes[..s.bytes.len() / 2];
    let mut corrupted = s.bytes.clone();
    let mid = corrupted.len() / 3;
    corrupted[mid] ^= 0x5A;
    for bad in [truncated, &corrupted[..], &s.bytes[..3]] {
        let e = Context::from_binary(&s.backend, None, bad).expect_err("bad binary must fail");
        assert_eq!(
            qnn_code(&e),
            u64::from(b::QNN_CONTEXT_ERROR_CREATE_FROM_BINARY),
            "{e}"
        );
        assert!(e.to_string().contains("contextCreateFromBinary"), "{e}");
        let e = SystemContext::new(&system)
            .unwrap()
            .binary_info(bad)
            .expect_err("bad binary info");
        assert_eq!(
            qnn_code(&e),
            u64::from(b::QNN_SYSTEM_CONTEXT_ERROR_MALFORMED_BINARY)
        );
    }
    let e = Context::from_binary(&s.backend, None, &[]).expect_err("empty binary");
    assert_eq!(
        qnn_code(&e),
        u64::from(b::QNN_CONTEXT_ERROR_INVALID_ARGUMENT)
    );
}

#[test]
fn unknown_graph_names_are_typed_errors() {
    let s = setup();
    let context = Context::from_binary(&s.backend, None, &s.bytes).expect("context");
    match s.info.graph("no_such_graph") {
        Err(QnnError::UnknownGraph { name, available }) => {
            assert_eq!(name, "no_such_graph");
            assert_eq!(available.len(), 1);
        }
        other => panic!("expected UnknownGraph, got {other:?}"),
    }
    let e = context
        .graph("no_such_graph", vec![], vec![])
        .expect_err("unknown graph");
    assert_eq!(
        qnn_code(&e),
        u64::from(b::QNN_GRAPH_ERROR_GRAPH_DOES_NOT_EXIST)
    );
    // The backend's own message is used (errorGetMessage).
    assert!(e.to_string().contains("htpkv reference backend"), "{e}");
}

#[test]
fn wrong_tensor_sizes_are_rejected_by_the_wrapper_and_the_backend() {
    let s = setup();
    let context = Context::from_binary(&s.backend, None, &s.bytes).expect("context");
    let g = &s.info.graphs[0];
    let graph = context
        .graph(&g.name, g.inputs.clone(), g.outputs.clone())
        .expect("graph");
    let mut ins: Vec<Vec<u8>> = g
        .inputs
        .iter()
        .map(|t| vec![0u8; t.byte_size().unwrap()])
        .collect();
    let mut outs: Vec<Vec<u8>> = g
        .outputs
        .iter()
        .map(|t| vec![0u8; t.byte_size().unwrap()])
        .collect();
    ins[3].pop();
    {
        let i: Vec<TensorData<'_>> = ins
            .iter()
            .map(|v| TensorData::Client(ClientBuffer::input(v)))
            .collect();
        let o: Vec<TensorData<'_>> = outs
            .iter_mut()
            .map(|v| TensorData::Client(ClientBuffer::output(v)))
            .collect();
        match graph.execute(&i, &o) {
            Err(QnnError::TensorSize {
                tensor,
                expected,
                found,
            }) => {
                assert_eq!(tensor, g.inputs[3].name);
                assert_eq!(found + 1, expected);
            }
            other => panic!("expected TensorSize, got {other:?}"),
        }
        match graph.execute(&i[..2], &o) {
            Err(QnnError::InvalidTensor { .. }) => {}
            other => panic!("expected InvalidTensor for a wrong count, got {other:?}"),
        }
    }
    ins[3].push(0);

    // Bypass the wrapper: the backend itself validates the raw tensors.
    let table = s.lib.table();
    let execute = table.graphExecute.expect("graphExecute");
    let retrieve = table.graphRetrieve.expect("graphRetrieve");
    let name = std::ffi::CString::new(g.name.clone()).unwrap();
    let mut gh: b::Qnn_GraphHandle_t = std::ptr::null_mut();
    // SAFETY: valid context handle, NUL-terminated name, writable out-pointer.
    let rc = unsafe { retrieve(context.raw(), name.as_ptr(), &mut gh) };
    assert_eq!(rc, 0);
    let owned_in: Vec<OwnedRawTensor> = g
        .inputs
        .iter()
        .map(|t| OwnedRawTensor::new(t).unwrap())
        .collect();
    let owned_out: Vec<OwnedRawTensor> = g
        .outputs
        .iter()
        .map(|t| OwnedRawTensor::new(t).unwrap())
        .collect();
    let raw_in = |short: usize| -> Vec<b::Qnn_Tensor_t> {
        owned_in
            .iter()
            .zip(&ins)
            .enumerate()
            .map(|(k, (t, v))| {
                let len = if k == 3 { v.len() - short } else { v.len() };
                t.raw_with_client_buffer(v.as_ptr().cast_mut(), len as u32)
            })
            .collect()
    };
    let mut raw_out: Vec<b::Qnn_Tensor_t> = owned_out
        .iter()
        .zip(outs.iter_mut())
        .map(|(t, v)| t.raw_with_client_buffer(v.as_mut_ptr(), v.len() as u32))
        .collect();
    let call = |inputs: &[b::Qnn_Tensor_t],
                outputs: &mut [b::Qnn_Tensor_t],
                graph: b::Qnn_GraphHandle_t| {
        // SAFETY: the tensors point to live buffers of the stated sizes (or smaller sizes,
        // which the backend must reject before touching memory).
        unsafe {
            execute(
                graph,
                inputs.as_ptr(),
                inputs.len() as u32,
                outputs.as_mut_ptr(),
                outputs.len() as u32,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        }
    };
    assert_eq!(
        call(&raw_in(0), &mut raw_out, gh),
        0,
        "well-formed raw call succeeds"
    );
    assert_eq!(
        call(&raw_in(1), &mut raw_out, gh),
        u64::from(b::QNN_GRAPH_ERROR_INVALID_TENSOR)
    );
    assert_eq!(
        call(&raw_in(0)[..1], &mut raw_out, gh),
        u64::from(b::QNN_GRAPH_ERROR_INVALID_ARGUMENT)
    );
    assert_eq!(
        call(
            &raw_in(0),
            &mut raw_out,
            0xdead_0000 as b::Qnn_GraphHandle_t
        ),
        u64::from(b::QNN_GRAPH_ERROR_INVALID_HANDLE)
    );
    // Overlapping output buffers are refused.
    let mut overlapping = raw_out.clone();
    let first_kv = 1;
    // SAFETY: reading the v1 member of a tensor built as version 1 (a Copy union read).
    let data = unsafe {
        overlapping[first_kv]
            .__bindgen_anon_1
            .v1
            .__bindgen_anon_1
            .clientBuf
            .data
    };
    overlapping[first_kv + 1]
        .__bindgen_anon_1
        .v1
        .__bindgen_anon_1
        .clientBuf
        .data = data;
    assert_eq!(
        call(&raw_in(0), &mut overlapping, gh),
        u64::from(b::QNN_GRAPH_ERROR_INVALID_ARGUMENT)
    );
    // A wrong data type is refused.
    let mut wrong_type = raw_in(0);
    wrong_type[0].__bindgen_anon_1.v1.dataType = b::QNN_DATATYPE_FLOAT_32;
    assert_eq!(
        call(&wrong_type, &mut raw_out, gh),
        u64::from(b::QNN_GRAPH_ERROR_INVALID_TENSOR)
    );
    // A NULL tensor array is refused.
    // SAFETY: NULL arrays with non-zero counts must be rejected without dereferencing.
    let rc = unsafe {
        execute(
            gh,
            std::ptr::null(),
            3,
            std::ptr::null_mut(),
            1,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    assert_ne!(rc, 0);
}

#[test]
fn bad_memory_registrations_and_handles_are_rejected() {
    let s = setup();
    let context = Context::from_binary(&s.backend, None, &s.bytes).expect("context");
    let mut region = vec![0u8; 4096];
    let base = region.as_mut_ptr();
    // SAFETY: `region` outlives every registration made here.
    let too_far =
        unsafe { MemDescriptor::host(vec![1, 1, 8, 8], quant::DataType::U8, base, 4096, 4090) };
    assert!(matches!(
        context.register(&too_far),
        Err(QnnError::InvalidRegistration { .. })
    ));
    // SAFETY: as above.
    let ok = unsafe { MemDescriptor::host(vec![1, 1, 8, 8], quant::DataType::U8, base, 4096, 64) };
    let handle = context.register(&ok).expect("register");
    assert!(!handle.raw().is_null());
    drop(handle);

    let table = s.lib.table();
    let register = table.memRegister.expect("memRegister");
    let deregister = table.memDeRegister.expect("memDeRegister");
    let mut dims = [1u32, 8];
    // An HTP shared-buffer descriptor with an invalid fd cannot be mapped.
    let mut htp = b::QnnMemHtp_Descriptor_t {
        type_: b::QNN_HTP_MEM_SHARED_BUFFER,
        size: 4096,
        ..Default::default()
    };
    htp.__bindgen_anon_1.sharedBufferConfig =
        b::QnnHtpMem_SharedBufferConfig_t { fd: -1, offset: 0 };
    let mut desc = b::Qnn_MemDescriptor_t {
        memShape: b::Qnn_MemShape_t {
            numDim: 2,
            dimSize: dims.as_mut_ptr(),
            shapeConfig: std::ptr::null(),
        },
        dataType: b::QNN_DATATYPE_UFIXED_POINT_8,
        memType: b::QNN_MEM_TYPE_CUSTOM,
        ..Default::default()
    };
    desc.__bindgen_anon_1.customInfo = std::ptr::addr_of_mut!(htp).cast();
    let mut h: b::Qnn_MemHandle_t = std::ptr::null_mut();
    // SAFETY: valid descriptor and out slot.
    let rc = unsafe { register(context.raw(), &desc, 1, &mut h) };
    assert_eq!(rc, u64::from(b::QNN_MEM_ERROR_MAPPING));
    assert!(h.is_null());
    // Unknown context, NULL arrays, unknown handles.
    // SAFETY: the backend must reject these without dereferencing the bogus handle.
    unsafe {
        assert_eq!(
            register(0x1234 as b::Qnn_ContextHandle_t, &desc, 1, &mut h),
            u64::from(b::QNN_MEM_ERROR_INVALID_HANDLE)
        );
        assert_eq!(
            register(context.raw(), std::ptr::null(), 1, &mut h),
            u64::from(b::QNN_MEM_ERROR_INVALID_ARGUMENT)
        );
        let bogus: b::Qnn_MemHandle_t = 0x4321 as b::Qnn_MemHandle_t;
        assert_eq!(
            deregister(&bogus, 1),
            u64::from(b::QNN_MEM_ERROR_INVALID_HANDLE)
        );
        assert_eq!(
            deregister(std::ptr::null(), 1),
            u64::from(b::QNN_MEM_ERROR_INVALID_ARGUMENT)
        );
    }
    drop(region);
}

#[test]
fn raw_entry_points_reject_null_and_unknown_handles() {
    let lib = QnnLibrary::load(test_support::files::ref_qnn_library()).expect("lib");
    let t = lib.table();
    // SAFETY: every call passes NULL or bogus handles that the backend must reject.
    unsafe {
        assert_ne!(
            t.backendCreate.unwrap()(
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut()
            ),
            0
        );
        assert_eq!(
            t.backendFree.unwrap()(0x99 as _),
            u64::from(b::QNN_BACKEND_ERROR_INVALID_HANDLE)
        );
        assert_eq!(
            t.contextFree.unwrap()(0x99 as _, std::ptr::null_mut()),
            u64::from(b::QNN_CONTEXT_ERROR_INVALID_HANDLE)
        );
        assert_eq!(
            t.logFree.unwrap()(0x99 as _),
            u64::from(b::QNN_LOG_ERROR_INVALID_HANDLE)
        );
        assert_ne!(t.logCreate.unwrap()(None, 77, std::ptr::null_mut()), 0);
        let mut ctx: b::Qnn_ContextHandle_t = std::ptr::null_mut();
        let junk = [0u8; 16];
        assert_eq!(
            t.contextCreateFromBinary.unwrap()(
                0x99 as _,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                junk.as_ptr().cast(),
                16,
                &mut ctx,
                std::ptr::null_mut()
            ),
            u64::from(b::QNN_CONTEXT_ERROR_INVALID_HANDLE)
        );
        assert_ne!(
            t.graphRetrieve.unwrap()(std::ptr::null_mut(), std::ptr::null(), std::ptr::null_mut()),
            0
        );
        assert_ne!(t.backendGetApiVersion.unwrap()(std::ptr::null_mut()), 0);
        let mut v = b::Qnn_ApiVersion_t::default();
        assert_eq!(t.backendGetApiVersion.unwrap()(&mut v), 0);
        assert_eq!(v.coreApiVersion.major, 2);
    }
}

//! Build script. Without the `qnn-sdk` feature it does nothing: the crate uses the checked-in
//! `src/bindings.rs`. With `qnn-sdk` it runs bindgen on the real QNN SDK headers found under
//! `$QNN_SDK_ROOT/include/QNN` and writes `$OUT_DIR/qnn_sdk_bindings.rs`, which `src/lib.rs`
//! includes instead. htpkv's own names (`HtpkvQnnInterface_t`, the `HTPKV_*` constants) are
//! mapped onto the SDK's by a small generated wrapper header.

#[cfg(feature = "qnn-sdk")]
include!("bindgen_config.rs");

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "qnn-sdk")]
    generate_from_sdk();
}

#[cfg(feature = "qnn-sdk")]
fn generate_from_sdk() {
    use std::path::PathBuf;
    println!("cargo:rerun-if-env-changed=QNN_SDK_ROOT");
    let root = match std::env::var_os("QNN_SDK_ROOT") {
        Some(root) => PathBuf::from(root),
        None => panic!(
            "qnn_ffi: the `qnn-sdk` feature needs QNN_SDK_ROOT set to a QNN/QAIRT SDK root \
             (the directory containing include/QNN/QnnInterface.h)"
        ),
    };
    let include = root.join("include").join("QNN");
    if !include.join("QnnInterface.h").is_file() {
        panic!(
            "qnn_ffi: {} does not contain QnnInterface.h (expected QNN_SDK_ROOT/include/QNN)",
            include.display()
        );
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let wrapper = out.join("htpkv_qnn_sdk_wrapper.h");
    let text = "\
#include <stdint.h>
#include \"QnnInterface.h\"
#include \"System/QnnSystemInterface.h\"
#include \"HTP/QnnHtpMem.h\"
#include \"HTP/QnnHtpCommon.h\"
#include \"HTP/QnnHtpSystemContext.h\"
#define HTPKV_REF_BACKEND_ID 0x48544B56
#define HTPKV_QNN_API_VERSION_MAJOR 2
#define HTPKV_QNN_API_VERSION_MINOR 10
#define HTPKV_QNN_API_VERSION_MINOR_ERROR_ENTRIES 20
#define HTPKV_QNN_SYSTEM_API_VERSION_MAJOR 1
#define HTPKV_QNN_SYSTEM_API_VERSION_MINOR 1
#define HTPKV_QNN_ERROR_CODE_MASK 0xFFFF
typedef void (*HtpkvQnn_UnusedFn_t)(void);
#define HTPKV_REF_MEM_HOST_MAGIC 0x4B565048
typedef struct { uint32_t magic; uint32_t reserved; void *base; uint64_t size; uint64_t offset; } HtpkvRefMem_HostDescriptor_t;
typedef QNN_INTERFACE_VER_TYPE HtpkvQnnInterface_t;
typedef QNN_SYSTEM_INTERFACE_VER_TYPE HtpkvQnnSystemInterface_t;
typedef Qnn_ErrorHandle_t (*QnnInterfaceGetProvidersFn_t)(const QnnInterface_t ***, uint32_t *);
typedef Qnn_ErrorHandle_t (*QnnSystemInterfaceGetProvidersFn_t)(const QnnSystemInterface_t ***, uint32_t *);
";
    std::fs::write(&wrapper, text).expect("write the SDK wrapper header");
    let target = std::env::var("TARGET").expect("cargo sets TARGET");
    let target = match target.as_str() {
        "aarch64-linux-android" => "aarch64-linux-android".to_string(),
        other => other.to_string(),
    };
    let bindings = htpkv_bindgen_builder(&wrapper.display().to_string(), &target, None)
        .clang_arg(format!("-I{}", include.display()))
        .allowlist_type("Qnn.*|HtpkvQnn.*")
        .allowlist_var("QNN_.*|HTPKV_.*")
        .generate()
        .expect("bindgen failed on the QNN SDK headers");
    bindings
        .write_to_file(out.join("qnn_sdk_bindings.rs"))
        .expect("write qnn_sdk_bindings.rs");
    for header in ["QnnInterface.h", "QnnTypes.h", "QnnCommon.h"] {
        println!("cargo:rerun-if-changed={}", include.join(header).display());
    }
}

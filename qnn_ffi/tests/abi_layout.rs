//! The layout of every struct that crosses the QNN boundary, checked against numbers written
//! down by hand from public descriptions of the ABI — not derived from `include/htpkv_qnn.h`,
//! so a wrong header (as the 48-byte graph-info stride once was) fails here even when the
//! bindings faithfully follow it.
//!
//! Sources of the field lists (facts only): Qualcomm's BSD-licensed Python ctypes declarations of
//! the system-context and tensor structs (`QnnSystemContext_GraphInfoV1_t` .. `V3_t`,
//! `QnnSystemContext_BinaryInfoV1_t` .. `V3_t`, `Qnn_TensorV1_t`/`V2_t`), LiteRT's
//! `vendors/qualcomm` context-binary reader, and the C# interop table of budcribar/QualcommNPU for
//! the function-table offsets. Offsets below apply C's LP64 rules to those field lists:
//! pointers and u64 are 8 bytes aligned to 8, u32/i32/f32/enums 4 aligned to 4,
//! `Qnn_Version_t` 12 aligned to 4.
#![cfg(target_pointer_width = "64")]

use std::mem::{offset_of, size_of};

use qnn_ffi::bindings as b;

#[test]
fn graph_info_versions_and_array_stride() {
    assert_eq!(size_of::<b::QnnSystemContext_GraphInfoV1_t>(), 40);
    assert_eq!(size_of::<b::QnnSystemContext_GraphInfoV2_t>(), 56);
    assert_eq!(size_of::<b::QnnSystemContext_GraphInfoV3_t>(), 80);
    // The array stride a reader must use, whatever version each element carries.
    assert_eq!(size_of::<b::QnnSystemContext_GraphInfo_t>(), 88);
    assert_eq!(
        offset_of!(b::QnnSystemContext_GraphInfo_t, __bindgen_anon_1),
        8
    );

    assert_eq!(offset_of!(b::QnnSystemContext_GraphInfoV1_t, graphName), 0);
    assert_eq!(
        offset_of!(b::QnnSystemContext_GraphInfoV1_t, numGraphInputs),
        8
    );
    assert_eq!(
        offset_of!(b::QnnSystemContext_GraphInfoV1_t, graphInputs),
        16
    );
    assert_eq!(
        offset_of!(b::QnnSystemContext_GraphInfoV1_t, numGraphOutputs),
        24
    );
    assert_eq!(
        offset_of!(b::QnnSystemContext_GraphInfoV1_t, graphOutputs),
        32
    );
    assert_eq!(
        offset_of!(b::QnnSystemContext_GraphInfoV2_t, numUpdateableTensors),
        40
    );
    assert_eq!(
        offset_of!(b::QnnSystemContext_GraphInfoV2_t, updateableTensors),
        48
    );
    assert_eq!(
        offset_of!(b::QnnSystemContext_GraphInfoV3_t, numUpdateableTensors),
        40
    );
    assert_eq!(
        offset_of!(b::QnnSystemContext_GraphInfoV3_t, updateableTensors),
        48
    );
    assert_eq!(
        offset_of!(b::QnnSystemContext_GraphInfoV3_t, graphBlobInfoSize),
        56
    );
    assert_eq!(
        offset_of!(b::QnnSystemContext_GraphInfoV3_t, graphBlobInfo),
        64
    );
    assert_eq!(
        offset_of!(b::QnnSystemContext_GraphInfoV3_t, startOpIndex),
        72
    );
    assert_eq!(
        offset_of!(b::QnnSystemContext_GraphInfoV3_t, endOpIndex),
        76
    );
}

#[test]
fn binary_info_v1_and_v2() {
    type V1 = b::QnnSystemContext_BinaryInfoV1_t;
    assert_eq!(offset_of!(V1, backendId), 0);
    assert_eq!(offset_of!(V1, buildId), 8);
    assert_eq!(offset_of!(V1, coreApiVersion), 16);
    assert_eq!(offset_of!(V1, backendApiVersion), 28);
    assert_eq!(offset_of!(V1, socVersion), 40);
    assert_eq!(offset_of!(V1, hwInfoBlobVersion), 48);
    assert_eq!(offset_of!(V1, contextBlobVersion), 60);
    assert_eq!(offset_of!(V1, hwInfoBlobSize), 72);
    assert_eq!(offset_of!(V1, hwInfoBlob), 80);
    assert_eq!(offset_of!(V1, contextBlobSize), 88);
    assert_eq!(offset_of!(V1, numContextTensors), 96);
    assert_eq!(offset_of!(V1, contextTensors), 104);
    assert_eq!(offset_of!(V1, numGraphs), 112);
    assert_eq!(offset_of!(V1, graphs), 120);
    assert_eq!(size_of::<V1>(), 128);

    type V2 = b::QnnSystemContext_BinaryInfoV2_t;
    assert_eq!(offset_of!(V2, graphs), 120);
    assert_eq!(offset_of!(V2, platformInfo), 128);
    assert_eq!(size_of::<V2>(), 136);
}

#[test]
fn binary_info_v3_drops_the_hardware_blob_fields() {
    type V3 = b::QnnSystemContext_BinaryInfoV3_t;
    assert_eq!(offset_of!(V3, backendId), 0);
    assert_eq!(offset_of!(V3, buildId), 8);
    assert_eq!(offset_of!(V3, coreApiVersion), 16);
    assert_eq!(offset_of!(V3, backendApiVersion), 28);
    assert_eq!(offset_of!(V3, socVersion), 40);
    assert_eq!(offset_of!(V3, contextBlobVersion), 48);
    assert_eq!(offset_of!(V3, contextBlobSize), 64);
    assert_eq!(offset_of!(V3, numContextTensors), 72);
    assert_eq!(offset_of!(V3, contextTensors), 80);
    assert_eq!(offset_of!(V3, numGraphs), 88);
    assert_eq!(offset_of!(V3, graphs), 96);
    assert_eq!(offset_of!(V3, platformInfo), 104);
    assert_eq!(offset_of!(V3, contextMetadataSize), 112);
    assert_eq!(offset_of!(V3, contextMetadata), 120);
    assert_eq!(offset_of!(V3, socModel), 128);
    assert_eq!(size_of::<V3>(), 136);

    assert_eq!(size_of::<b::QnnSystemContext_BinaryInfo_t>(), 144);
    assert_eq!(
        offset_of!(b::QnnSystemContext_BinaryInfo_t, __bindgen_anon_1),
        8
    );
}

#[test]
fn htp_blob_infos() {
    type G = b::QnnHtpSystemContext_GraphBlobInfoV1_t;
    assert_eq!(offset_of!(G, spillFillBufferSize), 0);
    assert_eq!(offset_of!(G, vtcmSize), 8);
    assert_eq!(offset_of!(G, optimizationLevel), 12);
    assert_eq!(offset_of!(G, htpDlbc), 16);
    assert_eq!(offset_of!(G, numHvxThreads), 24);
    assert_eq!(size_of::<G>(), 32);
    assert_eq!(size_of::<b::QnnHtpSystemContext_GraphBlobInfo_t>(), 40);
    type H = b::QnnHtpSystemContext_HwBlobInfoV1_t;
    assert_eq!(offset_of!(H, graphListIndex), 0);
    assert_eq!(offset_of!(H, spillFillBufferSize), 8);
    assert_eq!(size_of::<b::QnnHtpSystemContext_HwBlobInfo_t>(), 24);
}

#[test]
fn tensors_and_encodings() {
    assert_eq!(size_of::<b::Qnn_ScaleOffset_t>(), 8);
    assert_eq!(size_of::<b::Qnn_AxisScaleOffset_t>(), 16);
    assert_eq!(size_of::<b::Qnn_BwAxisScaleOffset_t>(), 32);
    type E = b::Qnn_BlockwiseExpansion_t;
    assert_eq!(offset_of!(E, axis), 0);
    assert_eq!(offset_of!(E, scaleOffsets), 8);
    assert_eq!(offset_of!(E, numBlocksPerAxis), 16);
    assert_eq!(offset_of!(E, blockScaleBitwidth), 20);
    assert_eq!(offset_of!(E, blockScaleStorageType), 24);
    assert_eq!(offset_of!(E, __bindgen_anon_1), 32);
    assert_eq!(size_of::<E>(), 40);
    type Q = b::Qnn_QuantizeParams_t;
    assert_eq!(offset_of!(Q, encodingDefinition), 0);
    assert_eq!(offset_of!(Q, quantizationEncoding), 4);
    assert_eq!(offset_of!(Q, __bindgen_anon_1), 8);
    assert_eq!(size_of::<Q>(), 40);

    type T1 = b::Qnn_TensorV1_t;
    assert_eq!(offset_of!(T1, id), 0);
    assert_eq!(offset_of!(T1, name), 8);
    assert_eq!(offset_of!(T1, type_), 16);
    assert_eq!(offset_of!(T1, dataFormat), 20);
    assert_eq!(offset_of!(T1, dataType), 24);
    assert_eq!(offset_of!(T1, quantizeParams), 32);
    assert_eq!(offset_of!(T1, rank), 72);
    assert_eq!(offset_of!(T1, dimensions), 80);
    assert_eq!(offset_of!(T1, memType), 88);
    assert_eq!(offset_of!(T1, __bindgen_anon_1), 96);
    assert_eq!(size_of::<T1>(), 112);

    type T2 = b::Qnn_TensorV2_t;
    assert_eq!(offset_of!(T2, memType), 88);
    assert_eq!(offset_of!(T2, __bindgen_anon_1), 96);
    assert_eq!(offset_of!(T2, isDynamicDimensions), 112);
    assert_eq!(offset_of!(T2, sparseParams), 120);
    assert_eq!(offset_of!(T2, isProduced), 132);
    assert_eq!(size_of::<T2>(), 136);

    assert_eq!(size_of::<b::Qnn_Tensor_t>(), 144);
    assert_eq!(offset_of!(b::Qnn_Tensor_t, __bindgen_anon_1), 8);
}

#[test]
fn memory_descriptors() {
    type M = b::Qnn_MemDescriptor_t;
    assert_eq!(offset_of!(M, memShape), 0);
    assert_eq!(size_of::<b::Qnn_MemShape_t>(), 24);
    assert_eq!(offset_of!(M, dataType), 24);
    assert_eq!(offset_of!(M, memType), 28);
    assert_eq!(offset_of!(M, __bindgen_anon_1), 32);
    assert_eq!(size_of::<M>(), 40);
    type H = b::QnnMemHtp_Descriptor_t;
    assert_eq!(offset_of!(H, type_), 0);
    assert_eq!(offset_of!(H, size), 8);
    assert_eq!(offset_of!(H, __bindgen_anon_1), 16);
    assert_eq!(size_of::<H>(), 32);
}

#[test]
fn function_table_and_providers() {
    type I = b::HtpkvQnnInterface_t;
    // Group starts from the C# interop table (byte offsets of the 2.x table).
    assert_eq!(offset_of!(I, backendCreate), 8);
    assert_eq!(offset_of!(I, contextCreateFromBinary), 104);
    assert_eq!(offset_of!(I, graphRetrieve), 160);
    assert_eq!(offset_of!(I, graphExecute), 168);
    assert_eq!(offset_of!(I, logCreate), 200);
    assert_eq!(offset_of!(I, memRegister), 280);
    assert_eq!(offset_of!(I, memDeRegister), 288);
    assert_eq!(offset_of!(I, deviceCreate), 320);
    assert_eq!(offset_of!(I, deviceFree), 344);
    assert_eq!(offset_of!(I, errorGetMessage), 384);
    type P = b::QnnInterface_t;
    assert_eq!(offset_of!(P, backendId), 0);
    assert_eq!(offset_of!(P, providerName), 8);
    assert_eq!(offset_of!(P, apiVersion), 16);
    assert_eq!(offset_of!(P, __bindgen_anon_1), 40);
    type S = b::QnnSystemInterface_t;
    assert_eq!(offset_of!(S, systemApiVersion), 16);
    assert_eq!(offset_of!(S, __bindgen_anon_1), 32);
}

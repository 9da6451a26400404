/*
 * htpkv_qnn.h -- htpkv's own, clean-room declaration of the subset of the Qualcomm QNN C ABI
 * that htpkv uses (SPDX-License-Identifier: MIT OR Apache-2.0).
 *
 * This is NOT a copy of Qualcomm's proprietary headers. It was written for htpkv from facts of
 * the binary interface only: the identifiers of the API, the order and C types of struct fields,
 * the numeric values of enumerators and the parameter lists of the entry points. Those facts were
 * collected from public code that talks to QNN, cross-checked between independent sources:
 *   - budcribar/QualcommNPU        (C# interop: order and byte offsets of the function table)
 *   - pytorch/executorch           (backends/qualcomm: provider selection, tensor v1/v2 use,
 *                                   HTP shared-buffer registration with fd + offset)
 *   - alibaba/MNN, zhouwg/ggml-hexagon, zhouwg/kantv, llama.cpp QNN forks
 *                                  (provider/version checks, system context binary info walk)
 *   - public design notes that list QNN data-type, tensor-type and memory-type values
 * Comments and layout are htpkv's own. Where a fact could not be confirmed (noted below), htpkv
 * takes the conservative path in qnn_ffi's loader.
 *
 * Conventions of this header:
 *   - enumerations are declared as C enums so that bindgen emits plain constants; the ABI type
 *     of every QNN enumeration is a 32-bit integer (each has a 0x7FFFFFFF "undefined" member);
 *   - function-table entries htpkv never calls are declared as HtpkvQnn_UnusedFn_t, an opaque
 *     function pointer of the same size, so that every later entry keeps its offset;
 *   - the anonymous unions of the real ABI are kept anonymous (bindgen names them
 *     __bindgen_anon_1) so that code written against these bindings also compiles against
 *     bindings generated from a real SDK (qnn_ffi's `qnn-sdk` feature).
 *
 * Regenerate src/bindings.rs after editing (see qnn_ffi/tests/bindings_sync.rs).
 */
#ifndef HTPKV_QNN_H
#define HTPKV_QNN_H

#include <stdint.h>

/* ---------------------------------------------------------------------------------------------
 * Versions htpkv was written against.
 * ------------------------------------------------------------------------------------------- */

/* Core API: the major version must match; the function-table prefix declared below (up to and
 * including signalFree) is the layout of core API 2.10, so providers must report minor >= 10. */
#define HTPKV_QNN_API_VERSION_MAJOR 2
#define HTPKV_QNN_API_VERSION_MINOR 10
/* The error-message entries (errorGetMessage ...) follow signalFree in later 2.x tables. The
 * minor version that introduced them was not confirmed from public sources, so the loader reads
 * them only from providers reporting at least this (conservative) minor version. */
#define HTPKV_QNN_API_VERSION_MINOR_ERROR_ENTRIES 20
/* System API (libQnnSystem.so): major 1; the 4-entry system table below exists from 1.1 on. */
#define HTPKV_QNN_SYSTEM_API_VERSION_MAJOR 1
#define HTPKV_QNN_SYSTEM_API_VERSION_MINOR 1

/* Backend identifiers are small integers chosen by each backend; 0 means "not specified".
 * Known public values: 1 reference, 2 saver, 3 CPU, 4 GPU, 5 DSP, 6 HTP. */
#define QNN_BACKEND_ID_NULL 0
#define QNN_BACKEND_ID_HTP 6
/* htpkv extension: the backend id of htpkv's reference backend ("HTKV"), which describes its
 * graphs with HTP's graph blob info. */
#define HTPKV_REF_BACKEND_ID 0x48544B56

/* ---------------------------------------------------------------------------------------------
 * Errors. Every entry point returns a 64-bit Qnn_ErrorHandle_t; 0 is success and the error code
 * proper is the low 16 bits (the upper bits are reserved for the backend's own tracking).
 * ------------------------------------------------------------------------------------------- */
typedef uint64_t Qnn_ErrorHandle_t;

#define QNN_SUCCESS 0
#define HTPKV_QNN_ERROR_CODE_MASK 0xFFFF

/* Error-code bands, one per API component. */
#define QNN_MIN_ERROR_COMMON 1000
#define QNN_MIN_ERROR_PROPERTY 2000
#define QNN_MIN_ERROR_OP_PACKAGE 3000
#define QNN_MIN_ERROR_BACKEND 4000
#define QNN_MIN_ERROR_CONTEXT 5000
#define QNN_MIN_ERROR_GRAPH 6000
#define QNN_MIN_ERROR_TENSOR 7000
#define QNN_MIN_ERROR_MEM 8000
#define QNN_MIN_ERROR_SIGNAL 9000
#define QNN_MIN_ERROR_ERROR 10000
#define QNN_MIN_ERROR_LOG 11000
#define QNN_MIN_ERROR_PROFILE 12000
#define QNN_MIN_ERROR_DEVICE 14000
#define QNN_MIN_ERROR_SYSTEM 30000
#define QNN_MIN_ERROR_INTERFACE 60000

typedef enum {
    QNN_COMMON_ERROR_NOT_SUPPORTED = 1000,
    QNN_COMMON_ERROR_MEM_ALLOC = 1002,
    QNN_COMMON_ERROR_SYSTEM = 1003,
    QNN_COMMON_ERROR_INVALID_ARGUMENT = 1004,
    QNN_COMMON_ERROR_OPERATION_NOT_PERMITTED = 1005,
    QNN_COMMON_ERROR_PLATFORM_NOT_SUPPORTED = 1006,
    QNN_COMMON_ERROR_SYSTEM_COMMUNICATION = 1007,
    QNN_COMMON_ERROR_INCOMPATIBLE_BINARIES = 1008,
    QNN_COMMON_ERROR_LOADING_BINARIES = 1009,
    QNN_COMMON_ERROR_RESOURCE_UNAVAILABLE = 1010,
    QNN_COMMON_ERROR_GENERAL = 1100,
    QNN_COMMON_ERROR_UNDEFINED = 0x7FFFFFFF
} QnnCommon_Error_t;

typedef enum {
    QNN_BACKEND_ERROR_CANNOT_INITIALIZE = 4000,
    QNN_BACKEND_ERROR_TERMINATE_FAILED = 4002,
    QNN_BACKEND_ERROR_NOT_SUPPORTED = 4003,
    QNN_BACKEND_ERROR_INVALID_ARGUMENT = 4004,
    QNN_BACKEND_ERROR_OP_PACKAGE_NOT_FOUND = 4005,
    QNN_BACKEND_ERROR_OP_PACKAGE_IF_PROVIDER_NOT_FOUND = 4006,
    QNN_BACKEND_ERROR_OP_PACKAGE_REGISTRATION_FAILED = 4007,
    QNN_BACKEND_ERROR_OP_PACKAGE_UNSUPPORTED_VERSION = 4008,
    QNN_BACKEND_ERROR_OP_PACKAGE_DUPLICATE = 4009,
    QNN_BACKEND_ERROR_INCONSISTENT_CONFIG = 4010,
    QNN_BACKEND_ERROR_INVALID_HANDLE = 4011,
    QNN_BACKEND_ERROR_INVALID_CONFIG = 4012,
    QNN_BACKEND_ERROR_UNDEFINED = 0x7FFFFFFF
} QnnBackend_Error_t;

typedef enum {
    QNN_CONTEXT_ERROR_INVALID_ARGUMENT = 5000,
    QNN_CONTEXT_ERROR_CTX_DOES_NOT_EXIST = 5001,
    QNN_CONTEXT_ERROR_INVALID_HANDLE = 5002,
    QNN_CONTEXT_ERROR_NOT_FINALIZED = 5003,
    QNN_CONTEXT_ERROR_BINARY_VERSION = 5004,
    QNN_CONTEXT_ERROR_CREATE_FROM_BINARY = 5005,
    QNN_CONTEXT_ERROR_GET_BINARY_SIZE_FAILED = 5006,
    QNN_CONTEXT_ERROR_GET_BINARY_FAILED = 5007,
    QNN_CONTEXT_ERROR_BINARY_CONFIGURATION = 5008,
    QNN_CONTEXT_ERROR_SET_PROFILE = 5009,
    QNN_CONTEXT_ERROR_INVALID_CONFIG = 5010,
    QNN_CONTEXT_ERROR_UNDEFINED = 0x7FFFFFFF
} QnnContext_Error_t;

typedef enum {
    QNN_GRAPH_ERROR_INVALID_ARGUMENT = 6000,
    QNN_GRAPH_ERROR_INVALID_HANDLE = 6001,
    QNN_GRAPH_ERROR_GRAPH_DOES_NOT_EXIST = 6002,
    QNN_GRAPH_ERROR_INVALID_NAME = 6003,
    QNN_GRAPH_ERROR_INVALID_TENSOR = 6004,
    QNN_GRAPH_ERROR_INVALID_OP_CONFIG = 6005,
    QNN_GRAPH_ERROR_SET_PROFILE = 6006,
    QNN_GRAPH_ERROR_UNCONNECTED_NODE = 6007,
    QNN_GRAPH_ERROR_CREATE_FAILED = 6020,
    QNN_GRAPH_ERROR_OPTIMIZATION_FAILED = 6021,
    QNN_GRAPH_ERROR_FINALIZE_FAILED = 6022,
    QNN_GRAPH_ERROR_GRAPH_NOT_FINALIZED = 6023,
    QNN_GRAPH_ERROR_GRAPH_FINALIZED = 6024,
    QNN_GRAPH_ERROR_EXECUTION_ASYNC_FIFO_FULL = 6025,
    QNN_GRAPH_ERROR_SIGNAL_IN_USE = 6030,
    QNN_GRAPH_ERROR_ABORTED = 6031,
    QNN_GRAPH_ERROR_PROFILE_IN_USE = 6032,
    QNN_GRAPH_ERROR_TIMED_OUT = 6033,
    QNN_GRAPH_ERROR_SUBGRAPH = 6034,
    QNN_GRAPH_ERROR_DISABLED = 6035,
    QNN_GRAPH_ERROR_UNDEFINED = 0x7FFFFFFF
} QnnGraph_Error_t;

typedef enum {
    QNN_MEM_ERROR_INVALID_ARGUMENT = 8000,
    QNN_MEM_ERROR_INVALID_HANDLE = 8001,
    QNN_MEM_ERROR_ALREADY_REGISTERED = 8002,
    QNN_MEM_ERROR_MAPPING = 8003,
    QNN_MEM_ERROR_INVALID_SHAPE = 8004,
    QNN_MEM_ERROR_UNSUPPORTED_MEMTYPE = 8005,
    QNN_MEM_ERROR_UNDEFINED = 0x7FFFFFFF
} QnnMem_Error_t;

typedef enum {
    QNN_LOG_ERROR_INITIALIZATION = 11002,
    QNN_LOG_ERROR_INVALID_ARGUMENT = 11003,
    QNN_LOG_ERROR_INVALID_HANDLE = 11004,
    QNN_LOG_ERROR_UNDEFINED = 0x7FFFFFFF
} QnnLog_Error_t;

typedef enum {
    QNN_SYSTEM_CONTEXT_ERROR_INVALID_HANDLE = 30000,
    QNN_SYSTEM_CONTEXT_ERROR_INVALID_ARGUMENT = 30001,
    QNN_SYSTEM_CONTEXT_ERROR_OPERATION_FAILED = 30002,
    QNN_SYSTEM_CONTEXT_ERROR_MALFORMED_BINARY = 30010,
    QNN_SYSTEM_CONTEXT_ERROR_UNDEFINED = 0x7FFFFFFF
} QnnSystemContext_Error_t;

/* ---------------------------------------------------------------------------------------------
 * Handles: all opaque pointers owned by the backend.
 * ------------------------------------------------------------------------------------------- */
typedef void *Qnn_Handle_t;
typedef Qnn_Handle_t Qnn_BackendHandle_t;
typedef Qnn_Handle_t Qnn_ContextHandle_t;
typedef Qnn_Handle_t Qnn_DeviceHandle_t;
typedef Qnn_Handle_t Qnn_GraphHandle_t;
typedef Qnn_Handle_t Qnn_LogHandle_t;
typedef Qnn_Handle_t Qnn_MemHandle_t;
typedef Qnn_Handle_t Qnn_ProfileHandle_t;
typedef Qnn_Handle_t Qnn_SignalHandle_t;
typedef void *QnnSystemContext_Handle_t;

/* ---------------------------------------------------------------------------------------------
 * Versions.
 * ------------------------------------------------------------------------------------------- */
typedef struct {
    uint32_t major;
    uint32_t minor;
    uint32_t patch;
} Qnn_Version_t;

typedef struct {
    Qnn_Version_t coreApiVersion;    /* the QNN core API common to all backends */
    Qnn_Version_t backendApiVersion; /* the backend's own API */
} Qnn_ApiVersion_t;

/* ---------------------------------------------------------------------------------------------
 * Element types. The high byte is the family (0 signed int, 1 unsigned int, 2 float, 3 signed
 * fixed point, 4 unsigned fixed point, 5 bool, 6 string); the low byte is the bit width written
 * as a DECIMAL number in hex digits (0x16 = 16 bits, 0x32 = 32 bits).
 * ------------------------------------------------------------------------------------------- */
typedef enum {
    QNN_DATATYPE_INT_8 = 0x0008,
    QNN_DATATYPE_INT_16 = 0x0016,
    QNN_DATATYPE_INT_32 = 0x0032,
    QNN_DATATYPE_INT_64 = 0x0064,
    QNN_DATATYPE_UINT_8 = 0x0108,
    QNN_DATATYPE_UINT_16 = 0x0116,
    QNN_DATATYPE_UINT_32 = 0x0132,
    QNN_DATATYPE_UINT_64 = 0x0164,
    QNN_DATATYPE_FLOAT_16 = 0x0216,
    QNN_DATATYPE_FLOAT_32 = 0x0232,
    QNN_DATATYPE_FLOAT_64 = 0x0264,
    QNN_DATATYPE_SFIXED_POINT_4 = 0x0304,
    QNN_DATATYPE_SFIXED_POINT_8 = 0x0308,
    QNN_DATATYPE_SFIXED_POINT_16 = 0x0316,
    QNN_DATATYPE_SFIXED_POINT_32 = 0x0332,
    QNN_DATATYPE_UFIXED_POINT_4 = 0x0404,
    QNN_DATATYPE_UFIXED_POINT_8 = 0x0408,
    QNN_DATATYPE_UFIXED_POINT_16 = 0x0416,
    QNN_DATATYPE_UFIXED_POINT_32 = 0x0432,
    QNN_DATATYPE_BOOL_8 = 0x0508,
    QNN_DATATYPE_STRING = 0x0608,
    QNN_DATATYPE_UNDEFINED = 0x7FFFFFFF
} Qnn_DataType_t;

/* Who reads and writes a tensor. Graph inputs are APP_WRITE, outputs APP_READ. */
typedef enum {
    QNN_TENSOR_TYPE_APP_WRITE = 0,
    QNN_TENSOR_TYPE_APP_READ = 1,
    QNN_TENSOR_TYPE_APP_READWRITE = 2,
    QNN_TENSOR_TYPE_NATIVE = 3,
    QNN_TENSOR_TYPE_STATIC = 4,
    QNN_TENSOR_TYPE_NULL = 5,
    QNN_TENSOR_TYPE_UPDATEABLE_STATIC = 6,
    QNN_TENSOR_TYPE_UPDATEABLE_NATIVE = 7,
    QNN_TENSOR_TYPE_UPDATEABLE_APP_WRITE = 8,
    QNN_TENSOR_TYPE_UPDATEABLE_APP_READ = 9,
    QNN_TENSOR_TYPE_UPDATEABLE_APP_READWRITE = 10,
    QNN_TENSOR_TYPE_OPTIONAL_APP_WRITE = 11,
    QNN_TENSOR_TYPE_OPTIONAL_APP_READ = 12,
    QNN_TENSOR_TYPE_OPTIONAL_APP_READWRITE = 13,
    QNN_TENSOR_TYPE_UNDEFINED = 0x7FFFFFFF
} Qnn_TensorType_t;

/* ---------------------------------------------------------------------------------------------
 * Quantization. Fixed-point values decode as real = (q + offset) * scale, scale > 0.
 * ------------------------------------------------------------------------------------------- */
typedef enum {
    QNN_DEFINITION_IMPL_GENERATED = 0,
    QNN_DEFINITION_DEFINED = 1,
    QNN_DEFINITION_UNDEFINED = 0x7FFFFFFF
} Qnn_Definition_t;

typedef enum {
    QNN_QUANTIZATION_ENCODING_SCALE_OFFSET = 0,         /* per tensor */
    QNN_QUANTIZATION_ENCODING_AXIS_SCALE_OFFSET = 1,    /* per axis (channel) */
    QNN_QUANTIZATION_ENCODING_BW_SCALE_OFFSET = 2,      /* per tensor with explicit bit width */
    QNN_QUANTIZATION_ENCODING_BW_AXIS_SCALE_OFFSET = 3, /* per axis with explicit bit width */
    QNN_QUANTIZATION_ENCODING_BLOCK = 4,
    QNN_QUANTIZATION_ENCODING_BLOCKWISE_EXPANSION = 5,
    QNN_QUANTIZATION_ENCODING_VECTOR = 6,
    QNN_QUANTIZATION_ENCODING_UNDEFINED = 0x7FFFFFFF
} Qnn_QuantizationEncoding_t;

typedef struct {
    float scale;
    int32_t offset;
} Qnn_ScaleOffset_t;

typedef struct {
    int32_t axis;
    uint32_t numScaleOffsets;
    Qnn_ScaleOffset_t *scaleOffset; /* numScaleOffsets entries */
} Qnn_AxisScaleOffset_t;

typedef struct {
    uint32_t bitwidth;
    float scale;
    int32_t offset;
} Qnn_BwScaleOffset_t;

typedef struct {
    uint32_t bitwidth;
    int32_t axis;
    uint32_t numElements;
    float *scales;    /* numElements entries */
    int32_t *offsets; /* numElements entries, or NULL for all-zero offsets */
} Qnn_BwAxisScaleOffset_t;

typedef struct {
    uint32_t *blockSize;            /* one entry per dimension */
    Qnn_ScaleOffset_t *scaleOffset; /* one entry per block */
} Qnn_BlockEncoding_t;

/* How the block multipliers of a blockwise expansion are stored. */
typedef enum {
    QNN_BLOCKWISE_EXPANSION_BITWIDTH_SCALE_STORAGE_8 = 0,  /* one byte each */
    QNN_BLOCKWISE_EXPANSION_BITWIDTH_SCALE_STORAGE_16 = 1, /* two bytes each */
    QNN_BLOCKWISE_EXPANSION_BITWIDTH_SCALE_STORAGE_UNDEFINED = 0x7FFFFFFF
} Qnn_BlockwiseExpansionBlockScaleStorageType_t;

/* Blockwise expansion (AI Hub's "LPBQ"): a scale/offset per index along `axis` times an unsigned
 * integer multiplier per block of the other axis, real = (q + offset) * scale * multiplier. htpkv
 * writes it (tested on the HTP with 4-bit values); the tensor holds a pointer to it. */
typedef struct {
    int32_t axis;
    Qnn_ScaleOffset_t *scaleOffsets; /* one entry per index along axis */
    uint32_t numBlocksPerAxis;
    uint32_t blockScaleBitwidth;     /* bits of a multiplier */
    Qnn_BlockwiseExpansionBlockScaleStorageType_t blockScaleStorageType;
    union {
        uint8_t *blocksScale8;       /* axis size x numBlocksPerAxis, row-major */
        uint16_t *blocksScale16;
    };
} Qnn_BlockwiseExpansion_t;

/* An encoding htpkv never reads; only a pointer to it appears in the union. */
typedef struct Qnn_VectorEncoding_t Qnn_VectorEncoding_t;

typedef struct {
    Qnn_Definition_t encodingDefinition;
    Qnn_QuantizationEncoding_t quantizationEncoding;
    union {
        Qnn_ScaleOffset_t scaleOffsetEncoding;
        Qnn_AxisScaleOffset_t axisScaleOffsetEncoding;
        Qnn_BwScaleOffset_t bwScaleOffsetEncoding;
        Qnn_BwAxisScaleOffset_t bwAxisScaleOffsetEncoding; /* the largest member: 32 bytes on LP64 */
        Qnn_BlockEncoding_t blockEncoding;
        Qnn_BlockwiseExpansion_t *blockwiseExpansion;
        Qnn_VectorEncoding_t *vectorEncoding;
    };
} Qnn_QuantizeParams_t;

/* ---------------------------------------------------------------------------------------------
 * Tensors.
 * ------------------------------------------------------------------------------------------- */

/* Data format is a plain 32-bit integer; 0 is a dense row-major buffer (last dimension fastest). */
typedef uint32_t Qnn_TensorDataFormat_t;
#define QNN_TENSOR_DATA_FORMAT_DENSE 0
#define QNN_TENSOR_DATA_FORMAT_FLAT_BUFFER 0

typedef enum {
    QNN_TENSORMEMTYPE_RAW = 0,          /* data in clientBuf */
    QNN_TENSORMEMTYPE_MEMHANDLE = 1,    /* data in registered memory (memHandle) */
    QNN_TENSORMEMTYPE_RETRIEVE_RAW = 2, /* v2 only: data through a callback (unused by htpkv) */
    QNN_TENSORMEMTYPE_UNDEFINED = 0x7FFFFFFF
} Qnn_TensorMemType_t;

typedef struct {
    void *data;        /* application memory */
    uint32_t dataSize; /* its size in bytes (32-bit) */
} Qnn_ClientBuffer_t;

typedef struct Qnn_TensorRetrieveRaw_t Qnn_TensorRetrieveRaw_t;

typedef struct {
    uint32_t id;
    const char *name;
    Qnn_TensorType_t type;
    Qnn_TensorDataFormat_t dataFormat;
    Qnn_DataType_t dataType;
    Qnn_QuantizeParams_t quantizeParams;
    uint32_t rank;
    uint32_t *dimensions; /* rank entries */
    Qnn_TensorMemType_t memType;
    union {
        Qnn_ClientBuffer_t clientBuf;
        Qnn_MemHandle_t memHandle;
    };
} Qnn_TensorV1_t;

typedef enum {
    QNN_SPARSE_LAYOUT_HYBRID_COO = 0,
    QNN_SPARSE_LAYOUT_UNDEFINED = 0x7FFFFFFF
} Qnn_SparseLayoutType_t;

typedef struct {
    uint32_t numSpecifiedElements;
    uint32_t numSparseDimensions;
} Qnn_SparseLayoutHybridCoo_t;

typedef struct {
    Qnn_SparseLayoutType_t type;
    union {
        Qnn_SparseLayoutHybridCoo_t hybridCoo;
    };
} Qnn_SparseParams_t;

/* Version 2 repeats every field of version 1 in the same order, widens the data union with a
 * retrieve-callback pointer and appends three fields. */
typedef struct {
    uint32_t id;
    const char *name;
    Qnn_TensorType_t type;
    Qnn_TensorDataFormat_t dataFormat;
    Qnn_DataType_t dataType;
    Qnn_QuantizeParams_t quantizeParams;
    uint32_t rank;
    uint32_t *dimensions;
    Qnn_TensorMemType_t memType;
    union {
        Qnn_ClientBuffer_t clientBuf;
        Qnn_MemHandle_t memHandle;
        Qnn_TensorRetrieveRaw_t *retrieveRaw;
    };
    uint8_t *isDynamicDimensions; /* rank flags, or NULL when every dimension is static */
    Qnn_SparseParams_t sparseParams;
    uint8_t isProduced;
} Qnn_TensorV2_t;

typedef enum {
    QNN_TENSOR_VERSION_1 = 1,
    QNN_TENSOR_VERSION_2 = 2,
    QNN_TENSOR_VERSION_UNDEFINED = 0x7FFFFFFF
} Qnn_TensorVersion_t;

typedef struct {
    Qnn_TensorVersion_t version;
    union {
        Qnn_TensorV1_t v1;
        Qnn_TensorV2_t v2;
    };
} Qnn_Tensor_t;

typedef uint64_t Qnn_ContextBinarySize_t;

/* ---------------------------------------------------------------------------------------------
 * Logging. The real callback's last parameter is a C va_list. On the targets htpkv supports
 * (x86_64 System V and AArch64 AAPCS64, incl. Android) a va_list parameter is passed as a
 * pointer, so it is declared here as an opaque pointer that can be handed to vsnprintf.
 * ------------------------------------------------------------------------------------------- */
typedef enum {
    QNN_LOG_LEVEL_ERROR = 1,
    QNN_LOG_LEVEL_WARN = 2,
    QNN_LOG_LEVEL_INFO = 3,
    QNN_LOG_LEVEL_VERBOSE = 4,
    QNN_LOG_LEVEL_DEBUG = 5,
    QNN_LOG_LEVEL_MAX = 0x7FFFFFFF
} QnnLog_Level_t;

typedef void (*QnnLog_Callback_t)(const char *fmt, QnnLog_Level_t level, uint64_t timestamp,
                                  void *va_list_args);

/* Configuration arrays are NULL-terminated arrays of pointers. htpkv passes NULL for the backend
 * and the context; a device and a graph may carry backend-specific ("custom") entries, which is how
 * an HTP build is told its target (SoC model, architecture) and its float precision. */
typedef struct QnnBackend_Config_t QnnBackend_Config_t;
typedef struct QnnContext_Config_t QnnContext_Config_t;

typedef enum {
    QNN_DEVICE_CONFIG_OPTION_CUSTOM = 0,
    QNN_DEVICE_CONFIG_OPTION_PLATFORM_INFO = 1,
    QNN_DEVICE_CONFIG_OPTION_UNDEFINED = 0x7FFFFFFF
} QnnDevice_ConfigOption_t;

typedef struct {
    QnnDevice_ConfigOption_t option;
    union {
        void *customConfig; /* CUSTOM: the backend's own struct, e.g. QnnHtpDevice_CustomConfig_t */
        void *hardwareInfo; /* PLATFORM_INFO: unused by htpkv */
    };
} QnnDevice_Config_t;

typedef enum {
    QNN_GRAPH_CONFIG_OPTION_CUSTOM = 0,
    QNN_GRAPH_CONFIG_OPTION_PRIORITY = 3,
    QNN_GRAPH_CONFIG_OPTION_UNDEFINED = 0x7FFFFFFF
} QnnGraph_ConfigOption_t;

typedef struct {
    QnnGraph_ConfigOption_t option;
    union {
        void *customConfig; /* CUSTOM: e.g. QnnHtpGraph_CustomConfig_t */
        uint32_t priority;
        void *reserved;     /* keeps the union pointer-sized */
    };
} QnnGraph_Config_t;

/* HTP device entries: which SoC the graphs are prepared for, and the minimum HTP architecture. */
typedef enum {
    QNN_HTP_DEVICE_CONFIG_OPTION_SOC = 0,
    QNN_HTP_DEVICE_CONFIG_OPTION_ARCH = 1,
    QNN_HTP_DEVICE_CONFIG_OPTION_UNKNOWN = 0x7FFFFFFF
} QnnHtpDevice_ConfigOption_t;

typedef struct {
    uint32_t deviceId;
    uint32_t arch; /* 68, 69, 73, 75, 79, ... */
} QnnHtpDevice_MinimumArch_t;

typedef struct {
    QnnHtpDevice_ConfigOption_t option;
    union {
        uint32_t socModel;
        QnnHtpDevice_MinimumArch_t arch;
        void *reserved; /* keeps the union's size and alignment */
    };
} QnnHtpDevice_CustomConfig_t;

/* HTP graph entries. */
typedef enum {
    QNN_HTP_GRAPH_CONFIG_OPTION_OPTIMIZATION = 1,
    QNN_HTP_GRAPH_CONFIG_OPTION_PRECISION = 2,
    QNN_HTP_GRAPH_CONFIG_OPTION_VTCM_SIZE_IN_MB = 3,
    QNN_HTP_GRAPH_CONFIG_OPTION_UNKNOWN = 0x7FFFFFFF
} QnnHtpGraph_ConfigOption_t;

typedef enum {
    QNN_PRECISION_FLOAT32 = 0,
    QNN_PRECISION_FLOAT16 = 1,
    QNN_PRECISION_UNDEFINED = 0x7FFFFFFF
} Qnn_Precision_t;

/* OPTIMIZATION: type 3 is the finalize optimization level (1 fast prepare .. 3 most optimal). */
#define QNN_HTP_GRAPH_OPTIMIZATION_TYPE_FINALIZE_OPTIMIZATION_FLAG 3

typedef struct {
    uint32_t type;
    float floatValue;
} QnnHtpGraph_OptimizationOption_t;

typedef struct {
    QnnHtpGraph_ConfigOption_t option;
    union {
        QnnHtpGraph_OptimizationOption_t optimizationOption;
        Qnn_Precision_t precision;
        uint32_t vtcmSizeInMB;
        uint64_t numHvxThreads; /* the union's widest scalar member */
        void *reserved;
    };
} QnnHtpGraph_CustomConfig_t;

/* ---------------------------------------------------------------------------------------------
 * Graph composition: operations with scalar and tensor parameters.
 * ------------------------------------------------------------------------------------------- */
typedef struct {
    Qnn_DataType_t dataType;
    union {
        float floatValue;
        double doubleValue;
        uint64_t uint64Value;
        int64_t int64Value;
        uint32_t uint32Value;
        int32_t int32Value;
        uint16_t uint16Value;
        int16_t int16Value;
        uint8_t uint8Value;
        int8_t int8Value;
        uint8_t bool8Value;
        const char *stringValue;
    };
} Qnn_Scalar_t;

typedef enum {
    QNN_PARAMTYPE_SCALAR = 0,
    QNN_PARAMTYPE_TENSOR = 1,
    QNN_PARAMTYPE_UNDEFINED = 0xFFFFFFFF
} Qnn_ParamType_t;

typedef struct {
    Qnn_ParamType_t paramType;
    const char *name;
    union {
        Qnn_Scalar_t scalarParam;
        Qnn_Tensor_t tensorParam; /* a STATIC tensor holding the parameter's values */
    };
} Qnn_Param_t;

/* One operation: its name in the graph, its op package ("qti.aisw" for the built-in ops), its type
 * ("FullyConnected", "ElementWiseAdd", ...), then its parameters, inputs and outputs. Tensors are
 * referred to by the id tensorCreateGraphTensor gave them (name and shape repeated). */
typedef struct {
    const char *name;
    const char *packageName;
    const char *typeName;
    uint32_t numOfParams;
    Qnn_Param_t *params;
    uint32_t numOfInputs;
    Qnn_Tensor_t *inputTensors;
    uint32_t numOfOutputs;
    Qnn_Tensor_t *outputTensors;
} Qnn_OpConfigV1_t;

typedef enum {
    QNN_OPCONFIG_VERSION_1 = 1,
    QNN_OPCONFIG_VERSION_UNDEFINED = 0x7FFFFFFF
} Qnn_OpConfigVersion_t;

typedef struct {
    Qnn_OpConfigVersion_t version;
    union {
        Qnn_OpConfigV1_t v1;
    };
} Qnn_OpConfig_t;

/* ---------------------------------------------------------------------------------------------
 * Memory registration.
 * ------------------------------------------------------------------------------------------- */
#define QNN_MEM_INVALID_FD (-1)

typedef struct {
    uint32_t numDim;
    uint32_t *dimSize;       /* numDim entries */
    const char *shapeConfig; /* may be NULL */
} Qnn_MemShape_t;

typedef enum {
    QNN_MEM_TYPE_ION = 1,    /* an ION/dma-buf file descriptor */
    QNN_MEM_TYPE_CUSTOM = 2, /* a backend-specific descriptor behind customInfo */
    QNN_MEM_TYPE_UNDEFINED = 0x7FFFFFFF
} Qnn_MemType_t;

typedef struct {
    int32_t fd;
} Qnn_MemIonInfo_t;

typedef void *Qnn_MemInfoCustom_t;

typedef struct {
    Qnn_MemShape_t memShape;
    Qnn_DataType_t dataType;
    Qnn_MemType_t memType;
    union {
        Qnn_MemIonInfo_t ionInfo;
        Qnn_MemInfoCustom_t customInfo;
    };
} Qnn_MemDescriptor_t;

/* HTP's custom descriptor (QNN_MEM_TYPE_CUSTOM): one shared rpcmem buffer registered at several
 * offsets yields one memory handle per offset. */
typedef enum {
    QNN_HTP_MEM_QURT = 0,
    QNN_HTP_MEM_SHARED_BUFFER = 1,
    QNN_HTP_MEM_UNDEFINED = 0x7FFFFFFF
} QnnHtpMem_Type_t;

typedef uint32_t QnnHtpMem_QurtAddress_t;

typedef struct {
    int32_t fd;      /* rpcmem file descriptor */
    uint64_t offset; /* byte offset of this tensor inside the shared buffer */
} QnnHtpMem_SharedBufferConfig_t;

typedef struct {
    QnnHtpMem_Type_t type;
    uint64_t size; /* SHARED_BUFFER: total size of the shared buffer in bytes */
    union {
        QnnHtpMem_QurtAddress_t qurtAddress;
        QnnHtpMem_SharedBufferConfig_t sharedBufferConfig;
    };
} QnnMemHtp_Descriptor_t;

/* htpkv extension, understood only by htpkv's reference backend (libhtpkv_ref_qnn.so): host
 * memory identified by its address, registered as QNN_MEM_TYPE_CUSTOM. The backend tells it
 * apart from QnnMemHtp_Descriptor_t by the first 32-bit field: HTP's descriptor holds its type
 * there (0 or 1), this one holds HTPKV_REF_MEM_HOST_MAGIC. */
#define HTPKV_REF_MEM_HOST_MAGIC 0x4B565048
typedef struct {
    uint32_t magic;    /* HTPKV_REF_MEM_HOST_MAGIC */
    uint32_t reserved; /* 0 */
    void *base;        /* start of the host region */
    uint64_t size;     /* size of the region in bytes */
    uint64_t offset;   /* byte offset of this tensor inside the region */
} HtpkvRefMem_HostDescriptor_t;

/* ---------------------------------------------------------------------------------------------
 * The core function table.
 * ------------------------------------------------------------------------------------------- */
typedef void (*HtpkvQnn_UnusedFn_t)(void);

typedef Qnn_ErrorHandle_t (*QnnBackend_CreateFn_t)(Qnn_LogHandle_t logger,
                                                   const QnnBackend_Config_t **config,
                                                   Qnn_BackendHandle_t *backend);
typedef Qnn_ErrorHandle_t (*QnnBackend_GetApiVersionFn_t)(Qnn_ApiVersion_t *version);
typedef Qnn_ErrorHandle_t (*QnnBackend_GetBuildIdFn_t)(const char **id);
typedef Qnn_ErrorHandle_t (*QnnBackend_FreeFn_t)(Qnn_BackendHandle_t backend);

typedef Qnn_ErrorHandle_t (*QnnContext_CreateFromBinaryFn_t)(
    Qnn_BackendHandle_t backend, Qnn_DeviceHandle_t device, const QnnContext_Config_t **config,
    const void *binaryBuffer, Qnn_ContextBinarySize_t binaryBufferSize,
    Qnn_ContextHandle_t *context, Qnn_ProfileHandle_t profile);
typedef Qnn_ErrorHandle_t (*QnnContext_CreateFn_t)(Qnn_BackendHandle_t backend,
                                                   Qnn_DeviceHandle_t device,
                                                   const QnnContext_Config_t **config,
                                                   Qnn_ContextHandle_t *context);
typedef Qnn_ErrorHandle_t (*QnnContext_GetBinarySizeFn_t)(Qnn_ContextHandle_t context,
                                                          Qnn_ContextBinarySize_t *size);
typedef Qnn_ErrorHandle_t (*QnnContext_GetBinaryFn_t)(Qnn_ContextHandle_t context, void *buffer,
                                                      Qnn_ContextBinarySize_t bufferSize,
                                                      Qnn_ContextBinarySize_t *written);
typedef Qnn_ErrorHandle_t (*QnnGraph_CreateFn_t)(Qnn_ContextHandle_t context, const char *graphName,
                                                 const QnnGraph_Config_t **config,
                                                 Qnn_GraphHandle_t *graph);
typedef Qnn_ErrorHandle_t (*QnnGraph_AddNodeFn_t)(Qnn_GraphHandle_t graph, Qnn_OpConfig_t opConfig);
typedef Qnn_ErrorHandle_t (*QnnGraph_FinalizeFn_t)(Qnn_GraphHandle_t graph,
                                                   Qnn_ProfileHandle_t profile,
                                                   Qnn_SignalHandle_t signal);
typedef Qnn_ErrorHandle_t (*QnnTensor_CreateGraphTensorFn_t)(Qnn_GraphHandle_t graph,
                                                             Qnn_Tensor_t *tensor);
typedef Qnn_ErrorHandle_t (*QnnContext_FreeFn_t)(Qnn_ContextHandle_t context,
                                                 Qnn_ProfileHandle_t profile);

typedef Qnn_ErrorHandle_t (*QnnGraph_RetrieveFn_t)(Qnn_ContextHandle_t context,
                                                   const char *graphName,
                                                   Qnn_GraphHandle_t *graph);
typedef Qnn_ErrorHandle_t (*QnnGraph_ExecuteFn_t)(Qnn_GraphHandle_t graph,
                                                  const Qnn_Tensor_t *inputs, uint32_t numInputs,
                                                  Qnn_Tensor_t *outputs, uint32_t numOutputs,
                                                  Qnn_ProfileHandle_t profile,
                                                  Qnn_SignalHandle_t signal);

typedef Qnn_ErrorHandle_t (*QnnLog_CreateFn_t)(QnnLog_Callback_t callback,
                                               QnnLog_Level_t maxLogLevel,
                                               Qnn_LogHandle_t *logger);
typedef Qnn_ErrorHandle_t (*QnnLog_SetLogLevelFn_t)(Qnn_LogHandle_t logger,
                                                    QnnLog_Level_t maxLogLevel);
typedef Qnn_ErrorHandle_t (*QnnLog_FreeFn_t)(Qnn_LogHandle_t logger);

typedef Qnn_ErrorHandle_t (*QnnMem_RegisterFn_t)(Qnn_ContextHandle_t context,
                                                 const Qnn_MemDescriptor_t *memDescriptors,
                                                 uint32_t numDescriptors,
                                                 Qnn_MemHandle_t *memHandles);
typedef Qnn_ErrorHandle_t (*QnnMem_DeRegisterFn_t)(const Qnn_MemHandle_t *memHandles,
                                                   uint32_t numHandles);

typedef Qnn_ErrorHandle_t (*QnnDevice_CreateFn_t)(Qnn_LogHandle_t logger,
                                                  const QnnDevice_Config_t **config,
                                                  Qnn_DeviceHandle_t *device);
typedef Qnn_ErrorHandle_t (*QnnDevice_FreeFn_t)(Qnn_DeviceHandle_t device);

typedef Qnn_ErrorHandle_t (*QnnError_GetMessageFn_t)(Qnn_ErrorHandle_t errorHandle,
                                                     const char **errorMessage);

/* Entry order is the ABI; each group starts at the byte offset given (LP64). */
typedef struct {
    HtpkvQnn_UnusedFn_t propertyHasCapability; /* 0 */
    QnnBackend_CreateFn_t backendCreate;       /* 8: backend group */
    HtpkvQnn_UnusedFn_t backendSetConfig;
    QnnBackend_GetApiVersionFn_t backendGetApiVersion;
    QnnBackend_GetBuildIdFn_t backendGetBuildId;
    HtpkvQnn_UnusedFn_t backendRegisterOpPackage;
    HtpkvQnn_UnusedFn_t backendGetSupportedOperations;
    HtpkvQnn_UnusedFn_t backendValidateOpConfig;
    QnnBackend_FreeFn_t backendFree;
    QnnContext_CreateFn_t contextCreate; /* 72: context group */
    HtpkvQnn_UnusedFn_t contextSetConfig;
    QnnContext_GetBinarySizeFn_t contextGetBinarySize;
    QnnContext_GetBinaryFn_t contextGetBinary;
    QnnContext_CreateFromBinaryFn_t contextCreateFromBinary;
    QnnContext_FreeFn_t contextFree;
    QnnGraph_CreateFn_t graphCreate; /* 120: graph group */
    HtpkvQnn_UnusedFn_t graphCreateSubgraph;
    HtpkvQnn_UnusedFn_t graphSetConfig;
    QnnGraph_AddNodeFn_t graphAddNode;
    QnnGraph_FinalizeFn_t graphFinalize;
    QnnGraph_RetrieveFn_t graphRetrieve;
    QnnGraph_ExecuteFn_t graphExecute;
    HtpkvQnn_UnusedFn_t graphExecuteAsync;
    HtpkvQnn_UnusedFn_t tensorCreateContextTensor; /* 184: tensor group */
    QnnTensor_CreateGraphTensorFn_t tensorCreateGraphTensor;
    QnnLog_CreateFn_t logCreate; /* 200: log group */
    QnnLog_SetLogLevelFn_t logSetLogLevel;
    QnnLog_FreeFn_t logFree;
    HtpkvQnn_UnusedFn_t profileCreate; /* 224: profile group */
    HtpkvQnn_UnusedFn_t profileSetConfig;
    HtpkvQnn_UnusedFn_t profileGetEvents;
    HtpkvQnn_UnusedFn_t profileGetSubEvents;
    HtpkvQnn_UnusedFn_t profileGetEventData;
    HtpkvQnn_UnusedFn_t profileGetExtendedEventData;
    HtpkvQnn_UnusedFn_t profileFree;
    QnnMem_RegisterFn_t memRegister; /* 280: memory group */
    QnnMem_DeRegisterFn_t memDeRegister;
    HtpkvQnn_UnusedFn_t deviceGetPlatformInfo; /* 296: device group */
    HtpkvQnn_UnusedFn_t deviceFreePlatformInfo;
    HtpkvQnn_UnusedFn_t deviceGetInfrastructure;
    QnnDevice_CreateFn_t deviceCreate;
    HtpkvQnn_UnusedFn_t deviceSetConfig;
    HtpkvQnn_UnusedFn_t deviceGetInfo;
    QnnDevice_FreeFn_t deviceFree;
    HtpkvQnn_UnusedFn_t signalCreate; /* 352: signal group, last of the 2.10 table */
    HtpkvQnn_UnusedFn_t signalSetConfig;
    HtpkvQnn_UnusedFn_t signalTrigger;
    HtpkvQnn_UnusedFn_t signalFree;
    /* Later 2.x tables continue here (see HTPKV_QNN_API_VERSION_MINOR_ERROR_ENTRIES). */
    QnnError_GetMessageFn_t errorGetMessage; /* 384 */
    HtpkvQnn_UnusedFn_t errorGetVerboseMessage;
    HtpkvQnn_UnusedFn_t errorFreeVerboseMessage;
    HtpkvQnn_UnusedFn_t graphPrepareExecutionEnvironment;
    HtpkvQnn_UnusedFn_t graphReleaseExecutionEnvironment;
    HtpkvQnn_UnusedFn_t graphGetProperty;
    HtpkvQnn_UnusedFn_t contextValidateBinary;
    HtpkvQnn_UnusedFn_t contextCreateFromBinaryWithSignal; /* 440 */
} HtpkvQnnInterface_t;

/* One provider of a backend library. The table is the only member of an anonymous union whose
 * member name in real SDK headers encodes the API version (v2_10, v2_34, ...). */
typedef struct {
    uint32_t backendId;
    const char *providerName; /* may be NULL */
    Qnn_ApiVersion_t apiVersion;
    union {
        HtpkvQnnInterface_t htpkv;
    };
} QnnInterface_t;

/* Exported by every backend library. On success *providerList points to numProviders provider
 * pointers that stay valid while the library is loaded. */
typedef Qnn_ErrorHandle_t (*QnnInterfaceGetProvidersFn_t)(const QnnInterface_t ***providerList,
                                                          uint32_t *numProviders);
Qnn_ErrorHandle_t QnnInterface_getProviders(const QnnInterface_t ***providerList,
                                            uint32_t *numProviders);

/* ---------------------------------------------------------------------------------------------
 * The system library: context binary metadata.
 * ------------------------------------------------------------------------------------------- */
typedef enum {
    QNN_SYSTEM_CONTEXT_GRAPH_INFO_VERSION_1 = 1,
    QNN_SYSTEM_CONTEXT_GRAPH_INFO_VERSION_2 = 2,
    QNN_SYSTEM_CONTEXT_GRAPH_INFO_VERSION_3 = 3,
    QNN_SYSTEM_CONTEXT_GRAPH_INFO_UNDEFINED = 0x7FFFFFFF
} QnnSystemContext_GraphInfoVersion_t;

typedef enum {
    QNN_SYSTEM_CONTEXT_BINARY_INFO_VERSION_1 = 1,
    QNN_SYSTEM_CONTEXT_BINARY_INFO_VERSION_2 = 2,
    QNN_SYSTEM_CONTEXT_BINARY_INFO_VERSION_3 = 3,
    QNN_SYSTEM_CONTEXT_BINARY_INFO_UNDEFINED = 0x7FFFFFFF
} QnnSystemContext_BinaryInfoVersion_t;

/* Graph info, three versions. Each version repeats the previous one's fields and appends its own,
 * so the leading five fields are common; the union's size is version 3's (80 bytes on LP64) and
 * the array stride of QnnSystemContext_GraphInfo_t is therefore 88 bytes whatever version a
 * library fills in. Sources of these layouts: Qualcomm's BSD-licensed Python ctypes declarations of
 * the system-context structs (QnnSystemContext_GraphInfoV1_t .. V3_t) and LiteRT's
 * vendors/qualcomm context-binary reader (Apache-2.0). */
typedef struct {
    const char *graphName;
    uint32_t numGraphInputs;
    Qnn_Tensor_t *graphInputs;
    uint32_t numGraphOutputs;
    Qnn_Tensor_t *graphOutputs;
} QnnSystemContext_GraphInfoV1_t;

typedef struct {
    const char *graphName;
    uint32_t numGraphInputs;
    Qnn_Tensor_t *graphInputs;
    uint32_t numGraphOutputs;
    Qnn_Tensor_t *graphOutputs;
    uint32_t numUpdateableTensors;
    Qnn_Tensor_t *updateableTensors;
} QnnSystemContext_GraphInfoV2_t;

typedef struct {
    const char *graphName;
    uint32_t numGraphInputs;
    Qnn_Tensor_t *graphInputs;
    uint32_t numGraphOutputs;
    Qnn_Tensor_t *graphOutputs;
    uint32_t numUpdateableTensors;
    Qnn_Tensor_t *updateableTensors;
    uint32_t graphBlobInfoSize; /* bytes at graphBlobInfo */
    void *graphBlobInfo;        /* backend-specific; HTP: QnnHtpSystemContext_GraphBlobInfo_t */
    uint32_t startOpIndex;
    uint32_t endOpIndex;
} QnnSystemContext_GraphInfoV3_t;

typedef struct {
    QnnSystemContext_GraphInfoVersion_t version;
    union {
        QnnSystemContext_GraphInfoV1_t graphInfoV1;
        QnnSystemContext_GraphInfoV2_t graphInfoV2;
        QnnSystemContext_GraphInfoV3_t graphInfoV3;
    };
} QnnSystemContext_GraphInfo_t;

typedef struct QnnDevice_PlatformInfo_t QnnDevice_PlatformInfo_t;

/* Binary info, three versions. Version 2 is version 1 plus platformInfo. Version 3 is NOT an
 * extension of version 1: it drops hwInfoBlobVersion, hwInfoBlobSize and hwInfoBlob (so every
 * later field moves) and appends platformInfo, contextMetadataSize, contextMetadata and socModel.
 * Sources as for graph info above. */
typedef struct {
    uint32_t backendId;
    const char *buildId;
    Qnn_Version_t coreApiVersion;
    Qnn_Version_t backendApiVersion;
    const char *socVersion;
    Qnn_Version_t hwInfoBlobVersion;
    Qnn_Version_t contextBlobVersion;
    uint32_t hwInfoBlobSize;
    void *hwInfoBlob; /* backend-specific; HTP: QnnHtpSystemContext_HwBlobInfo_t */
    uint64_t contextBlobSize;
    uint32_t numContextTensors;
    Qnn_Tensor_t *contextTensors;
    uint32_t numGraphs;
    QnnSystemContext_GraphInfo_t *graphs;
} QnnSystemContext_BinaryInfoV1_t;

typedef struct {
    uint32_t backendId;
    const char *buildId;
    Qnn_Version_t coreApiVersion;
    Qnn_Version_t backendApiVersion;
    const char *socVersion;
    Qnn_Version_t hwInfoBlobVersion;
    Qnn_Version_t contextBlobVersion;
    uint32_t hwInfoBlobSize;
    void *hwInfoBlob;
    uint64_t contextBlobSize;
    uint32_t numContextTensors;
    Qnn_Tensor_t *contextTensors;
    uint32_t numGraphs;
    QnnSystemContext_GraphInfo_t *graphs;
    QnnDevice_PlatformInfo_t *platformInfo;
} QnnSystemContext_BinaryInfoV2_t;

typedef struct {
    uint32_t backendId;
    const char *buildId;
    Qnn_Version_t coreApiVersion;
    Qnn_Version_t backendApiVersion;
    const char *socVersion;
    Qnn_Version_t contextBlobVersion;
    uint64_t contextBlobSize;
    uint32_t numContextTensors;
    Qnn_Tensor_t *contextTensors;
    uint32_t numGraphs;
    QnnSystemContext_GraphInfo_t *graphs;
    QnnDevice_PlatformInfo_t *platformInfo;
    uint32_t contextMetadataSize;
    void *contextMetadata;
    uint32_t socModel; /* the SoC model number, 0 when not recorded */
} QnnSystemContext_BinaryInfoV3_t;

typedef struct {
    QnnSystemContext_BinaryInfoVersion_t version;
    union {
        QnnSystemContext_BinaryInfoV1_t contextBinaryInfoV1;
        QnnSystemContext_BinaryInfoV2_t contextBinaryInfoV2;
        QnnSystemContext_BinaryInfoV3_t contextBinaryInfoV3;
    };
} QnnSystemContext_BinaryInfo_t;

/* HTP's backend-specific blobs inside binary info (facts from the public sources that read them,
 * e.g. ExecuTorch's QNN backend). Graph blob info (graph info V3's graphBlobInfo): a version, then
 * version 1's fields, of which htpkv reads the first, the graph's spill-fill buffer size. Hardware
 * info blob (binary info V1/V2's hwInfoBlob): a version, then the index of the graph it describes
 * and the spill-fill buffer size. */
#define QNN_SYSTEM_CONTEXT_HTP_GRAPH_INFO_BLOB_VERSION_V1 1
#define QNN_SYSTEM_CONTEXT_HTP_HW_INFO_BLOB_VERSION_V1 1

typedef struct {
    uint64_t spillFillBufferSize; /* bytes */
    uint32_t vtcmSize;            /* MB */
    uint32_t optimizationLevel;
    uint8_t htpDlbc;
    uint64_t numHvxThreads;
} QnnHtpSystemContext_GraphBlobInfoV1_t;

typedef struct {
    uint32_t version; /* QNN_SYSTEM_CONTEXT_HTP_GRAPH_INFO_BLOB_VERSION_V1 */
    union {
        QnnHtpSystemContext_GraphBlobInfoV1_t contextBinaryGraphBlobInfoV1;
    };
} QnnHtpSystemContext_GraphBlobInfo_t;

typedef struct {
    uint32_t graphListIndex;
    uint64_t spillFillBufferSize; /* bytes */
} QnnHtpSystemContext_HwBlobInfoV1_t;

typedef struct {
    uint32_t version; /* QNN_SYSTEM_CONTEXT_HTP_HW_INFO_BLOB_VERSION_V1 */
    union {
        QnnHtpSystemContext_HwBlobInfoV1_t contextBinaryHwInfoBlobV1_t;
    };
} QnnHtpSystemContext_HwBlobInfo_t;

typedef Qnn_ErrorHandle_t (*QnnSystemContext_CreateFn_t)(QnnSystemContext_Handle_t *sysCtxHandle);
typedef Qnn_ErrorHandle_t (*QnnSystemContext_GetBinaryInfoFn_t)(
    QnnSystemContext_Handle_t sysCtxHandle, void *binaryBuffer, uint64_t binaryBufferSize,
    const QnnSystemContext_BinaryInfo_t **binaryInfo, Qnn_ContextBinarySize_t *binaryInfoSize);
typedef Qnn_ErrorHandle_t (*QnnSystemContext_FreeFn_t)(QnnSystemContext_Handle_t sysCtxHandle);

typedef struct {
    QnnSystemContext_CreateFn_t systemContextCreate;
    QnnSystemContext_GetBinaryInfoFn_t systemContextGetBinaryInfo;
    HtpkvQnn_UnusedFn_t systemContextGetMetaData;
    QnnSystemContext_FreeFn_t systemContextFree;
} HtpkvQnnSystemInterface_t;

typedef struct {
    uint32_t backendId;
    const char *providerName; /* may be NULL */
    Qnn_Version_t systemApiVersion;
    union {
        HtpkvQnnSystemInterface_t htpkv;
    };
} QnnSystemInterface_t;

/* Exported by the system library (and by htpkv's reference backend). */
typedef Qnn_ErrorHandle_t (*QnnSystemInterfaceGetProvidersFn_t)(
    const QnnSystemInterface_t ***providerList, uint32_t *numProviders);
Qnn_ErrorHandle_t QnnSystemInterface_getProviders(const QnnSystemInterface_t ***providerList,
                                                  uint32_t *numProviders);

#endif /* HTPKV_QNN_H */

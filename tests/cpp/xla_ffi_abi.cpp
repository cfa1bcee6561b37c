// xla_ffi_abi.cpp - bindings/xla/xla_ffi.h (our declarations of the XLA FFI C API) against
// jaxlib's own header, xla/ffi/api/c_api.h, in one translation unit: every struct we
// declare has the size, and every field the offset and size, of the field of XLA's struct
// in the same position; every enum value we name equals XLA's. Compiled (not run) by
// tests/test_jax_ffi_abi.py with jaxlib's include directory (jax.ffi.include_dir()).
//
// Our structs are prefixes of XLA's where we read only the leading fields (CallFrame stops
// before `future`, Metadata before `state_type_id`, Api after the last function we call):
// there the check is that our prefix covers exactly XLA's fields up to that point.
//
// -DQQ_ABI_NEGATIVE_CONTROL adds one deliberately false check (the test expects the
// compilation to fail then: proof that the checks below are live and that c_api.h was
// really included).
#include <stddef.h>

#include "xla/ffi/api/c_api.h"
#include "xla_ffi.h"

namespace q = qq_xla;

#define SIZEOF_FIELD(T, f) sizeof(((T*)0)->f)

// Same size and alignment.
#define SAME_TYPE(ours, theirs)                                                        \
  static_assert(sizeof(q::ours) == sizeof(theirs), "size of " #ours " != " #theirs); \
  static_assert(alignof(q::ours) == alignof(theirs), "alignment of " #ours " != " #theirs)

// Same offset and size of a field.
#define SAME_FIELD(ours, of, theirs, tf)                                                  \
  static_assert(offsetof(q::ours, of) == offsetof(theirs, tf), "offset of " #ours "::" #of); \
  static_assert(SIZEOF_FIELD(q::ours, of) == SIZEOF_FIELD(theirs, tf), "size of " #ours "::" #of)

// Our struct is XLA's up to and including field `tf` (XLA's struct may go on).
#define PREFIX_UPTO(ours, of, theirs, tf)                                                        \
  static_assert(QQ_XLA_SIZE_UPTO(q::ours, of) == offsetof(theirs, tf) + SIZEOF_FIELD(theirs, tf), \
                #ours " is not the prefix of " #theirs " up to " #tf);                          \
  static_assert(sizeof(q::ours) <= sizeof(theirs), #ours " is longer than " #theirs)

#define SAME_VALUE(ours, theirs) static_assert(static_cast<long long>(q::ours) == static_cast<long long>(theirs), #ours " != " #theirs)

// ---- versions --------------------------------------------------------------------------------
static_assert(q::kApiMajor == XLA_FFI_API_MAJOR, "major version of the XLA FFI API changed: the ABI may have");
static_assert(q::kApiMinor <= XLA_FFI_API_MINOR, "xla_ffi.h claims a newer minor version than this jaxlib's");

// ---- extensions, versions, errors ----------------------------------------------------------------
SAME_TYPE(ExtensionBase, XLA_FFI_Extension_Base);
SAME_FIELD(ExtensionBase, struct_size, XLA_FFI_Extension_Base, struct_size);
SAME_FIELD(ExtensionBase, type, XLA_FFI_Extension_Base, type);
SAME_FIELD(ExtensionBase, next, XLA_FFI_Extension_Base, next);
SAME_TYPE(ExtensionType, XLA_FFI_Extension_Type);
SAME_VALUE(kExtensionMetadata, XLA_FFI_Extension_Metadata);

SAME_TYPE(ApiVersion, XLA_FFI_Api_Version);
SAME_FIELD(ApiVersion, struct_size, XLA_FFI_Api_Version, struct_size);
SAME_FIELD(ApiVersion, extension_start, XLA_FFI_Api_Version, extension_start);
SAME_FIELD(ApiVersion, major_version, XLA_FFI_Api_Version, major_version);
SAME_FIELD(ApiVersion, minor_version, XLA_FFI_Api_Version, minor_version);

SAME_TYPE(ErrorCode, XLA_FFI_Error_Code);
SAME_VALUE(kErrorInvalidArgument, XLA_FFI_Error_Code_INVALID_ARGUMENT);
SAME_VALUE(kErrorResourceExhausted, XLA_FFI_Error_Code_RESOURCE_EXHAUSTED);
SAME_VALUE(kErrorFailedPrecondition, XLA_FFI_Error_Code_FAILED_PRECONDITION);
SAME_VALUE(kErrorUnimplemented, XLA_FFI_Error_Code_UNIMPLEMENTED);
SAME_VALUE(kErrorInternal, XLA_FFI_Error_Code_INTERNAL);

SAME_TYPE(ErrorCreateArgs, XLA_FFI_Error_Create_Args);
SAME_FIELD(ErrorCreateArgs, struct_size, XLA_FFI_Error_Create_Args, struct_size);
SAME_FIELD(ErrorCreateArgs, extension_start, XLA_FFI_Error_Create_Args, extension_start);
SAME_FIELD(ErrorCreateArgs, message, XLA_FFI_Error_Create_Args, message);
SAME_FIELD(ErrorCreateArgs, errc, XLA_FFI_Error_Create_Args, errc);
static_assert(QQ_XLA_SIZE_UPTO(q::ErrorCreateArgs, errc) == XLA_FFI_Error_Create_Args_STRUCT_SIZE, "Error_Create_Args struct_size");

// ---- element types -----------------------------------------------------------------------------
SAME_TYPE(DataType, XLA_FFI_DataType);
SAME_VALUE(kPred, XLA_FFI_DataType_PRED);
SAME_VALUE(kS8, XLA_FFI_DataType_S8);
SAME_VALUE(kS16, XLA_FFI_DataType_S16);
SAME_VALUE(kS32, XLA_FFI_DataType_S32);
SAME_VALUE(kS64, XLA_FFI_DataType_S64);
SAME_VALUE(kU8, XLA_FFI_DataType_U8);
SAME_VALUE(kU16, XLA_FFI_DataType_U16);
SAME_VALUE(kU32, XLA_FFI_DataType_U32);
SAME_VALUE(kU64, XLA_FFI_DataType_U64);
SAME_VALUE(kF16, XLA_FFI_DataType_F16);
SAME_VALUE(kF32, XLA_FFI_DataType_F32);
SAME_VALUE(kF64, XLA_FFI_DataType_F64);
SAME_VALUE(kBF16, XLA_FFI_DataType_BF16);
SAME_VALUE(kF8E5M2, XLA_FFI_DataType_F8E5M2);
SAME_VALUE(kF8E4M3FN, XLA_FFI_DataType_F8E4M3FN);
SAME_VALUE(kF8E4M3B11FNUZ, XLA_FFI_DataType_F8E4M3B11FNUZ);
SAME_VALUE(kF8E5M2FNUZ, XLA_FFI_DataType_F8E5M2FNUZ);
SAME_VALUE(kF8E4M3FNUZ, XLA_FFI_DataType_F8E4M3FNUZ);
SAME_VALUE(kF8E4M3, XLA_FFI_DataType_F8E4M3);
SAME_VALUE(kF8E3M4, XLA_FFI_DataType_F8E3M4);
SAME_VALUE(kF8E8M0FNU, XLA_FFI_DataType_F8E8M0FNU);

// ---- operands, results, attributes ----------------------------------------------------------------
SAME_TYPE(Buffer, XLA_FFI_Buffer);
SAME_FIELD(Buffer, struct_size, XLA_FFI_Buffer, struct_size);
SAME_FIELD(Buffer, extension_start, XLA_FFI_Buffer, extension_start);
SAME_FIELD(Buffer, dtype, XLA_FFI_Buffer, dtype);
SAME_FIELD(Buffer, data, XLA_FFI_Buffer, data);
SAME_FIELD(Buffer, rank, XLA_FFI_Buffer, rank);
SAME_FIELD(Buffer, dims, XLA_FFI_Buffer, dims);
static_assert(QQ_XLA_SIZE_UPTO(q::Buffer, dims) == XLA_FFI_Buffer_STRUCT_SIZE, "Buffer struct_size");

SAME_TYPE(ArgType, XLA_FFI_ArgType);
SAME_VALUE(kArgBuffer, XLA_FFI_ArgType_BUFFER);
SAME_TYPE(RetType, XLA_FFI_RetType);
SAME_VALUE(kRetBuffer, XLA_FFI_RetType_BUFFER);
SAME_TYPE(AttrType, XLA_FFI_AttrType);
SAME_VALUE(kAttrArray, XLA_FFI_AttrType_ARRAY);
SAME_VALUE(kAttrDictionary, XLA_FFI_AttrType_DICTIONARY);
SAME_VALUE(kAttrScalar, XLA_FFI_AttrType_SCALAR);
SAME_VALUE(kAttrString, XLA_FFI_AttrType_STRING);

SAME_TYPE(ByteSpan, XLA_FFI_ByteSpan);
SAME_FIELD(ByteSpan, ptr, XLA_FFI_ByteSpan, ptr);
SAME_FIELD(ByteSpan, len, XLA_FFI_ByteSpan, len);
SAME_TYPE(Scalar, XLA_FFI_Scalar);
SAME_FIELD(Scalar, dtype, XLA_FFI_Scalar, dtype);
SAME_FIELD(Scalar, value, XLA_FFI_Scalar, value);

SAME_TYPE(ExecutionStage, XLA_FFI_ExecutionStage);
SAME_VALUE(kStageInstantiate, XLA_FFI_ExecutionStage_INSTANTIATE);
SAME_VALUE(kStagePrepare, XLA_FFI_ExecutionStage_PREPARE);
SAME_VALUE(kStageInitialize, XLA_FFI_ExecutionStage_INITIALIZE);
SAME_VALUE(kStageExecute, XLA_FFI_ExecutionStage_EXECUTE);

SAME_TYPE(Args, XLA_FFI_Args);
SAME_FIELD(Args, struct_size, XLA_FFI_Args, struct_size);
SAME_FIELD(Args, extension_start, XLA_FFI_Args, extension_start);
SAME_FIELD(Args, size, XLA_FFI_Args, size);
SAME_FIELD(Args, types, XLA_FFI_Args, types);
SAME_FIELD(Args, args, XLA_FFI_Args, args);
static_assert(QQ_XLA_SIZE_UPTO(q::Args, args) == XLA_FFI_Args_STRUCT_SIZE, "Args struct_size");

SAME_TYPE(Rets, XLA_FFI_Rets);
SAME_FIELD(Rets, struct_size, XLA_FFI_Rets, struct_size);
SAME_FIELD(Rets, extension_start, XLA_FFI_Rets, extension_start);
SAME_FIELD(Rets, size, XLA_FFI_Rets, size);
SAME_FIELD(Rets, types, XLA_FFI_Rets, types);
SAME_FIELD(Rets, rets, XLA_FFI_Rets, rets);
static_assert(QQ_XLA_SIZE_UPTO(q::Rets, rets) == XLA_FFI_Rets_STRUCT_SIZE, "Rets struct_size");

SAME_TYPE(Attrs, XLA_FFI_Attrs);
SAME_FIELD(Attrs, struct_size, XLA_FFI_Attrs, struct_size);
SAME_FIELD(Attrs, extension_start, XLA_FFI_Attrs, extension_start);
SAME_FIELD(Attrs, size, XLA_FFI_Attrs, size);
SAME_FIELD(Attrs, types, XLA_FFI_Attrs, types);
SAME_FIELD(Attrs, names, XLA_FFI_Attrs, names);
SAME_FIELD(Attrs, attrs, XLA_FFI_Attrs, attrs);
static_assert(QQ_XLA_SIZE_UPTO(q::Attrs, attrs) == XLA_FFI_Attrs_STRUCT_SIZE, "Attrs struct_size");

// CallFrame: ours stops before `future` (XLA's struct_size also ends at attrs).
SAME_FIELD(CallFrame, struct_size, XLA_FFI_CallFrame, struct_size);
SAME_FIELD(CallFrame, extension_start, XLA_FFI_CallFrame, extension_start);
SAME_FIELD(CallFrame, api, XLA_FFI_CallFrame, api);
SAME_FIELD(CallFrame, ctx, XLA_FFI_CallFrame, ctx);
SAME_FIELD(CallFrame, stage, XLA_FFI_CallFrame, stage);
SAME_FIELD(CallFrame, args, XLA_FFI_CallFrame, args);
SAME_FIELD(CallFrame, rets, XLA_FFI_CallFrame, rets);
SAME_FIELD(CallFrame, attrs, XLA_FFI_CallFrame, attrs);
PREFIX_UPTO(CallFrame, attrs, XLA_FFI_CallFrame, attrs);
static_assert(QQ_XLA_SIZE_UPTO(q::CallFrame, attrs) == XLA_FFI_CallFrame_STRUCT_SIZE, "CallFrame struct_size");

// ---- metadata ---------------------------------------------------------------------------------------
static_assert(sizeof(q::HandlerTraits) == sizeof(XLA_FFI_Handler_Traits), "Handler_Traits");
SAME_FIELD(Metadata, struct_size, XLA_FFI_Metadata, struct_size);
SAME_FIELD(Metadata, api_version, XLA_FFI_Metadata, api_version);
SAME_FIELD(Metadata, traits, XLA_FFI_Metadata, traits);
PREFIX_UPTO(Metadata, traits, XLA_FFI_Metadata, traits);
static_assert(QQ_XLA_SIZE_UPTO(q::Metadata, traits) == XLA_FFI_Metadata_STRUCT_SIZE, "Metadata struct_size");

SAME_TYPE(MetadataExtension, XLA_FFI_Metadata_Extension);
SAME_FIELD(MetadataExtension, extension_base, XLA_FFI_Metadata_Extension, extension_base);
SAME_FIELD(MetadataExtension, metadata, XLA_FFI_Metadata_Extension, metadata);

// ---- the API functions we call ---------------------------------------------------------------------
SAME_TYPE(StreamGetArgs, XLA_FFI_Stream_Get_Args);
SAME_FIELD(StreamGetArgs, struct_size, XLA_FFI_Stream_Get_Args, struct_size);
SAME_FIELD(StreamGetArgs, extension_start, XLA_FFI_Stream_Get_Args, extension_start);
SAME_FIELD(StreamGetArgs, ctx, XLA_FFI_Stream_Get_Args, ctx);
SAME_FIELD(StreamGetArgs, stream, XLA_FFI_Stream_Get_Args, stream);
static_assert(QQ_XLA_SIZE_UPTO(q::StreamGetArgs, stream) == XLA_FFI_Stream_Get_Args_STRUCT_SIZE, "Stream_Get_Args struct_size");

SAME_TYPE(DeviceOrdinalGetArgs, XLA_FFI_DeviceOrdinal_Get_Args);
SAME_FIELD(DeviceOrdinalGetArgs, struct_size, XLA_FFI_DeviceOrdinal_Get_Args, struct_size);
SAME_FIELD(DeviceOrdinalGetArgs, extension_start, XLA_FFI_DeviceOrdinal_Get_Args, extension_start);
SAME_FIELD(DeviceOrdinalGetArgs, ctx, XLA_FFI_DeviceOrdinal_Get_Args, ctx);
SAME_FIELD(DeviceOrdinalGetArgs, device_ordinal, XLA_FFI_DeviceOrdinal_Get_Args, device_ordinal);
static_assert(QQ_XLA_SIZE_UPTO(q::DeviceOrdinalGetArgs, device_ordinal) == XLA_FFI_DeviceOrdinal_Get_Args_STRUCT_SIZE,
              "DeviceOrdinal_Get_Args struct_size");

// The function table, field by field in XLA's order, up to the last function we call.
SAME_FIELD(Api, struct_size, XLA_FFI_Api, struct_size);
SAME_FIELD(Api, extension_start, XLA_FFI_Api, extension_start);
SAME_FIELD(Api, api_version, XLA_FFI_Api, api_version);
SAME_FIELD(Api, internal_api, XLA_FFI_Api, internal_api);
SAME_FIELD(Api, error_create, XLA_FFI_Api, XLA_FFI_Error_Create);
SAME_FIELD(Api, error_get_message, XLA_FFI_Api, XLA_FFI_Error_GetMessage);
SAME_FIELD(Api, error_destroy, XLA_FFI_Api, XLA_FFI_Error_Destroy);
SAME_FIELD(Api, handler_register, XLA_FFI_Api, XLA_FFI_Handler_Register);
SAME_FIELD(Api, stream_get, XLA_FFI_Api, XLA_FFI_Stream_Get);
SAME_FIELD(Api, type_register, XLA_FFI_Api, XLA_FFI_Type_Register);
SAME_FIELD(Api, execution_context_get, XLA_FFI_Api, XLA_FFI_ExecutionContext_Get);
SAME_FIELD(Api, state_set, XLA_FFI_Api, XLA_FFI_State_Set);
SAME_FIELD(Api, state_get, XLA_FFI_Api, XLA_FFI_State_Get);
SAME_FIELD(Api, device_memory_allocate, XLA_FFI_Api, XLA_FFI_DeviceMemory_Allocate);
SAME_FIELD(Api, device_memory_free, XLA_FFI_Api, XLA_FFI_DeviceMemory_Free);
SAME_FIELD(Api, thread_pool_schedule, XLA_FFI_Api, XLA_FFI_ThreadPool_Schedule);
SAME_FIELD(Api, thread_pool_num_threads, XLA_FFI_Api, XLA_FFI_ThreadPool_NumThreads);
SAME_FIELD(Api, future_create, XLA_FFI_Api, XLA_FFI_Future_Create);
SAME_FIELD(Api, future_set_available, XLA_FFI_Api, XLA_FFI_Future_SetAvailable);
SAME_FIELD(Api, future_set_error, XLA_FFI_Api, XLA_FFI_Future_SetError);
SAME_FIELD(Api, run_id_get, XLA_FFI_Api, XLA_FFI_RunId_Get);
SAME_FIELD(Api, device_ordinal_get, XLA_FFI_Api, XLA_FFI_DeviceOrdinal_Get);
PREFIX_UPTO(Api, device_ordinal_get, XLA_FFI_Api, XLA_FFI_DeviceOrdinal_Get);

// The handler type: a function of one call-frame pointer returning an error pointer.
static_assert(sizeof(q::Handler*) == sizeof(XLA_FFI_Handler*), "handler pointer");

#ifdef QQ_ABI_NEGATIVE_CONTROL
SAME_FIELD(Buffer, dims, XLA_FFI_Buffer, rank);  // false: dims follows rank
#endif

int main() { return 0; }

// xla_ffi.h - the part of XLA's FFI C API that qq's handlers use, declared by us.
//
// XLA (and so JAX) calls a custom-call handler through a small C ABI: the handler is
//   Error* handler(CallFrame* frame);
// and everything it reads - operands, results, attributes, the API function table - is a
// plain C struct that carries its size first and only ever grows at its end (XLA keeps
// old handlers working across minor versions). That ABI is specified by jaxlib's header
// xla/ffi/api/c_api.h. We declare the subset we read here, the way qq.h declares DLPack
// itself, so that building qq needs neither jax nor jaxlib (pip builds in an isolated
// environment); tests/test_jax_ffi_abi.py compiles this header next to jaxlib's and
// checks every size, offset and field order below against it.
//
// Rules of this header:
//  - Only what handlers.cpp reads or writes, plus opaque placeholders where a struct we
//    read has fields before the ones we need (the Api table's function pointers).
//  - Each struct is a prefix of XLA's struct of the same role; a struct we only read is
//    accepted when its struct_size covers the fields we read (handlers.cpp checks).
//  - Enums are declared as fixed 32-bit integers (C enums of c_api.h are int-sized) and
//    only the values we use are named.
//  - Names drop XLA's XLA_FFI_ prefix and live in namespace qq_xla, so that this header
//    and c_api.h can be included in one translation unit (the ABI test does).
#ifndef QQ_BINDINGS_XLA_FFI_H_
#define QQ_BINDINGS_XLA_FFI_H_

#include <stddef.h>
#include <stdint.h>

namespace qq_xla {

// The API version these declarations follow (c_api.h's XLA_FFI_API_MAJOR / _MINOR when
// they were written). A handler reports it when XLA asks for its metadata at
// registration; XLA accepts handlers of an older minor version.
constexpr int kApiMajor = 0;
constexpr int kApiMinor = 1;

struct ExtensionBase;
struct ExecutionContext;  // opaque: only passed back to the API's functions
struct Error;             // opaque: made by Api::error_create, owned by XLA once returned

// ---- extensions (a linked list hanging off the first struct of a call) ------------------
enum ExtensionType : int32_t { kExtensionMetadata = 1 };

struct ExtensionBase {
  size_t struct_size;
  ExtensionType type;
  ExtensionBase* next;
};

struct ApiVersion {
  size_t struct_size;
  ExtensionBase* extension_start;
  int major_version;
  int minor_version;
};

// ---- errors ----------------------------------------------------------------------------
// absl status codes; the ones our handlers return.
enum ErrorCode : int32_t {
  kErrorInvalidArgument = 3,
  kErrorResourceExhausted = 8,
  kErrorFailedPrecondition = 9,
  kErrorUnimplemented = 12,
  kErrorInternal = 13,
};

struct ErrorCreateArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  const char* message;  // copied by XLA
  ErrorCode errc;
};

// ---- element types (xla::PrimitiveType numbers) -----------------------------------------
enum DataType : int32_t {
  kPred = 1,
  kS8 = 2,
  kS16 = 3,
  kS32 = 4,
  kS64 = 5,
  kU8 = 6,
  kU16 = 7,
  kU32 = 8,
  kU64 = 9,
  kF16 = 10,
  kF32 = 11,
  kF64 = 12,
  kBF16 = 16,
  kF8E5M2 = 19,
  kF8E4M3FN = 20,
  kF8E4M3B11FNUZ = 23,
  kF8E5M2FNUZ = 24,
  kF8E4M3FNUZ = 25,
  kF8E4M3 = 28,
  kF8E3M4 = 29,
  kF8E8M0FNU = 33,
};

// ---- operands, results, attributes ------------------------------------------------------
struct Buffer {
  size_t struct_size;
  ExtensionBase* extension_start;
  DataType dtype;
  void* data;
  int64_t rank;
  int64_t* dims;  // rank extents, row-major (XLA's default layout; ffi_call asks for it)
};

enum ArgType : int32_t { kArgBuffer = 1 };
enum RetType : int32_t { kRetBuffer = 1 };
enum AttrType : int32_t { kAttrArray = 1, kAttrDictionary = 2, kAttrScalar = 3, kAttrString = 4 };

struct ByteSpan {  // not NUL-terminated
  const char* ptr;
  size_t len;
};

struct Scalar {
  DataType dtype;
  void* value;
};

enum ExecutionStage : int32_t { kStageInstantiate = 0, kStagePrepare = 1, kStageInitialize = 2, kStageExecute = 3 };

struct Args {
  size_t struct_size;
  ExtensionBase* extension_start;
  int64_t size;
  ArgType* types;
  void** args;  // Buffer* for kArgBuffer
};

struct Rets {
  size_t struct_size;
  ExtensionBase* extension_start;
  int64_t size;
  RetType* types;
  void** rets;  // Buffer* for kRetBuffer
};

struct Attrs {  // sorted by name
  size_t struct_size;
  ExtensionBase* extension_start;
  int64_t size;
  AttrType* types;
  ByteSpan** names;
  void** attrs;  // Scalar* for kAttrScalar, ByteSpan* for kAttrString
};

struct Api;

struct CallFrame {
  size_t struct_size;
  ExtensionBase* extension_start;
  const Api* api;
  ExecutionContext* ctx;
  ExecutionStage stage;
  Args args;
  Rets rets;
  Attrs attrs;
  // (then `future`, an out-field for asynchronous handlers: ours are synchronous and
  // never write it)
};

typedef Error* Handler(CallFrame* call_frame);

// ---- metadata: what XLA asks a handler at registration ----------------------------------
typedef uint32_t HandlerTraits;  // bit 0: command-buffer (CUDA graph) compatible

struct Metadata {
  size_t struct_size;
  ApiVersion api_version;  // written by the handler
  HandlerTraits traits;    // written by the handler
};

struct MetadataExtension {
  ExtensionBase extension_base;  // type == kExtensionMetadata
  Metadata* metadata;
};

// ---- the API functions we call ------------------------------------------------------------
struct StreamGetArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  ExecutionContext* ctx;
  void* stream;  // out: the platform stream (a cudaStream_t on CUDA)
};

struct DeviceOrdinalGetArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  ExecutionContext* ctx;
  int32_t device_ordinal;  // out
};

typedef Error* ErrorCreateFn(ErrorCreateArgs* args);
typedef Error* StreamGetFn(StreamGetArgs* args);
typedef Error* DeviceOrdinalGetFn(DeviceOrdinalGetArgs* args);
typedef void UnusedFn(void);  // a function of the table we never call

// The function table XLA hands every call (CallFrame::api). Its fields up to the last one
// we call; the table is longer in newer versions (struct_size says how long).
struct Api {
  size_t struct_size;
  ExtensionBase* extension_start;
  ApiVersion api_version;
  const void* internal_api;
  ErrorCreateFn* error_create;
  UnusedFn* error_get_message;
  UnusedFn* error_destroy;
  UnusedFn* handler_register;
  StreamGetFn* stream_get;
  UnusedFn* type_register;
  UnusedFn* execution_context_get;
  UnusedFn* state_set;
  UnusedFn* state_get;
  UnusedFn* device_memory_allocate;
  UnusedFn* device_memory_free;
  UnusedFn* thread_pool_schedule;
  UnusedFn* thread_pool_num_threads;
  UnusedFn* future_create;
  UnusedFn* future_set_available;
  UnusedFn* future_set_error;
  UnusedFn* run_id_get;
  DeviceOrdinalGetFn* device_ordinal_get;
};

// The size of a struct up to and including `field`: what a struct_size must cover before
// that field may be read.
#define QQ_XLA_SIZE_UPTO(type, field) (offsetof(type, field) + sizeof(((type*)0)->field))

}  // namespace qq_xla

#endif  // QQ_BINDINGS_XLA_FFI_H_

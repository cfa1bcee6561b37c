// route.cpp - which implementation computed the last product on this thread
// (qqGetLastRoute), and the test hooks that steer qqmm's dispatch in tests.
//
// The hooks are deliberately not in qq.h: qqInternalSetTestHook is exported
// so the test suite can reach it (through qq._qq._set_test_hook), but a user
// cannot set one by accident the way an environment variable gets inherited.
#include <atomic>
#include <string.h>

#include "internal.h"
#include "validate.h"

namespace qq {
namespace {
thread_local qqRoute_t g_last_route = QQ_ROUTE_AUTO;
std::atomic<int> g_hooks[HOOK_COUNT];
}  // namespace

void set_route(qqRoute_t r) { g_last_route = r; }

// `route` arrives as a plain int (raw_enum in validate.h): checked before it is an enum.
qqStatus_t check_route(const char* op, int route_value, int device) {
  if (route_value < (int)QQ_ROUTE_AUTO || route_value > (int)QQ_ROUTE_QMV)
    return set_error(QQ_STATUS_INVALID_VALUE, "%s: params.route is %d, not a route a call can ask for; expected "
                     "QQ_ROUTE_AUTO (0) to QQ_ROUTE_QMV (5) (QQ_ROUTE_DECODE is reported, not requested: "
                     "qqDecodeMatmul takes the decode layout)", op, route_value);
  const qqRoute_t route = (qqRoute_t)route_value;
  if (device < 0 && route != QQ_ROUTE_AUTO && route != QQ_ROUTE_CPU)
    return set_error(QQ_STATUS_NOT_SUPPORTED, "%s: route '%s' is a GPU route but the tensors are on the CPU; use "
                     "route 'auto' or 'cpu', or pass CUDA tensors", op, qqGetRouteString(route));
  if (device >= 0 && route == QQ_ROUTE_CPU)
    return set_error(QQ_STATUS_NOT_SUPPORTED, "%s: route 'cpu' needs CPU tensors but the tensors are on cuda:%d; "
                     "use route 'auto' (or a GPU route), or pass CPU tensors", op, device);
  return QQ_STATUS_SUCCESS;
}
int test_hook(TestHook h) { return g_hooks[h].load(std::memory_order_relaxed); }
void test_hook_add(TestHook h, int delta) { g_hooks[h].fetch_add(delta, std::memory_order_relaxed); }

}  // namespace qq

using namespace qq;

extern "C" {

QQ_API qqStatus_t qqGetLastRoute(qqRoute_t* route) {
  return guard("qqGetLastRoute", [&]() -> qqStatus_t {  // (a success clears the message, as every call's)
    if (!route)
      return set_error(QQ_STATUS_INVALID_VALUE, "qqGetLastRoute: route must not be NULL; pass the address of a "
                       "qqRoute_t");
    *route = g_last_route;
    return QQ_STATUS_SUCCESS;
  });
}

QQ_API const char* qqGetRouteString(qqRoute_t route) {
  int r;  // read as an int: any value a caller passes is answered, none is undefined behaviour
  memcpy(&r, &route, sizeof r);
  switch (r) {
    case QQ_ROUTE_AUTO: return "auto";
    case QQ_ROUTE_CPU: return "cpu";
    case QQ_ROUTE_EXACT: return "exact";
    case QQ_ROUTE_BLOCKSCALED: return "blockscaled";
    case QQ_ROUTE_QMMA: return "qmma";
    case QQ_ROUTE_QMV: return "qmv";
    case QQ_ROUTE_DECODE: return "decode";
  }
  return "unknown";
}

// Not in qq.h (see the top of this file). Names: "force_blockscaled",
// "fail_blockscaled_matmul", "unfused_qx", "emulate_grouped_blockscaled" (set to value), "blockscaled_queries" and
// "grouped_blockscaled_queries" (counters, read: *old gets the count; value is added).
// *old (may be NULL) gets the previous value.
QQ_API qqStatus_t qqInternalSetTestHook(const char* name, int value, int* old) {
  static const char* const names[HOOK_COUNT] = {"force_blockscaled", "fail_blockscaled_matmul",
                                                "blockscaled_queries", "unfused_qx",
                                                "grouped_blockscaled_queries", "emulate_grouped_blockscaled"};
  for (int i = 0; name && i < HOOK_COUNT; ++i) {
    if (strcmp(name, names[i]) != 0) continue;
    const bool counter = i == HOOK_BLOCKSCALED_QUERIES || i == HOOK_GROUPED_QUERIES;
    const int prev = counter ? g_hooks[i].fetch_add(value) : g_hooks[i].exchange(value);
    if (old) *old = prev;
    return QQ_STATUS_SUCCESS;
  }
  return set_error(QQ_STATUS_INVALID_VALUE, "qqInternalSetTestHook: unknown hook '%s'; expected "
                   "force_blockscaled, fail_blockscaled_matmul, blockscaled_queries, unfused_qx, "
                   "grouped_blockscaled_queries or emulate_grouped_blockscaled", name ? name : "(null)");
}

}  // extern "C"

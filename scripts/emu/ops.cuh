#pragma once
#include "../internal.h"
namespace qq { namespace cuda {
constexpr int kQmvMaxM = 16;
qqStatus_t qmv(const MatmulArgs& a, cudaStream_t stream);
}}

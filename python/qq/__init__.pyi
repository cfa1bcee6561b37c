# Type stubs of qq's public API (docs/api.md is the contract; tests/test_typing.py checks
# that every name of qq.__all__ is here with the runtime's parameters). Arrays are any
# framework's (NumPy, torch, CuPy, JAX): results come back in the first array's framework,
# so they are typed Any.
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple, Union

from . import checkpoint as checkpoint

Array = Any  # a NumPy / torch / CuPy / JAX array, or anything with __dlpack__

__version__: str

class QQError(RuntimeError): ...
class NotSupportedError(QQError, NotImplementedError): ...

class QuantizedArray:
    data: Array
    scales: Array
    biases: Optional[Array]
    mode: str
    group_size: int
    bits: int
    global_scale: Optional[Array]
    rounding: str
    scale_layout: str
    fp8_format: str
    shape: Tuple[int, ...]
    def __init__(self, data: Array, scales: Array, biases: Optional[Array] = None, *, mode: str = "affine",
                 group_size: Optional[int] = None, bits: Optional[int] = None, global_scale: Optional[Array] = None,
                 rounding: str = "ceil", scale_layout: str = "linear", fp8_format: str = "e4m3",
                 shape: Optional[Sequence[int]] = None) -> None: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[Array]: ...
    def __getitem__(self, index: int) -> Array: ...

class DecodeWeight:
    data: Array
    quantized: QuantizedArray
    mode: str
    global_scale: Optional[Array]
    shape: Tuple[int, ...]
    gated: bool

class PreparedWeight:
    quantized: QuantizedArray
    values: Optional[Array]
    mode: str
    global_scale: Optional[Array]
    shape: Tuple[int, ...]

def quantize(x: Array, group_size: Optional[int] = None, bits: Optional[int] = None, mode: str = "affine", *,
             global_scale: Optional[Array] = None, rounding: str = "ceil", scale_layout: str = "linear",
             fp8_format: str = "e4m3", torch_dtypes: Union[bool, str] = True,
             stream: Any = None) -> QuantizedArray: ...
def quantize_colwise(x: Array, group_size: Optional[int] = None, bits: Optional[int] = None, mode: str = "affine", *,
                     global_scale: Optional[Array] = None, rounding: str = "ceil", scale_layout: str = "linear",
                     fp8_format: str = "e4m3", rowwise: bool = False, torch_dtypes: Union[bool, str] = True,
                     stream: Any = None) -> Union[QuantizedArray, Tuple[QuantizedArray, QuantizedArray]]: ...
def quantize_dequantize(x: Array, mode: str = "mxfp8", *, global_scale: Optional[Array] = None,
                        rowwise: bool = True, colwise: bool = False, rounding: str = "ceil",
                        fp8_format: str = "e4m3", stream: Any = None) -> Union[Array, Tuple[Array, Array]]: ...
def quantize_dequantize_moe(w: Array, *, values: bool = True, transposed: bool = False, rounding: str = "ceil",
                            fp8_format: str = "e4m3", stream: Any = None) -> Union[Array, Tuple[Array, Array]]: ...
def quantize_moe(w: Array, scaling: str = "32x1", *, rounding: str = "ceil", scale_layout: str = "linear",
                 fp8_format: str = "e4m3", torch_dtypes: Union[bool, str] = True,
                 stream: Any = None) -> Tuple[Array, Array]: ...
def dequantize(w: Union[Array, QuantizedArray], scales: Optional[Array] = None, biases: Optional[Array] = None,
               group_size: Optional[int] = None, bits: Optional[int] = None, mode: str = "affine", *,
               global_scale: Optional[Array] = None, scale_layout: str = "linear", fp8_format: str = "e4m3",
               dtype: Any = None, out: Optional[Array] = None, stream: Any = None) -> Array: ...
def amax(x: Array, *, out: Optional[Array] = None, stream: Any = None) -> Array: ...
def swiglu(x: Array, *, out: Optional[Array] = None, stream: Any = None) -> Array: ...
def swizzle_scales(scales: Array, *, out: Optional[Array] = None, stream: Any = None) -> Array: ...
def unswizzle_scales(scales: Array, shape: Sequence[int], *, out: Optional[Array] = None,
                     stream: Any = None) -> Array: ...
def qqmm(x: Union[Array, QuantizedArray], w: Union[Array, QuantizedArray, PreparedWeight],
         scales: Optional[Array] = None, group_size: Optional[int] = None, bits: Optional[int] = None,
         mode: str = "nvfp4", *, global_scale_x: Optional[Array] = None, global_scale_w: Optional[Array] = None,
         x_scales: Optional[Array] = None, bias: Optional[Array] = None, c: Optional[Array] = None,
         beta: float = 1.0, rounding: str = "ceil", scale_layout: str = "linear", fp8_format: str = "e4m3",
         dtype: Any = None, out: Optional[Array] = None, stream: Any = None, route: str = "auto",
         x_prepared: bool = False, w_prepared: bool = False) -> Array: ...
def quantized_matmul(x: Array, w: Union[Array, QuantizedArray, DecodeWeight], scales: Optional[Array] = None,
                     biases: Optional[Array] = None, transpose: bool = True, group_size: Optional[int] = None,
                     bits: Optional[int] = None, mode: str = "affine", *, global_scale: Optional[Array] = None,
                     bias: Optional[Array] = None, scale_layout: str = "linear", fp8_format: str = "e4m3",
                     dtype: Any = None, out: Optional[Array] = None, stream: Any = None) -> Array: ...
def gather_qmm(x: Array, w: Union[Array, QuantizedArray, DecodeWeight], scales: Optional[Array] = None,
               biases: Optional[Array] = None, rhs_indices: Optional[Array] = None, transpose: bool = True,
               group_size: Optional[int] = None, bits: Optional[int] = None, mode: str = "affine", *,
               global_scale: Optional[Array] = None, bias: Optional[Array] = None,
               scale_layout: str = "linear", fp8_format: str = "e4m3", dtype: Any = None,
               out: Optional[Array] = None, stream: Any = None) -> Array: ...
def quantized_matmul_swiglu(x: Array, w: Union[Array, QuantizedArray, DecodeWeight], scales: Optional[Array] = None,
                            biases: Optional[Array] = None, group_size: Optional[int] = None,
                            bits: Optional[int] = None, mode: str = "affine", *,
                            global_scale: Optional[Array] = None, bias: Optional[Array] = None,
                            scale_layout: str = "linear", fp8_format: str = "e4m3", dtype: Any = None,
                            out: Optional[Array] = None, stream: Any = None) -> Array: ...
def prepare_decode(w: QuantizedArray, stream: Any = None, *, gated: bool = False) -> DecodeWeight: ...
def prepare_weight(w: Union[Array, QuantizedArray], mode: str = "nvfp4", *, global_scale: Optional[Array] = None,
                   rounding: str = "ceil", fp8_format: str = "e4m3", torch_dtypes: Union[bool, str] = True,
                   stream: Any = None) -> PreparedWeight: ...
def grouped_qqmm(x: Union[Array, QuantizedArray], w: Any, offsets: Array, scales: Optional[Array] = None,
                 group_size: Optional[int] = None, bits: Optional[int] = None, mode: str = "mxfp8", *,
                 global_scale_x: Optional[Array] = None, global_scale_w: Optional[Array] = None,
                 x_scales: Optional[Array] = None, rounding: str = "ceil", scale_layout: str = "linear",
                 fp8_format: str = "e4m3", moe_scaling: Optional[str] = None, dtype: Any = None,
                 out: Optional[Array] = None, stream: Any = None, w_prepared: bool = False) -> Array: ...
def grouped_qqmm_wgrad(x: Array, dy: Array, offsets: Array, mode: str = "mxfp8", *,
                       global_scale_x: Optional[Array] = None, global_scale_dy: Optional[Array] = None,
                       rounding: str = "ceil", fp8_format: str = "e4m3", dtype: Any = "float32",
                       stream: Any = None) -> Array: ...
def last_route() -> Optional[str]: ...
def device_count() -> int: ...
def device_capability(device: int = 0) -> Tuple[int, int]: ...
def cuda_info() -> Dict[str, Any]: ...
def build_info() -> Dict[str, Any]: ...
def cmake_prefix_path() -> str: ...

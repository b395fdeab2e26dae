"""Moved: the matmul modules are ssmport.ops.matmul, the int8 block quantizer ssmport.quant.int8."""

import warnings

from ssmport.ops.matmul import MAX_UNBLOCKED_OUT, OUT_BLOCK, WIDE_OUTPUT, FloatMatmul, Int8Matmul, out_blocks, rows_matmul
from ssmport.quant.int8 import dequantize_int8_blockwise, quantize_int8_blockwise

warnings.warn("ssmport.quant.layers moved to ssmport.ops.matmul and ssmport.quant.int8", DeprecationWarning, stacklevel=2)

__all__ = ["MAX_UNBLOCKED_OUT", "OUT_BLOCK", "WIDE_OUTPUT", "FloatMatmul", "Int8Matmul", "dequantize_int8_blockwise",
           "out_blocks", "quantize_int8_blockwise", "rows_matmul"]  # fmt: skip

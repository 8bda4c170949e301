"""The C renderer's table of element types: the C type and the helper-name suffix of
each :class:`~einfuse.ir.ScalarType` (the IR names types; each renderer spells them)."""

from __future__ import annotations

from ...ir import ScalarType

C_TYPE = {ScalarType.BOOL: "unsigned char", ScalarType.INT8: "signed char",
          ScalarType.INT16: "short", ScalarType.INT32: "int", ScalarType.INT64: "long long",
          ScalarType.UINT8: "unsigned char", ScalarType.UINT16: "unsigned short",
          ScalarType.UINT32: "unsigned int", ScalarType.UINT64: "unsigned long long",
          ScalarType.FLOAT32: "float", ScalarType.FLOAT64: "double"}

# the suffix of a type's helpers (ef_add_f, ef_div_i32 ...)
SUFFIX = {ScalarType.BOOL: "b", ScalarType.INT8: "i8", ScalarType.INT16: "i16",
          ScalarType.INT32: "i32", ScalarType.INT64: "i64", ScalarType.UINT8: "u8",
          ScalarType.UINT16: "u16", ScalarType.UINT32: "u32", ScalarType.UINT64: "u64",
          ScalarType.FLOAT32: "f", ScalarType.FLOAT64: "d"}

# the unsigned C type of each width in bits (for shifts)
UNSIGNED_OF_BITS = {8: "unsigned char", 16: "unsigned short", 32: "unsigned int",
                    64: "unsigned long long"}

__all__ = ["C_TYPE", "SUFFIX", "UNSIGNED_OF_BITS"]

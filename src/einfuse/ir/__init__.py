"""The loop-nest IR shared by the code generators (see :mod:`einfuse.ir.nodes`)."""

from .nodes import (AccValue, Accumulate, Affine, Binary, Buffer, Call, CombineLanes, Const,
                    DeclareAcc,
                    Expr, IndexValue, Kernel, Load, Loop, Param, Program, Stmt, Store,
                    Subscript, TiledLoop, Unary, walk)

__all__ = ["AccValue", "Accumulate", "Affine", "Binary", "Buffer", "Call", "CombineLanes", "Const",
           "DeclareAcc", "Expr", "IndexValue", "Kernel", "Load", "Loop", "Param", "Program",
           "Stmt", "Store", "Subscript", "TiledLoop", "Unary", "walk"]

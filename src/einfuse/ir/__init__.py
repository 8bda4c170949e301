"""The loop-nest IR shared by the code generators (see :mod:`einfuse.ir.nodes`)."""

from .nodes import (AccValue, Accumulate, Affine, Binary, Branch, Buffer, Call, CombineLanes,
                    Compensate, Const, DeclareAcc, Expr, Fold, IndexValue, Kernel, Let, Load,
                    Local, Loop, NormalBranch, Param, Program, Quasi, Stmt, Store, Subscript,
                    TiledLoop, Unary, walk)

__all__ = ["AccValue", "Accumulate", "Affine", "Binary", "Branch", "Buffer", "Call",
           "CombineLanes", "Compensate", "Const", "DeclareAcc", "Expr", "Fold", "IndexValue",
           "Kernel", "Let", "Load", "Local", "Loop", "NormalBranch", "Param", "Program", "Quasi",
           "Stmt", "Store", "Subscript", "TiledLoop", "Unary", "walk"]

"""The loop-nest IR shared by the code generators (see :mod:`einfuse.ir.nodes`), with its
vocabularies as enums (:mod:`einfuse.ir.kinds`)."""

from .kinds import (BinaryOp, BufferType, FillSource, Function, LoopKind, Policy, QuasiOp,
                    ReduceOp, UnaryOp)
from .nodes import (AccValue, Accumulate, Affine, Binary, Branch, Buffer, Call, CombineLanes,
                    Compensate, Const, DeclareAcc, Expr, Fold, IndexValue, Kernel, Let, Load,
                    Local, Loop, NormalBranch, Param, Program, Quasi, SLICE_ROWS, Stmt, Store,
                    Subscript, TiledLoop, Unary, walk)

__all__ = ["AccValue", "Accumulate", "Affine", "Binary", "BinaryOp", "Branch", "Buffer",
           "BufferType", "Call", "CombineLanes", "Compensate", "Const", "DeclareAcc", "Expr",
           "FillSource", "Fold", "Function", "IndexValue", "Kernel", "Let", "Load", "Local",
           "Loop", "LoopKind", "NormalBranch", "Param", "Policy", "Program", "Quasi",
           "QuasiOp", "ReduceOp", "SLICE_ROWS", "Stmt", "Store", "Subscript", "TiledLoop",
           "Unary", "UnaryOp", "walk"]
